"""`rlhfkit train sft|rm|dpo|kto|prm|kd` and `rlhfkit lora merge`. A training command is the public API
(rlhfkit.api.supervised): parse and validate the flags, `from_config` (model, data, run folder),
`train`; this module only prints."""

from __future__ import annotations

import time

from rlhfkit.api.supervised import (
    DPOTrainer,
    KDTrainer,
    KTOTrainer,
    PRMTrainer,
    RMTrainer,
    SFTTrainer,
)
from rlhfkit.config.kd import KDConfig
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.prm import PRMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import resolve_model
from rlhfkit.models.lora import merge_lora

COMMANDS = {"sft": (SFTConfig, SFTTrainer), "rm": (RMConfig, RMTrainer),
            "dpo": (DPOConfig, DPOTrainer), "kto": (KTOConfig, KTOTrainer), "prm": (PRMConfig, PRMTrainer),
            "kd": (KDConfig, KDTrainer)}


def run(kind: str, argv: list[str]) -> int:
    config_class, trainer_class = COMMANDS[kind]
    cfg = config_class.from_args(argv)
    t0 = time.perf_counter()
    trainer = trainer_class.from_config(cfg)
    if trainer.skipped:
        print(f"skipped {trainer.skipped} samples longer than --data.max_len "
              f"{cfg.data.max_len} tokens")
    trainer.train()
    shown = " ".join(f"{k}={v:.4g}" for k, v in trainer.final_metrics.items())
    print(f"done in {time.perf_counter() - t0:.0f}s: {trainer.step} steps {shown}; "
          f"model saved to {trainer.run_dir / 'final'}")
    return 0


def run_lora(argv: list[str]) -> int:
    """`rlhfkit lora merge --lora.adapter DIR [--lora.base DIR] --ckpt.output_dir OUT`."""
    if not argv or argv[0] != "merge":
        raise ConfigError("usage: rlhfkit lora merge --lora.adapter ADAPTER_DIR [--lora.base BASE] "
                          "--ckpt.output_dir OUT")
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
