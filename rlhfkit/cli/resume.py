"""Checkpoint set-up of a run folder: where checkpoints go, whether and from where to resume.

On resume the step-indexed logs (metrics.jsonl, samples.jsonl, TensorBoard) are cut back to the
checkpoint's step, so the steps that are trained again are not logged twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlhfkit.config import RLConfig
from rlhfkit.errors import ConfigError
from rlhfkit.tracking.metrics import drop_steps_after
from rlhfkit.trainers.checkpoint import Checkpointer, latest_good, list_checkpoints

log = logging.getLogger("rlhfkit")
STEP_LOGS = ("metrics.jsonl", "samples.jsonl")


def setup_checkpoints(cfg: RLConfig, run_dir: Path) -> tuple[Checkpointer, tuple[Path, int] | None]:
    """The run's Checkpointer and (folder, step) of the checkpoint to resume from (None: start fresh)."""
    root = run_dir / "checkpoints"
    ckpt = Checkpointer(root, cfg.ckpt.save_steps, cfg.ckpt.max_num)
    if not cfg.ckpt.load_enable:
        if cfg.ckpt.save_steps > 0 and list_checkpoints(root):
            raise ConfigError(
                f"{root} already holds checkpoints of an earlier run; pass --ckpt.load_enable true to resume "
                "it, or choose another --ckpt.output_dir"
            )
        return ckpt, None
    resume = latest_good(root)
    if resume is None:
        log.warning("--ckpt.load_enable: no checkpoint in %s yet; starting from scratch", root)
        return ckpt, None
    for name in STEP_LOGS:
        dropped = drop_steps_after(run_dir / name, resume[1])
        if dropped:
            log.warning("%s: dropped %d lines logged after step %d (they are trained again)", name, dropped, resume[1])
    return ckpt, resume
