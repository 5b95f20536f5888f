"""Weights & Biases logging: each step's scalars as one `run.log(..., step=step)`.

`mode="offline"` needs no network and no account: the run is written under
`<dir>/wandb/offline-run-*` and can be uploaded later with `wandb sync <that folder>`.
wandb reads the `WANDB_MODE` environment variable in its own background process, so offline mode
also sets `WANDB_MODE=offline` in this process's environment (the one side effect here; nothing
in rlhfkit reads it). `mode="disabled"` logs nothing.

Imports nothing from rlhfkit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlhfkit.tracking.metrics import scalar_metrics

MODES = ("online", "offline", "disabled")


class WandbWriter:
    """A wandb run. `config` (a plain dict, e.g. the run's settings) is stored with it."""

    def __init__(self, project: str, run_dir: str | Path, name: str | None = None, mode: str = "online",
                 group: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb mode {mode!r} is unknown; valid: {', '.join(MODES)}")
        import wandb

        if mode == "offline":
            os.environ["WANDB_MODE"] = "offline"
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name or run_dir.name, group=group, mode=mode,
                              dir=str(run_dir), config=dict(config or {}), reinit="finish_previous")
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalar_metrics(metrics), step=int(step))

    def close(self) -> None:
        if not self._closed:
            self.run.finish()
            self._closed = True
