"""Typed configuration of the supervised stages: `rlhfkit train sft` (here) and, built from the
same sections, `train rm`, `train dpo`, `train kto` (config/preference.py).

The dotted flags are OpenRLHF's (`--model.model_name_or_path`, `--data.dataset`,
`--train.micro_batch_size`, `--adam.lr`, `--ds.packing_samples`, `--ds.lora.rank`,
`--ckpt.output_dir`, ...); its older flat names (`--pretrain`, `--dataset`, `--lora_rank`, ...)
are aliases. `SFTConfig.from_args(argv)` parses exactly the flags of `rlhfkit train sft` and validates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

from rlhfkit.config.checks import (
    check_device,
    check_input_template,
    check_keep_best,
    check_micro_batches,
    check_precision,
    check_qlora,
    one_of,
    require,
)
from rlhfkit.config.openrlhf import SFT_ALIASES, SUPERVISED_RULES
from rlhfkit.config.parse import Alias, Positional, parse_config
from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.config.rl import (
    ADAM_RANGES,
    DTYPES,
    LOG_LEVELS,
    LOSS_SCALE_RANGES,
    LR_SCHEDULERS,
    MUON_RANGES,
    OPTIMS,
    SEED_RANGE,
    WANDB_MODES,
    AdamConfig,
    BaseLoggerConfig,
    CkptConfig,
    LoraConfig,
    LossScaleConfig,
    MuonConfig,
)
from rlhfkit.config.trl_rules import Rule, apply_rules
from rlhfkit.config.trl_supervised import SFT_RULES
from rlhfkit.config.verl_sft import verl_sft_values

log = logging.getLogger("rlhfkit")

SFT_LOSS_TYPES = ("nll", "dft")  # --model.loss_type of train sft

@dataclass(frozen=True)
class ModelConfig:
    """The model being trained."""

    model_name_or_path: str = "smollm2"
    """HF folder, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct)."""
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16 (both 16-bit dtypes with float32 master weights in the
    optimizer, as DeepSpeed's bf16 / fp16 modes; float16 scales the loss: --train.loss_scale.*)."""
    autocast: str | None = None
    """Compute dtype of forward passes (torch.autocast on --model.device's type), e.g. bfloat16 or float16
    (with loss scaling); none = parameter dtype."""
    device: str = "auto"
    """Where the model (and the reference of dpo / kto) trains: auto (CUDA when available, else the
    CPU), cpu, cuda or cuda:N."""
    gradient_checkpointing_enable: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (transformers' non-reentrant gradient checkpointing): the same gradients, less activation memory."""
    aux_loss_coef: float = 0.0
    """Mixture-of-experts models: add this times the routers' load-balancing loss (Switch / Mixtral's,
    transformers' aux_loss) to each micro-batch's loss; the experts' load is logged (moe/*) either way."""
    freeze_visual_encoder: bool = False
    """A vision-language model (train sft|rm|dpo|kto): its vision tower gets no gradients (it stays bit for
    bit as loaded; the projector and the language model train); with LoRA the tower holds no adapters.
    `train rl`'s --actor.freeze_visual_encoder. Text models: ignored."""


@dataclass(frozen=True)
class SFTModelConfig(ModelConfig):
    """The model being trained, and what SFT trains it on."""

    pretrain_mode_enable: bool = False
    """Continued pretraining: train on every token of the --data.input_key text (no template, no
    EOS added, --data.output_key not read; texts longer than --data.max_len are cut to it)."""
    loss_type: str = "nll"
    """nll: the target tokens' negative log-likelihood; dft: Dynamic Fine-Tuning, each token's NLL weighted
    by its probability under the model, not differentiated through (Wu et al. 2025, arXiv:2508.05629; TRL's
    loss_type='dft'). The eval loss is the NLL either way."""


@dataclass(frozen=True)
class SupervisedDataConfig:
    """Training and evaluation data and their record keys."""

    dataset: str | None = None
    """Training data: .jsonl / .json / .parquet / .csv / .arrow, a datasets folder or a hub dataset name (org/name;
    org/name@dir for a data dir); several, comma-separated, are read as one (concatenated, or mixed by
    --data.dataset_probs); required unless the API is given a train_dataset."""
    dataset_probs: str | None = None
    """Mix the comma-separated datasets of --data.dataset with these comma-separated probabilities
    (each > 0, summing to 1): each next record comes from a dataset drawn with them, a dataset that runs out
    starts again, until every one was read to its end (OpenRLHF's blending, datasets'
    interleave_datasets with all_exhausted, seeded by --train.seed); none = concatenate them."""
    dataset_split: str = "train"
    """The split of a training dataset that has several (a hub dataset, a DatasetDict folder)."""
    dataset_config: str | None = None
    """The hub dataset's config (datasets.load_dataset's name)."""
    data_dir: str | None = None
    """The hub dataset's subfolder to read (datasets.load_dataset's data_dir)."""
    eval_dataset: str | None = None
    """Held-out data for the eval loss, read like --data.dataset; none = split off --data.eval_split
    of the training data."""
    eval_dataset_split: str = "train"
    """The split of an eval dataset that has several (e.g. test of a hub dataset)."""
    eval_dataset_config: str | None = None
    """The hub eval dataset's config (datasets.load_dataset's name)."""
    eval_data_dir: str | None = None
    """The hub eval dataset's subfolder to read (datasets.load_dataset's data_dir)."""
    eval_split: float = 0.0
    """Fraction of the training records held out for evaluation when there is no eval_dataset."""
    input_key: str = "input"
    """SFT: the prompt (a string) or a whole conversation (a message list, with apply_chat_template)."""
    output_key: str | None = "output"
    """SFT / KTO: the response string (KTO: TRL's `completion` when no record has the default `output`)."""
    prompt_key: str | None = "prompt"
    """Preference data: the prompt; none when chosen/rejected are whole conversations, or whole texts whose
    common beginning is the prompt (TRL's implicit prompt, e.g. Anthropic/hh-rlhf)."""
    chosen_key: str = "chosen"
    """Preference data: the preferred response (or whole conversation)."""
    rejected_key: str = "rejected"
    """Preference data: the dispreferred response (or whole conversation)."""
    label_key: str = "label"
    """KTO: true = desirable, false = undesirable."""
    apply_chat_template: bool = False
    """Render prompts and conversations with the tokenizer's chat template."""
    tokenizer_chat_template: str | None = None
    """With --data.apply_chat_template: this Jinja chat template (the text, or a file holding it)
    replaces the tokenizer's, for the data and in the saved tokenizer."""
    input_template: str | None = None
    """A format string with one {} around the prompt (without a chat template)."""
    reward_template: str | None = None
    """Conditional SFT (train sft): a template with {input} and {reward}; each prompt becomes the
    template with the record's --data.reward_key value (two decimals) and its input, e.g.
    "{input} <rm_score>: {reward} " (OpenRLHF's default). At inference ask for the top score."""
    reward_key: str = "reward"
    """Conditional SFT: the record key holding the score rendered by --data.reward_template."""
    max_len: int = 2048
    """Samples longer than this many tokens (prompt + response) are skipped and counted. Lowered (said in
    one line) to fit a model with learned absolute positions (GPT-2, OPT)."""
    max_samples: int | None = None
    """Use at most this many training records (none: all)."""
    image_key: str | None = None
    """A vision-language model: the record key of its images (paths, URLs, bytes or a datasets Image
    feature; one or a list; docs/vision.md); none = `images`, else `image`, where the record has one."""
    max_images_per_prompt: int = 1
    """A vision-language model: most images one record may hold; more are refused before the model loads."""


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
    optim: str = "adam"
    """Optimizer: adam (AdamW for every parameter) or muon (Muon for the hidden weight matrices, AdamW with
    the --adam.* settings for embeddings, LM head, norms and biases; --muon.*). Clipping runs first."""
    lr_scheduler: str = "cosine_with_min_lr"
    """Learning-rate schedule after warmup: constant, linear (to 0), cosine (to 0) or cosine_with_min_lr."""
    lr_warmup_ratio: float = 0.03
    """Fraction of the optimizer steps spent in linear warmup (read when --train.lr_warmup_steps is -1)."""
    lr_warmup_steps: int = -1
    """Linear warmup over this many optimizer steps; 0 = no warmup; -1 = --train.lr_warmup_ratio of all
    optimizer steps. Longer than the run: the lr rises until the last step."""
    min_lr_ratio: float = 0.1
    """cosine_with_min_lr decays to lr * min_lr_ratio."""
    max_norm: float = 1.0
    """Gradient-norm clipping (0 disables)."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    eval_steps: int = -1
    """Evaluate every N optimizer steps (-1: only at the end)."""
    seed: int = 42
    """Seed of the run's random draws (data order, the eval split, new weights such as LoRA or a
    score head)."""
    num_threads: int | None = None
    """torch intra-op threads; none = all cores."""
    keep_freed_memory: bool = True
    """Keep the memory torch frees for the next steps' tensors instead of handing it back to the OS
    (glibc's malloc: large blocks from the heap, no trimming), so the tensors made every step (weight
    casts, gradients, the rollout's bf16 weight copy) reuse mapped pages instead of faulting in new
    ones; the process then holds its peak memory until it exits. Linux (glibc) only."""


@dataclass(frozen=True)
class DSConfig:
    """Memory and layout: sample packing, LoRA (OpenRLHF's DeepSpeed section)."""

    packing_samples: bool = False
    """Pack each micro-batch into one row (no padding; attention stays inside each sample)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    load_in_4bit: bool = False
    """QLoRA (Dettmers et al. 2023, arXiv:2305.14314): the base model's linear layers load as 4-bit NF4
    weights (bitsandbytes, double quantization, computing in the model's dtype; `pip install
    'rlhfkit[qlora]'`), with --ds.lora.rank > 0: only the adapters train. The LM head and the
    embeddings stay in the model's dtype."""


@dataclass(frozen=True)
class SupervisedCkptConfig(CkptConfig):
    """The run folder and checkpoints (as `train rl`'s)."""

    output_dir: str = "runs/sft"
    """Run folder: metrics.jsonl, TensorBoard events, config.json, checkpoints/ and the final model
    (final/)."""


@dataclass(frozen=True)
class SFTDataConfig(SupervisedDataConfig):
    """Training and evaluation data and their record keys, and what an over-long SFT sample gets."""

    truncation: str = "skip"
    """A sample over --data.max_len tokens: skip (counted and logged), error (stop, naming the record), or cut
    to fit as verl's SFT data.truncation cuts: the whole tokenized sample, chat template and prompt included;
    left keeps its end, right its start (the answer's end is lost). Its targets go with its tokens; a sample
    left with none is skipped and counted. Prompt and response samples only (not with images)."""


@dataclass(frozen=True)
class SupervisedConfig:
    """The sections every supervised command shares (`train sft|rm|dpo|kto|prm|kd`); a command's
    config adds its own sections, changes a default, and names its aliases and checks."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: SupervisedDataConfig = field(default_factory=SupervisedDataConfig)
    train: SupervisedTrainConfig = field(default_factory=SupervisedTrainConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=5e-6))
    muon: MuonConfig = field(default_factory=MuonConfig)
    ds: DSConfig = field(default_factory=DSConfig)
    ckpt: SupervisedCkptConfig = field(default_factory=SupervisedCkptConfig)
    logger: BaseLoggerConfig = field(default_factory=BaseLoggerConfig)

    ALIASES: ClassVar[dict[str, str | Alias]] = {}
    """The command's OpenRLHF flags (config/openrlhf.py), besides OWN_ALIASES."""
    OVERRIDES: ClassVar[Positional | None] = None
    """Another tool's `key=value` overrides the command reads (verl's for train sft: config/verl_sft.py)."""
    TRL_RULES: ClassVar[dict[str, Rule] | None] = None
    """The rules reading TRL's config of the same trainer (config/trl_supervised.py), for `from_trl`."""
    TRL_NAME: ClassVar[str] = ""
    """The name of TRL's config class, where it is not this class's (`RewardConfig` for RMConfig)."""
    TRL_ARGV: ClassVar[tuple[str, ...]] = ()
    """Flags `from_trl` puts first: what TRL's trainer does whatever its config says."""

    @staticmethod
    def check(cfg):
        """The command's checks: `cfg`, or a ConfigError naming the flag."""
        raise NotImplementedError

    @classmethod
    def from_args(cls, argv: list[str]):
        """The validated config of the command's flags (dotted flags, OpenRLHF's flat aliases,
        `--config FILE.yaml`); ConfigError on an unknown flag or a bad value."""
        return cls.check(parse_config(cls, list(argv), aliases={**cls.ALIASES, **OWN_ALIASES},
                                      positional=cls.OVERRIDES))

    @classmethod
    def from_trl(cls, trl_config: object, argv: list[str] | tuple[str, ...] = ()):
        """The config of TRL's matching config dataclass (`trl.SFTConfig` for SFTConfig, `trl.DPOConfig`,
        `trl.KTOConfig` for DPOConfig, KTOConfig, `trl.RewardConfig` for RMConfig: every field read,
        config/trl_supervised.py), then our own `argv` flags on top, validated."""
        require(cls.TRL_RULES is not None, f"{cls.__name__}.from_trl: only SFTConfig, DPOConfig, KTOConfig and "
                "RMConfig read a TRL config")
        rules = apply_rules(trl_config, cls.TRL_RULES, cls.TRL_NAME or cls.__name__)
        return cls.from_args([*cls.TRL_ARGV, *rules, *argv])


@dataclass(frozen=True)
class SFTConfig(SupervisedConfig):
    """`rlhfkit train sft`: supervised fine-tuning on prompts and responses or whole conversations. verl's SFT
    overrides (`data.train_files=... optim.lr=1e-4`) are read too; these flags win over them (docs/migration.md)."""

    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    ALIASES: ClassVar[dict[str, str | Alias]] = SFT_ALIASES
    OVERRIDES: ClassVar[Positional | None] = staticmethod(verl_sft_values)
    TRL_RULES: ClassVar[dict[str, Rule] | None] = SFT_RULES

    @staticmethod
    def check(cfg: SFTConfig) -> SFTConfig:
        return validate_sft(cfg)


# OpenRLHF's flags (flat and dotted names: mapped, noticed or refused; see config/openrlhf.py):
# SFT_ALIASES are train_sft's, SUPERVISED_ALIASES those of all of train_sft|rm|dpo|kto.
SUPERVISED_ALIASES: dict[str, Alias] = SUPERVISED_RULES
# Short names of our own flags, shared by train sft|rm|dpo|kto (RL_ALIASES has train rl's).
OWN_ALIASES: dict[str, str | Alias] = {"device": "model.device",
                                       "freeze_visual_encoder": Alias("mapped", 0, to="model.freeze_visual_encoder")}


# The allowed range of every numeric flag shared by `train sft|rm|dpo|kto` (see config/ranges.py).
SUPERVISED_RANGES = validate_table({
    "data.eval_split": "[0, 1)", "data.max_len": ">= 1", "data.max_samples": ">= 1",
    "data.max_images_per_prompt": ">= 1",
    "train.batch_size": ">= 1", "train.micro_batch_size": ">= 1", "train.max_epochs": ">= 1", "train.max_steps": ">= 1",
    "train.lr_warmup_ratio": "[0, 1]", "train.lr_warmup_steps": ">= -1", "train.min_lr_ratio": "[0, 1]",
    "train.max_norm": ">= 0",
    "train.eval_steps": "-1 or >= 1", "train.seed": SEED_RANGE, "train.num_threads": ">= 1",
    "model.aux_loss_coef": ">= 0",
    "ckpt.save_steps": "-1 or >= 1", "ckpt.max_num": ">= 1",
    **{f"adam.{k}": v for k, v in ADAM_RANGES.items()},
    **{f"muon.{k}": v for k, v in MUON_RANGES.items()},
    **{f"train.loss_scale.{k}": v for k, v in LOSS_SCALE_RANGES.items()},
    "ds.lora.rank": ">= 0", "ds.lora.alpha": "> 0", "ds.lora.dropout": "[0, 1)",
})


def refuse_reward_template(cfg, command: str) -> None:
    """Conditional SFT's score template is read by `train sft` only."""
    require(cfg.data.reward_template is None,
            f"--data.reward_template is conditional SFT's (train sft); {command} does not read it: drop it")


def validate_common(cfg, ranges=SUPERVISED_RANGES) -> None:
    """Checks every supervised config passes (sections model, data, train, adam, ds; `ranges`: the
    numeric ranges of its flags). The training data is checked where it is read (`api.supervised`):
    it may come from memory."""
    check_ranges(cfg, ranges)
    t = cfg.train
    one_of("model.dtype", cfg.model.dtype, DTYPES)
    require(cfg.model.autocast in (None, *DTYPES), f"--model.autocast must be one of {', '.join(DTYPES)} or none")
    check_precision("model", cfg.model.dtype, cfg.model.autocast)
    check_device("--model.device", cfg.model.device)
    one_of("logger.log_level", cfg.logger.log_level, LOG_LEVELS)
    one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
    one_of("train.lr_scheduler", t.lr_scheduler, LR_SCHEDULERS)
    one_of("train.optim", t.optim, OPTIMS)
    check_micro_batches("train", t.batch_size, t.micro_batch_size)
    check_input_template(cfg.data.input_template)
    check_keep_best(cfg.ckpt.keep_best)
    check_qlora(cfg.ds)
    if cfg.data.tokenizer_chat_template is not None and not cfg.data.apply_chat_template:
        log.warning("--data.tokenizer_chat_template is ignored without --data.apply_chat_template (as in OpenRLHF)")


SFT_TRUNCATIONS = ("skip", "error", "left", "right")  # --data.truncation of train sft (data/supervised.py)


def validate_sft(cfg: SFTConfig) -> SFTConfig:
    validate_common(cfg)
    one_of("data.truncation", cfg.data.truncation, SFT_TRUNCATIONS)
    require(cfg.data.truncation in ("skip", "error") or not cfg.model.pretrain_mode_enable,
            f"--data.truncation {cfg.data.truncation}: --model.pretrain_mode_enable cuts each text to --data.max_len "
            "(keeping its start) already; drop --data.truncation")
    one_of("model.loss_type", cfg.model.loss_type, SFT_LOSS_TYPES)
    require(not (cfg.model.pretrain_mode_enable and cfg.data.reward_template),
            "--model.pretrain_mode_enable trains on raw texts; --data.reward_template (conditional SFT) needs "
            "prompts and responses: drop one")
    template = cfg.data.reward_template
    require(template is None or ("{input}" in template and "{reward}" in template),
            f"--data.reward_template {template!r} needs both {{input}} and {{reward}}")
    return cfg
