"""Console progress, jsonl metrics, TensorBoard, wandb, completion logs and plots.
May import nothing else from rlhfkit; errors here are ValueError / TypeError (docs/architecture.md)."""

from rlhfkit.tracking.metrics import MetricsWriter, TensorBoardWriter, Tracker
from rlhfkit.tracking.plots import plot_curves, plot_panels, read_metrics
from rlhfkit.tracking.progress import ProgressBar
from rlhfkit.tracking.samples import CompletionLogger

__all__ = [
    "CompletionLogger",
    "MetricsWriter",
    "ProgressBar",
    "TensorBoardWriter",
    "Tracker",
    "plot_curves",
    "plot_panels",
    "read_metrics",
]
