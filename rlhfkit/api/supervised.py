"""The supervised trainers of the public API: SFT, reward model (Bradley-Terry), DPO, KTO and
process reward model.

    cfg = SFTConfig.from_args(["--model.model_name_or_path", "smollm2", "--adam.lr", "1e-5"])
    trainer = SFTTrainer.from_config(cfg, train_dataset=[{"input": "2+3=", "output": "5"}, ...])
    metrics = trainer.train()     # writes the run folder --ckpt.output_dir, as `rlhfkit train sft`
    trainer.save("my-sft-model")  # an HF folder

`from_config` is the one place that maps a supervised config to components: the model (with LoRA
adapters, the frozen reference of DPO / KTO, the score head of a reward model), the tokenized train
and eval data, the run folder and its loggers. The loops are the algorithm classes of
`trainers.supervised` (sft, preference, prm, kd); `rlhfkit train sft|rm|dpo|kto` is `from_args`,
`from_config`, `train`.

The run folder: config.json, metrics.jsonl and TensorBoard events (one row per optimizer step, and
one for the final evaluation; also to wandb with --logger.wandb.project), curves.png, summary.json
(steps and the final metrics), final/ (the model; a reward model carries the mean / std of its
scores in its config), and with --ckpt.save_steps N the checkpoints/ of `train rl`: every N steps
the model, the optimizer and schedule, the RNG states and the position in the data, written
atomically; --ckpt.load_enable resumes from the newest intact one, and the resumed run ends as the
uninterrupted one would (on CPU, bit for bit).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from rlhfkit.api import vision as V
from rlhfkit.api.builder import fit_to_positions
from rlhfkit.api.run_folder import create_run_dir, extra_writers, setup_checkpoints
from rlhfkit.config.kd import KDConfig
from rlhfkit.config.parse import to_dict
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.prm import PRMConfig
from rlhfkit.config.rl import lora_targets
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.records import Source, as_source
from rlhfkit.data.steps import load_steps
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft, load_unpaired
from rlhfkit.errors import ConfigError
from rlhfkit.models import load_tokenizer
from rlhfkit.models.host import apply_host_settings
from rlhfkit.models.loading import load_policy, load_teacher, resolve_model
from rlhfkit.models.lora import add_lora
from rlhfkit.models.precision import (
    DTYPES,
    enable_gradient_checkpointing,
    resolve_device,
)
from rlhfkit.models.reward import init_reward_model
from rlhfkit.models.vision import (
    freeze_visual_encoder,
    is_vision_model,
    language_lora_targets,
)
from rlhfkit.tracking.progress import set_log_level
from rlhfkit.tracking.run import RunTracker
from rlhfkit.trainers.checkpoint import Checkpointer
from rlhfkit.trainers.supervised import kd, preference, prm, sft
from rlhfkit.trainers.supervised.loop import SupervisedState, planned_steps

__all__ = ["SFTConfig", "RMConfig", "DPOConfig", "KTOConfig", "PRMConfig", "KDConfig",
           "SFTTrainer", "RMTrainer", "DPOTrainer", "KTOTrainer", "PRMTrainer", "KDTrainer",
           "build_model", "load_data"]

# One entry per kind: the validation, the dataset reader and the metrics drawn in curves.png.
VALIDATE = {"sft": SFTConfig.check, "rm": RMConfig.check, "dpo": DPOConfig.check, "kto": KTOConfig.check,
            "prm": PRMConfig.check, "kd": KDConfig.check}
LOADERS = {"sft": load_sft, "rm": load_pairs, "dpo": load_pairs, "kto": load_unpaired, "prm": load_steps,
           "kd": load_sft}
CURVES = {
    "sft": ["loss", "eval/loss", "lr"],
    "rm": ["loss", "accuracy", "eval/accuracy", "reward_margin"],
    "dpo": ["loss", "accuracy", "margin", "eval/accuracy"],
    "kto": ["loss", "chosen_reward", "rejected_reward", "kl"],
    "prm": ["loss", "accuracy", "eval/accuracy"],
    "kd": ["loss", "nll", "kl", "eval/kl"],
}


def build_model(kind: str, cfg,
                device: torch.device | None = None) -> tuple[torch.nn.Module, Any, torch.nn.Module | None]:
    """(model, tokenizer, reference or None) on `device` (default: --model.device); LoRA adapters
    when --ds.lora.rank > 0; gradient checkpointing with --model.gradient_checkpointing_enable. A
    vision-language model: `train rm` builds a reward model over images on its base model
    (models/vision_reward.py); --model.freeze_visual_encoder freezes its tower (no adapters there)."""
    device = resolve_device(cfg.model.device, "--model.device") if device is None else device
    torch.manual_seed(cfg.train.seed)
    m, lora = cfg.model, cfg.ds.lora
    if kind == "rm":
        path, _ = resolve_model(m.model_name_or_path)
        tokenizer = load_tokenizer(path)
        model = init_reward_model(path, tokenizer.pad_token_id, DTYPES[m.dtype], seed=cfg.train.seed,
                                  load_in_4bit=cfg.ds.load_in_4bit)
    else:
        model, tokenizer = load_policy(m.model_name_or_path, m.dtype, cfg.ds.load_in_4bit)
    set_chat_template(tokenizer, cfg.data)
    vision = is_vision_model(model)
    if vision and m.freeze_visual_encoder:  # before the reference is copied: it keeps the same tower
        freeze_visual_encoder(model)
    ref = None
    if kind in ("dpo", "kto"):
        ref_path = cfg.ref.model_name_or_path
        ref = load_policy(ref_path, m.dtype)[0] if ref_path else copy.deepcopy(model)
        ref.eval().requires_grad_(False)
    elif kind == "kd":  # the teacher, frozen; with --teacher.offload it waits on the CPU
        ref = load_teacher(cfg.teacher.model_name_or_path, m.dtype, tokenizer)
    if lora.rank > 0:
        targets = lora_targets(lora)
        if vision and (m.freeze_visual_encoder or kind == "rm"):  # named layers: peft matches no custom head
            targets = language_lora_targets(model, targets, tower=not m.freeze_visual_encoder)
        model = add_lora(model, lora.rank, lora.alpha, targets, lora.dropout,
                         task_type="SEQ_CLS" if kind == "rm" else "CAUSAL_LM")
    if m.gradient_checkpointing_enable:
        enable_gradient_checkpointing(model)
    model.to(device)
    if ref is not None and not (kind == "kd" and cfg.teacher.offload):
        ref.to(device)
    return model, tokenizer, ref


def train_source(cfg) -> Source:
    """--data.dataset, as a `Blend` when it names several datasets or --data.dataset_probs is set."""
    d = cfg.data
    return as_source(d.dataset, d.dataset_probs, cfg.train.seed, d.max_samples)


def set_chat_template(tokenizer, data) -> None:
    """--data.tokenizer_chat_template (the text, or a file holding it) as the tokenizer's chat
    template, with --data.apply_chat_template; the saved tokenizer keeps it."""
    template = data.tokenizer_chat_template
    if template is None or not data.apply_chat_template:
        return
    path = Path(template).expanduser()
    if "{" not in template and path.is_file():
        template = path.read_text(encoding="utf-8")
    tokenizer.chat_template = template


def load_data(kind: str, cfg, tokenizer, train_dataset: Source | None = None,
              eval_dataset: Source | None = None, processor=None) -> tuple[list, list, int]:
    """(train items, eval items, skipped). Train: `train_dataset`, else --data.dataset. Eval:
    `eval_dataset`, else --data.eval_dataset, else the last --data.eval_split of the train items.
    `processor`: a vision-language model's (records carry images; api/vision.py)."""
    d = cfg.data
    truncation = getattr(d, "truncation", "skip")  # train sft's
    if processor is not None and truncation in ("left", "right"):
        raise ConfigError(f"--data.truncation {truncation}: samples with images are not cut (their image tokens "
                          "would be); use --data.truncation skip or error")
    source = d.dataset if train_dataset is None else train_dataset
    fmt = (TextFormat(tokenizer, d.apply_chat_template, d.input_template) if processor is None
           else V.supervised_format(cfg, processor, source))
    keys = {"sft": dict(input_key=d.input_key, output_key=d.output_key, reward_template=d.reward_template,
                        reward_key=d.reward_key, pretrain_mode=getattr(cfg.model, "pretrain_mode_enable", False),
                        truncation=truncation),
            "rm": dict(prompt_key=d.prompt_key, chosen_key=d.chosen_key,
                       rejected_key=d.rejected_key),
            "kto": dict(prompt_key=d.prompt_key or "prompt", output_key=d.output_key or "output",
                        label_key=d.label_key),
            "prm": dict(input_key=d.input_key, label_key=d.label_key)}[{"dpo": "rm", "kd": "sft"}.get(kind, kind)]
    if kind == "prm":
        keys.update(placeholder=d.placeholder_token, reward_tokens=d.reward_tokens)
    load = LOADERS[kind]
    source = train_source(cfg) if train_dataset is None else train_dataset
    items, skipped = load(source, fmt, max_len=d.max_len, max_samples=d.max_samples,
                          seed=cfg.train.seed, split=d.dataset_split, config=d.dataset_config,
                          data_dir=d.data_dir, **keys)
    eval_source = as_source(d.eval_dataset or None) if eval_dataset is None else eval_dataset
    if eval_source is not None:
        eval_items, _ = load(eval_source, fmt, max_len=d.max_len, split=d.eval_dataset_split,
                             config=d.eval_dataset_config, data_dir=d.eval_data_dir, **keys)
    else:
        n_eval = int(len(items) * d.eval_split)
        items, eval_items = items[: len(items) - n_eval], items[len(items) - n_eval :]
    return items, eval_items, skipped


