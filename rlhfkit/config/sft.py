"""Typed configuration of the supervised stages: `rlhfkit train sft` (here) and, built from the
same sections, `train rm`, `train dpo`, `train kto` (config/preference.py).

The dotted flags are OpenRLHF's (`--model.model_name_or_path`, `--data.dataset`,
`--train.micro_batch_size`, `--adam.lr`, `--ds.packing_samples`, `--ds.lora.rank`,
`--ckpt.output_dir`, ...); its older flat names (`--pretrain`, `--dataset`, `--lora_rank`, ...)
are aliases. `SFTConfig.from_args(argv)` parses exactly the flags of `rlhfkit train sft` and validates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.parse import parse_config
from rlhfkit.config.rl import DTYPES, LOG_LEVELS, LR_SCHEDULERS, AdamConfig
from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    """The model being trained."""

    model_name_or_path: str = "smollm2"
    """HF folder, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct)."""
    dtype: str = "float32"
    """Parameter dtype: float32 or bfloat16."""
    autocast: str | None = None
    """Compute dtype of forward passes (torch.autocast), e.g. bfloat16; none = parameter dtype."""


@dataclass(frozen=True)
class SupervisedDataConfig:
    """Training and evaluation data and their record keys."""

    dataset: str | None = None
    """Training data: .jsonl / .json / .parquet or a datasets folder (required unless the API is
    given a train_dataset)."""
    eval_dataset: str | None = None
    """Held-out data for the eval loss; none = split off --data.eval_split of the training data."""
    eval_split: float = 0.0
    """Fraction of the training records held out for evaluation when there is no eval_dataset."""
    input_key: str = "input"
    """SFT: the prompt (a string) or a whole conversation (a message list, with apply_chat_template)."""
    output_key: str | None = "output"
    """SFT / KTO: the response string."""
    prompt_key: str | None = "prompt"
    """Preference data: the prompt; none when chosen/rejected are whole conversations."""
    chosen_key: str = "chosen"
    """Preference data: the preferred response (or whole conversation)."""
    rejected_key: str = "rejected"
    """Preference data: the dispreferred response (or whole conversation)."""
    label_key: str = "label"
    """KTO: true = desirable, false = undesirable."""
    apply_chat_template: bool = False
    """Render prompts and conversations with the tokenizer's chat template."""
    input_template: str | None = None
    """A format string with one {} around the prompt (without a chat template)."""
    max_len: int = 2048
    """Samples longer than this many tokens (prompt + response) are skipped and counted."""
    max_samples: int | None = None
    """Use at most this many training records (none: all)."""


@dataclass(frozen=True)
class SupervisedTrainConfig:
    """The optimization: batch sizes, epochs, steps, schedule."""

    batch_size: int = 32
    """Samples (pairs for rm/dpo) per optimizer step."""
    micro_batch_size: int = 8
    """Samples per forward/backward; gradients accumulate to batch_size."""
    max_epochs: int = 1
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    lr_scheduler: str = "cosine_with_min_lr"
    """Learning-rate schedule after warmup: constant, cosine (to 0) or cosine_with_min_lr."""
    lr_warmup_ratio: float = 0.03
    """Fraction of the optimizer steps spent in linear warmup."""
    min_lr_ratio: float = 0.1
    """cosine_with_min_lr decays to lr * min_lr_ratio."""
    max_norm: float = 1.0
    """Gradient-norm clipping (0 disables)."""
    eval_steps: int = -1
    """Evaluate every N optimizer steps (-1: only at the end)."""
    seed: int = 42
    """Seed of the run's random draws (data order, the eval split, new weights such as LoRA or a
    score head)."""
    num_threads: int | None = None
    """torch intra-op threads; none = all cores."""


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (peft) instead of full fine-tuning."""

    rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    alpha: int = 16
    """LoRA scaling: the update is scaled by alpha / rank."""
    target_modules: str = "all-linear"
    """Comma-separated module names (q_proj,v_proj) or all-linear."""
    dropout: float = 0.0
    """Dropout on the LoRA branch's input."""


@dataclass(frozen=True)
class DSConfig:
    """Memory and layout: sample packing, LoRA (OpenRLHF's DeepSpeed section)."""

    packing_samples: bool = False
    """Pack each micro-batch into one row (no padding; attention stays inside each sample)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass(frozen=True)
class SupervisedCkptConfig:
    """The run folder."""

    output_dir: str = "runs/sft"
    """Run folder: metrics.jsonl, TensorBoard events, config.json and the final model (final/)."""


@dataclass(frozen=True)
class SupervisedLoggerConfig:
    """Console and TensorBoard logs."""

    tensorboard_dir: str | None = None
    """TensorBoard log dir (default: <output_dir>/tensorboard)."""
    progress_bar: bool = True
    """Per-step console output: a progress bar on a terminal, one plain line per step otherwise
    (nohup, pipes, batch jobs); false = neither."""
    log_level: str = "info"
    """Print the `rlhfkit` logger's messages from this level up (notes: info; problems: warning)."""


