"""Curves from `metrics.jsonl`: one PNG with one subplot per metric (`plot_curves`), and one PNG
per panel (reward, kl, entropy, length, accuracy) in the run folder (`plot_panels`).

Drawn with matplotlib's object API on an Agg canvas: no display, no pyplot state, no change
to the process-wide backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

DEFAULT_KEYS = ("reward", "accuracy")


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics jsonl file.

    A torn last line (a run killed while writing) is skipped; a bad line elsewhere raises
    ValueError naming the file and line.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                break
            raise ValueError(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from exc
        if isinstance(row, dict):
            rows.append(row)
    return rows


def plot_curves(
    metrics_jsonl_path: str | Path,
    out_png: str | Path,
    keys: Sequence[str] = DEFAULT_KEYS,
    title: str | None = None,
) -> list[str]:
    """Plot each of `keys` found in the file against "step" into one PNG; return those keys.

    Rows without a key, or with a null / non-number value for it, are skipped for that key.

    Raises:
      ValueError: none of `keys` has a value in the file (the message lists the keys it has).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_metrics(metrics_jsonl_path)
    series = {key: _series(rows, key) for key in keys}
    present = [key for key in keys if series[key][0]]
    if not present:
        available = sorted({k for row in rows for k in row if k != "step"})
        raise ValueError(
            f"{metrics_jsonl_path}: none of the keys {list(keys)} has a value; "
            f"the file has {available}"
        )
    fig = Figure(figsize=(6.0, 2.6 * len(present)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(present), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, present):
        steps, values = series[key]
        ax.plot(steps, values, marker="." if len(steps) < 50 else None, linewidth=1.2)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    if title:
        fig.suptitle(title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png", dpi=100)
    return present


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, using the row index when a row has no "step"."""
    steps, values = [], []
    for i, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(float(row.get("step", i)))
            values.append(float(value))
    return steps, values


# One PNG per panel in the run folder; several curves share a panel's axes. Patterns use fnmatch.
RUN_PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "score"),
    "kl": ("kl", "kl_loss"),
    "entropy": ("entropy",),
    "length": ("response_length",),
    "accuracy": ("eval/accuracy", "eval/*accuracy", "eval/pass@*", "eval/maj@*"),
}


def plot_panels(
    metrics_jsonl_path: str | Path, out_dir: str | Path, panels: dict[str, Sequence[str]] | None = None
) -> list[Path]:
    """Write `out_dir/<panel>.png` for each panel with at least one matching key that has values.

    Each panel draws every metric that matches one of its patterns (fnmatch, e.g. "eval/pass@*")
    against "step", with a legend. Returns the PNGs written; a panel with no data is skipped.
    """
    from fnmatch import fnmatchcase

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_metrics(metrics_jsonl_path)
    names = sorted({k for row in rows for k in row if k != "step"})
    written = []
    for panel, patterns in (RUN_PANELS if panels is None else panels).items():
        keys = list(dict.fromkeys(k for p in patterns for k in names if fnmatchcase(k, p)))
        series = {k: _series(rows, k) for k in keys}
        series = {k: v for k, v in series.items() if v[0]}
        if not series:
            continue
        fig = Figure(figsize=(6.0, 3.2), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        for key, (steps, values) in series.items():
            ax.plot(steps, values, marker="." if len(steps) < 50 else None, linewidth=1.2, label=key)
        ax.set_xlabel("step")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        out = Path(out_dir) / f"{panel}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=100)
        written.append(out)
    return written