class SupervisedTrainer:
    """One supervised run: an algorithm's step loop (`algorithm`), its data and its run folder.

    Build it with `from_config`; `train()` once, then `save(path)` as often as wanted.
    Attributes: `cfg`, `algorithm` (the loop of trainers/), `tracker`, `run_dir`, `train_items`,
    `eval_items`, `skipped` (samples over --data.max_len), `final_metrics` (the final evaluation,
    filled by `train`), `checkpointer` and `resume` ((folder, step) of the checkpoint `train`
    resumes from, or None).
    """

    kind: ClassVar[str]
    config_class: ClassVar[type]
    algorithm_class: ClassVar[type]

    def __init__(self, cfg, algorithm, tracker: RunTracker, train_items: list, eval_items: list,
                 skipped: int = 0, checkpointer: Checkpointer | None = None,
                 resume: tuple[Path, int] | None = None, processor=None):
        self.cfg, self.algorithm, self.tracker = cfg, algorithm, tracker
        self.checkpointer, self.resume = checkpointer, resume
        self.state = SupervisedState(algorithm)
        if checkpointer is not None:
            algorithm.loop.callbacks.append(
                lambda loop, step, metrics: checkpointer.periodic(self.state, step, metrics))
        self.run_dir = Path(cfg.ckpt.output_dir)
        self.train_items, self.eval_items = list(train_items), list(eval_items)
        self.skipped = skipped
        self.final_metrics: dict[str, float] = {}
        self.processor = processor  # a vision-language model's (saved beside its weights), else None

    @classmethod
    def from_config(cls, cfg, train_dataset: Source | None = None,
                    eval_dataset: Source | None = None):
        """Validate `cfg`, create the run folder (config.json; a bad --ckpt.output_dir fails here,
        before the model loads), load the model and data, and make the loggers. A dataset is a path (.jsonl / .json /
        .parquet, a datasets folder), a list of dicts, or a `datasets.Dataset` / `DatasetDict` (its "train" split);
        given ones win over --data.dataset / --data.eval_dataset."""
        if not isinstance(cfg, cls.config_class):
            name = cls.config_class.__name__
            raise ConfigError(f"{cls.__name__}.from_config needs a {name} (e.g. "
                              f"{name}.from_args(flags)), got {type(cfg).__name__}")
        cfg = VALIDATE[cls.kind](cfg)
        set_log_level(cfg.logger.log_level)
        if train_dataset is None and cfg.data.dataset is None:
            raise ConfigError("--data.dataset is required (a .jsonl/.json/.parquet file or a "
                              "datasets folder); from Python, pass train_dataset= to from_config")
        apply_host_settings(cfg.train.num_threads, cfg.train.keep_freed_memory)
        device = resolve_device(cfg.model.device, "--model.device")  # before the run folder and the model
        if train_dataset is None:
            train_source(cfg)  # a bad --data.dataset_probs fails before the model loads
        vision_folder = V.supervised_folder(cls.kind, cfg)  # a VLM: its images are checked before anything is written
        for source, is_eval in ((train_dataset if train_dataset is not None else cfg.data.dataset, False),
                                (eval_dataset if eval_dataset is not None else cfg.data.eval_dataset, True)):
            if vision_folder and source is not None:
                V.check_supervised_data(cls.kind, cfg, source, eval=is_eval)
        run_dir = create_run_dir(Path(cfg.ckpt.output_dir), cfg.logger.tensorboard_dir, to_dict(cfg))
        checkpointer, resume = setup_checkpoints(cfg, run_dir)
        model, tokenizer, ref = build_model(cls.kind, cfg, device)
        cfg = fit_to_positions(cfg, model, "max_len")
        processor = V.processor_of(vision_folder) if vision_folder else None
        items, eval_items, skipped = load_data(cls.kind, cfg, tokenizer, train_dataset,
                                               eval_dataset, processor)
        if cfg.ckpt.keep_best and not eval_items:
            raise ConfigError(f"--ckpt.keep_best {cfg.ckpt.keep_best} judges evaluations: give --data.eval_dataset "
                              "or --data.eval_split")
        steps = planned_steps(len(items), cfg.train)
        tracker = RunTracker(run_dir, cfg.logger.tensorboard_dir, steps, cfg.logger.progress_bar,
                             purge_step=None if resume is None else resume[1] + 1,
                             writers=extra_writers(cfg, run_dir), curve_keys=CURVES[cls.kind],
                             show={"loss": "loss", "acc": "accuracy"})
        extra = {"ref": ref} if ref is not None else {}
        algorithm = cls.algorithm_class(cfg, model, tokenizer, items, eval_items, tracker=tracker,
                                        **extra)
        return cls(cfg, algorithm, tracker, items, eval_items, skipped, checkpointer, resume, processor)

    @property
    def model(self) -> torch.nn.Module:
        return self.algorithm.model

    @property
    def tokenizer(self):
        return self.algorithm.tokenizer

    @property
    def step(self) -> int:
        """Optimizer steps taken."""
        return self.algorithm.loop.step

    def train(self) -> dict[str, float]:
        """Resume (with --ckpt.load_enable and a checkpoint), run every step, evaluate, save
        final/, close the loggers (curves.png) and write summary.json. Returns the last step's
        metrics (none when resumed after the last step) merged with the final evaluation's."""
        if self.resume is not None and self.checkpointer is not None:
            self.checkpointer.load(self.state, self.resume[0])
            print(f"resumed from {self.resume[0]} (step {self.step} of {self.algorithm.loop.total_steps})")
        history = self.algorithm.fit()
        final = self.algorithm.evaluate() if self.eval_items else {}
        if self.checkpointer is not None:
            self.checkpointer.consider_best(self.state, final)
        if final:  # metrics.jsonl, TensorBoard, wandb; not a second console line for the last step
            self.tracker.metrics.log(self.step, final)
        final.update(self._save(self.run_dir / "final")[1])
        self.tracker.close()
        summary = {"steps": self.step, **final}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.final_metrics = final
        return {**(history[-1] if history else {}), **final}

    def save(self, path: str | Path) -> Path:
        """An HF folder at `path` (with LoRA, peft's adapter folder; merge it with `rlhfkit lora
        merge`). Returns the folder."""
        return self._save(path)[0]

    def _save(self, path: str | Path) -> tuple[Path, dict[str, float]]:
        """(the folder, metrics the saving computed for summary.json)."""
        folder = self.algorithm.save(path)
        V.save_processor(self.processor, folder)
        return folder, {}