@dataclass(frozen=True)
class SFTConfig:
    """`rlhfkit train sft`: supervised fine-tuning on prompts and responses or whole conversations."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: SupervisedDataConfig = field(default_factory=SupervisedDataConfig)
    train: SupervisedTrainConfig = field(default_factory=SupervisedTrainConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=5e-6))
    ds: DSConfig = field(default_factory=DSConfig)
    ckpt: SupervisedCkptConfig = field(default_factory=SupervisedCkptConfig)
    logger: SupervisedLoggerConfig = field(default_factory=SupervisedLoggerConfig)

    @classmethod
    def from_args(cls, argv: list[str]) -> SFTConfig:
        """The validated config of `rlhfkit train sft ARGV` (dotted flags, OpenRLHF's flat aliases,
        `--config FILE.yaml`); ConfigError on an unknown flag or a bad value."""
        return validate_sft(parse_config(cls, argv, aliases=SUPERVISED_ALIASES))


# OpenRLHF's flat names, accepted as aliases of ours (shared by sft/rm/dpo/kto).
SUPERVISED_ALIASES = {
    "pretrain": "model.model_name_or_path",
    "dataset": "data.dataset",
    "eval_dataset": "data.eval_dataset",
    "input_key": "data.input_key",
    "output_key": "data.output_key",
    "prompt_key": "data.prompt_key",
    "chosen_key": "data.chosen_key",
    "rejected_key": "data.rejected_key",
    "label_key": "data.label_key",
    "apply_chat_template": "data.apply_chat_template",
    "input_template": "data.input_template",
    "max_len": "data.max_len",
    "max_samples": "data.max_samples",
    "train_batch_size": "train.batch_size",
    "micro_train_batch_size": "train.micro_batch_size",
    "max_epochs": "train.max_epochs",
    "lr_warmup_ratio": "train.lr_warmup_ratio",
    "eval_steps": "train.eval_steps",
    "seed": "train.seed",
    "learning_rate": "adam.lr",
    "packing_samples": "ds.packing_samples",
    "lora_rank": "ds.lora.rank",
    "lora_alpha": "ds.lora.alpha",
    "target_modules": "ds.lora.target_modules",
    "lora_dropout": "ds.lora.dropout",
    "save_path": "ckpt.output_dir",
    "ref_pretrain": "ref.model_name_or_path",
    "beta": "model.beta",
    "ipo": "model.ipo_enable",
    "label_smoothing": "model.label_smoothing",
}


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_common(cfg) -> None:
    """Checks every supervised config passes (sections model, data, train, adam, ds). The
    training data is checked where it is read (`api.supervised`): it may come from memory."""
    t, d, lora = cfg.train, cfg.data, cfg.ds.lora
    require(cfg.model.dtype in DTYPES, f"--model.dtype: unknown value {cfg.model.dtype!r}; valid: {', '.join(DTYPES)}")
    require(cfg.model.autocast in (None, *DTYPES), f"--model.autocast must be one of {', '.join(DTYPES)} or none")
    require(cfg.logger.log_level in LOG_LEVELS, f"--logger.log_level: unknown value "
            f"{cfg.logger.log_level!r}; valid: {', '.join(LOG_LEVELS)}")
    require(t.lr_scheduler in LR_SCHEDULERS,
            f"--train.lr_scheduler: unknown value {t.lr_scheduler!r}; valid: {', '.join(LR_SCHEDULERS)}")
    for name, v in [("train.batch_size", t.batch_size), ("train.micro_batch_size", t.micro_batch_size),
                    ("train.max_epochs", t.max_epochs), ("data.max_len", d.max_len)]:
        require(v >= 1, f"--{name} must be >= 1 (got {v})")
    require(t.batch_size % t.micro_batch_size == 0,
            f"--train.batch_size ({t.batch_size}) must be a multiple of --train.micro_batch_size ({t.micro_batch_size})")
    require(t.max_steps is None or t.max_steps >= 1, f"--train.max_steps must be >= 1 (got {t.max_steps})")
    require(0 <= t.lr_warmup_ratio < 1, f"--train.lr_warmup_ratio must be in [0, 1) (got {t.lr_warmup_ratio})")
    require(0 <= d.eval_split < 1, f"--data.eval_split must be in [0, 1) (got {d.eval_split})")
    require(lora.rank >= 0, f"--ds.lora.rank must be >= 0 (got {lora.rank})")
    require(0 <= lora.dropout < 1, f"--ds.lora.dropout must be in [0, 1) (got {lora.dropout})")
    require(cfg.adam.lr > 0, f"--adam.lr must be > 0 (got {cfg.adam.lr})")


def validate_sft(cfg: SFTConfig) -> SFTConfig:
    validate_common(cfg)
    return cfg


def lora_targets(lora: LoraConfig) -> tuple[str, ...] | str:
    """'all-linear' stays a string; 'q_proj,v_proj' becomes a tuple of names."""
    if lora.target_modules.strip() == "all-linear":
        return "all-linear"
    return tuple(m.strip() for m in lora.target_modules.split(",") if m.strip())
