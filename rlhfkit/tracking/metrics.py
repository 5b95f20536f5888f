"""Per-step scalar metrics: a jsonl file, TensorBoard event files, and a Tracker over both.

`metrics.jsonl` holds one JSON object per logged step, `{"step": 3, "reward": 0.5, ...}`,
written and flushed line by line so a crashed run keeps every finished step. Values are
plain floats (0-dim tensors and numpy scalars are converted); NaN and inf are written as
`null` so the file stays strict JSON (a NaN loss shows as a gap, not a parse error).

This package imports nothing from rlhfkit, so its errors are ValueError / TypeError.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def to_float(value: Any, key: str = "value") -> float:
    """A Python float from a number, a one-element tensor / array, or a numpy scalar.

    Raises TypeError naming `key` for anything else (strings, lists, multi-element tensors).
    """
    if isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
        return float(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    count = numel() if callable(numel) else numel
    if count == 1 and hasattr(value, "item"):
        return float(value.item())
    raise TypeError(
        f"metric {key!r} is a {type(value).__name__}, not a number; log a float or a "
        "one-element tensor (reduce it with .mean() first)"
    )


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Every value of `metrics` as a float (see `to_float`); keys must be strings."""
    out = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be strings, got {key!r}")
        out[key] = to_float(value, key)
    return out


def drop_steps_after(path: str | Path, step: int) -> int:
    """Rewrite a step-indexed jsonl file keeping only the lines with "step" <= `step` (for a resumed
    run); a torn last line (a crash mid-write) is dropped too. Returns how many lines were dropped.

    The new file is written beside the old one and renamed over it, so a crash here loses nothing.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            keep = int(row["step"]) <= step
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(path)
    return dropped


class MetricsWriter:
    """Append one JSON line per step to `run_dir/metrics.jsonl` (created with its folder)."""

    def __init__(self, run_dir: str | Path, filename: str = METRICS_FILE) -> None:
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write {"step": step, **metrics} as one line and flush it."""
        if "step" in metrics:
            raise ValueError("metric name 'step' is reserved for the step number; rename it")
        row: dict[str, Any] = {"step": int(step)}
        for key, value in scalar_metrics(metrics).items():
            row[key] = value if math.isfinite(value) else None
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class TensorBoardWriter:
    """Write each metric as a TensorBoard scalar (tag = metric name) at the given step."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None) -> None:
        """`purge_step`: hide events at steps >= it written by an earlier (crashed) run."""
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Add one scalar per metric at `step` and flush the event file."""
        for key, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._writer.close()
            self._closed = True

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Tracker:
    """Fan each step's metrics out to `run_dir/metrics.jsonl` and, optionally, TensorBoard.

    Args:
      run_dir: the run folder; metrics go to `run_dir/metrics.jsonl`.
      tensorboard: write TensorBoard event files too.
      tensorboard_dir: where they go (default `run_dir/tensorboard`; view them with
        `tensorboard --logdir <dir>`).
      purge_step: a resumed run's first new step: TensorBoard hides older events from that step on.
      writers: more writers (objects with `log(step, metrics)` and `close()`, e.g. a WandbWriter).
    """

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = True,
        tensorboard_dir: str | Path | None = None,
        purge_step: int | None = None,
        writers: tuple[Any, ...] = (),
    ) -> None:
        self.run_dir = Path(run_dir)
        self.writers = tuple(writers)
        self.metrics = MetricsWriter(self.run_dir)
        self.tensorboard: TensorBoardWriter | None = None
        if tensorboard:
            log_dir = self.run_dir / TENSORBOARD_DIR if tensorboard_dir is None else tensorboard_dir
            self.tensorboard = TensorBoardWriter(log_dir, purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the metrics of one step; values are converted to floats once (see `to_float`)."""
        values = scalar_metrics(metrics)
        self.metrics.log(step, values)
        if self.tensorboard is not None:
            self.tensorboard.log(step, values)
        for writer in self.writers:
            writer.log(step, values)

    def close(self) -> None:
        self.metrics.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        for writer in self.writers:
            writer.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