class SFTTrainer(SupervisedTrainer):
    """Supervised fine-tuning: next-token NLL on the response (every assistant turn)."""

    kind, config_class, algorithm_class = "sft", SFTConfig, sft.SFTLoop


class RMTrainer(SupervisedTrainer):
    """A Bradley-Terry reward model on preference pairs."""

    kind, config_class, algorithm_class = "rm", RMConfig, preference.RMLoop

    def _save(self, path: str | Path) -> tuple[Path, dict[str, float]]:
        """A full sequence-classification folder (LoRA merged; over images, the folder of
        models/vision_reward.py with the processor) whose config holds the mean / std of the scores on
        the eval pairs (the train pairs without any), which RL uses to normalise."""
        mean, std = self.algorithm.reward_stats(self.eval_items or self.train_items)
        stats = {"reward_mean": mean, "reward_std": std}
        folder = self.algorithm.save(path, mean=mean, std=std)
        V.save_processor(self.processor, folder)  # a reward model over images: its processor beside it
        return folder, stats


class DPOTrainer(SupervisedTrainer):
    """DPO / IPO / cDPO on preference pairs against a frozen reference model."""

    kind, config_class, algorithm_class = "dpo", DPOConfig, preference.DPOLoop


class KTOTrainer(SupervisedTrainer):
    """KTO on unpaired desirable / undesirable examples against a frozen reference model.
    Takes a KTOConfig or a DPOConfig (validated as KTO)."""

    kind, config_class, algorithm_class = "kto", DPOConfig, preference.KTOLoop


class PRMTrainer(SupervisedTrainer):
    """A process reward model on step-labelled texts (trainers/supervised/prm.py); final/ is a causal-LM folder
    whose config records its placeholder and reward tokens."""

    kind, config_class, algorithm_class = "prm", PRMConfig, prm.PRMLoop


class KDTrainer(SupervisedTrainer):
    """Knowledge distillation: (1 - kd.coef) * SFT NLL + kd.coef * KL(teacher || student)."""

    kind, config_class, algorithm_class = "kd", KDConfig, kd.KDLoop
