"""The run folder's loggers behind one object: metrics.jsonl, TensorBoard (and wandb), the
progress bar on a terminal or a plain line per step elsewhere, samples.jsonl, and the curves drawn
at the end."""

from __future__ import annotations

from pathlib import Path

from rlhfkit.tracking.metrics import Tracker
from rlhfkit.tracking.plots import plot_curves, plot_panels
from rlhfkit.tracking.progress import ProgressBar
from rlhfkit.tracking.samples import CompletionLogger

RL_CURVE_KEYS = ["reward", "score", "eval/accuracy", "eval/pass@1", "kl", "entropy", "response_length"]


class RunTracker:
    """Fans trainer metrics out to metrics.jsonl, TensorBoard, the console and samples.jsonl.
    `progress`: per-step console output (a bar on a terminal, else a line per step; see ProgressBar);
    `show`: label -> metric shown on the console (default reward and kl); `curve_keys`: the metrics
    drawn in curves.png at `close`; `panels`: also one PNG per metric group."""

    def __init__(self, run_dir: Path, tensorboard_dir: str | None, total_steps: int, progress: bool,
                 purge_step: int | None = None, writers: tuple = (), curve_keys: list[str] | None = None,
                 panels: bool = True, show: dict[str, str] | None = None):
        self.run_dir = Path(run_dir)
        self.metrics = Tracker(self.run_dir, tensorboard_dir=tensorboard_dir or str(self.run_dir / "tensorboard"),
                               purge_step=purge_step, writers=writers)
        self.samples = CompletionLogger(self.run_dir)
        self.bar = ProgressBar(total_steps, show=show, initial=purge_step - 1 if purge_step else 0,
                               enabled=progress)
        self.curve_keys = RL_CURVE_KEYS if curve_keys is None else curve_keys
        self.panels = panels

    def log(self, step: int, metrics: dict) -> None:
        self.metrics.log(step, metrics)
        self.bar.update(step, metrics)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self.samples.log(step, rows)

    def close(self) -> None:
        self.bar.close()
        self.metrics.close()
        try:
            plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png", keys=self.curve_keys)
        except ValueError:  # no step logged any of the curve keys (e.g. zero steps): nothing to plot
            pass
        if self.panels:
            plot_panels(self.run_dir / "metrics.jsonl", self.run_dir)  # reward.png, kl.png, ... accuracy.png
