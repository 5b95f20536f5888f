"""`rlhfkit train sft|rm|dpo|kto` and `rlhfkit lora merge`: parse and validate flags before any
model loads, read the data, build the trainer, train, evaluate, save."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import torch

from rlhfkit.config.parse import parse_config, to_dict
from rlhfkit.config.preference import DPOConfig, RMConfig, validate_dpo, validate_rm
from rlhfkit.config.sft import SUPERVISED_ALIASES, SFTConfig, lora_targets, validate_sft
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft, load_unpaired
from rlhfkit.errors import ConfigError
from rlhfkit.models import load_tokenizer
from rlhfkit.models.lora import add_lora, merge_lora
from rlhfkit.models.reward import init_reward_model
from rlhfkit.tracking.plots import plot_curves
from rlhfkit.tracking.run import RunTracker
from rlhfkit.models.precision import DTYPES
from rlhfkit.trainers.build import load_policy, resolve_model
from rlhfkit.trainers.preference import DPOTrainer, KTOTrainer, RMTrainer
from rlhfkit.trainers.supervised import SFTTrainer

CURVES = {
    "sft": ["loss", "eval/loss", "lr"],
    "rm": ["loss", "accuracy", "eval/accuracy", "reward_margin"],
    "dpo": ["loss", "accuracy", "margin", "eval/accuracy"],
    "kto": ["loss", "chosen_reward", "rejected_reward", "kl"],
}
LOADERS = {"sft": load_sft, "rm": load_pairs, "dpo": load_pairs, "kto": load_unpaired}


def parse_args(kind: str, argv: list[str]):
    if kind == "sft":
        return validate_sft(parse_config(SFTConfig, argv, aliases=SUPERVISED_ALIASES))
    if kind == "rm":
        return validate_rm(parse_config(RMConfig, argv, aliases=SUPERVISED_ALIASES))
    return validate_dpo(parse_config(DPOConfig, argv, aliases=SUPERVISED_ALIASES), kind)


def load_data(kind: str, cfg, tokenizer):
    """(train items, eval items, skipped): from --data.dataset, and --data.eval_dataset or a split."""
    d = cfg.data
    fmt = TextFormat(tokenizer, d.apply_chat_template, d.input_template)
    keys = {"sft": dict(input_key=d.input_key, output_key=d.output_key),
            "rm": dict(prompt_key=d.prompt_key, chosen_key=d.chosen_key, rejected_key=d.rejected_key),
            "kto": dict(prompt_key=d.prompt_key or "prompt", output_key=d.output_key or "output",
                        label_key=d.label_key)}[kind if kind != "dpo" else "rm"]
    load = LOADERS[kind]
    items, skipped = load(d.dataset, fmt, max_len=d.max_len, max_samples=d.max_samples, seed=cfg.train.seed, **keys)
    if d.eval_dataset:
        eval_items, _ = load(d.eval_dataset, fmt, max_len=d.max_len, **keys)
    else:
        n_eval = int(len(items) * d.eval_split)
        items, eval_items = items[: len(items) - n_eval], items[len(items) - n_eval :]
    return items, eval_items, skipped


def build_model(kind: str, cfg):
    """(model, tokenizer, reference or None); LoRA adapters when --ds.lora.rank > 0."""
    torch.manual_seed(cfg.train.seed)
    m, lora = cfg.model, cfg.ds.lora
    if kind == "rm":
        path, _ = resolve_model(m.model_name_or_path)
        tokenizer = load_tokenizer(path)
        model = init_reward_model(path, tokenizer.pad_token_id, DTYPES[m.dtype], seed=cfg.train.seed)
    else:
        model, tokenizer = load_policy(m.model_name_or_path, m.dtype)
    ref = None
    if kind in ("dpo", "kto"):
        ref = load_policy(cfg.ref.model_name_or_path, m.dtype)[0] if cfg.ref.model_name_or_path else copy.deepcopy(model)
        ref.eval().requires_grad_(False)
    if lora.rank > 0:
        model = add_lora(model, lora.rank, lora.alpha, lora_targets(lora), lora.dropout,
                         task_type="SEQ_CLS" if kind == "rm" else "CAUSAL_LM")
    return model, tokenizer, ref


def run(kind: str, argv: list[str]) -> int:
    cfg = parse_args(kind, argv)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    run_dir = Path(cfg.ckpt.output_dir)
    t0 = time.perf_counter()
    model, tokenizer, ref = build_model(kind, cfg)
    items, eval_items, skipped = load_data(kind, cfg, tokenizer)
    if skipped:
        print(f"skipped {skipped} samples longer than --data.max_len {cfg.data.max_len} tokens")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    trainer_cls = {"sft": SFTTrainer, "rm": RMTrainer, "dpo": DPOTrainer, "kto": KTOTrainer}[kind]
    extra = {"ref": ref} if ref is not None else {}
    trainer = trainer_cls(cfg, model, tokenizer, items, eval_items, **extra)
    tracker = RunTracker(run_dir, cfg.logger.tensorboard_dir, trainer.loop.total_steps, cfg.logger.progress_bar)
    trainer.loop.tracker = tracker
    trainer.fit()
    final_metrics = trainer.evaluate() if eval_items else {}
    if final_metrics:
        tracker.log(trainer.loop.step, final_metrics)
    if kind == "rm":
        mean, std = trainer.reward_stats(eval_items or items)
        final = trainer.save(run_dir / "final", mean=mean, std=std)
        final_metrics.update({"reward_mean": mean, "reward_std": std})
    else:
        final = trainer.save(run_dir / "final")
    tracker.close()
    _plot(run_dir, CURVES[kind])
    (run_dir / "summary.json").write_text(json.dumps({"steps": trainer.loop.step, **final_metrics}, indent=2))
    shown = " ".join(f"{k}={v:.4g}" for k, v in final_metrics.items())
    print(f"done in {time.perf_counter() - t0:.0f}s: {trainer.loop.step} steps {shown}; model saved to {final}")
    return 0


def _plot(run_dir: Path, keys: list[str]) -> None:
    try:
        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png", keys=keys)
    except ValueError:  # nothing logged under these keys
        pass


def run_lora(argv: list[str]) -> int:
    """`rlhfkit lora merge --lora.adapter DIR [--lora.base DIR] --ckpt.output_dir OUT`."""
    if not argv or argv[0] != "merge":
        raise ConfigError("usage: rlhfkit lora merge --lora.adapter ADAPTER_DIR [--lora.base BASE] --ckpt.output_dir OUT")
    flags = {"lora.adapter": None, "lora.base": None, "ckpt.output_dir": None}
    rest = argv[1:]
    for i in range(0, len(rest), 2):
        name = rest[i].lstrip("-")
        if name not in flags or i + 1 >= len(rest):
            raise ConfigError(f"rlhfkit lora merge: unknown flag or missing value {rest[i]!r}; flags: "
                              + ", ".join(f"--{k}" for k in flags))
        flags[name] = rest[i + 1]
    if not flags["lora.adapter"] or not flags["ckpt.output_dir"]:
        raise ConfigError("rlhfkit lora merge needs --lora.adapter ADAPTER_DIR and --ckpt.output_dir OUT")
    base = resolve_model(flags["lora.base"])[0] if flags["lora.base"] else None
    out = merge_lora(flags["lora.adapter"], base, flags["ckpt.output_dir"])
    print(f"merged {flags['lora.adapter']} into a full model: {out}")
    return 0
