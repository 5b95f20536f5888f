"""A console progress bar for training: step/total, a few chosen metrics, time left.

    train 12/200 [00:31<08:05], reward=0.412 kl=0.0031

Time left is the average time per step so far times the steps left. The bar redraws on every
`update` (training steps take seconds, so there is nothing to throttle).

The bar is drawn only on a terminal: when the stream is not a TTY (CI logs, `nohup`, pipes) or
`enabled=False`, `update` and `close` do nothing and nothing is printed. `require_tty=False`
draws on any stream.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

DEFAULT_SHOW: dict[str, str] = {"reward": "reward", "kl": "kl"}
BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"


class ProgressBar:
    """A tqdm bar over training steps.

    Args:
      total: the number of steps of the run.
      show: label -> metric name of the values to show after the bar (default: reward, kl).
        A metric missing from an update is left out of the line.
      initial: the step a resumed run starts from (time left counts from here).
      enabled: False turns the bar off; True draws it when `stream` is a TTY (see require_tty).
      stream: where to draw (default sys.stderr).
      desc: the label at the start of the line.
      require_tty: draw only on a TTY (default); False draws on any stream.
    """

    def __init__(
        self,
        total: int,
        show: Mapping[str, str] | None = None,
        initial: int = 0,
        enabled: bool = True,
        stream: TextIO | None = None,
        desc: str = "train",
        require_tty: bool = True,
    ) -> None:
        stream = sys.stderr if stream is None else stream
        enabled = bool(enabled) and (not require_tty or _is_tty(stream))
        self.show = dict(DEFAULT_SHOW if show is None else show)
        self.enabled = enabled
        self._bar: tqdm | None = None
        if enabled:
            self._bar = tqdm(
                total=total, initial=initial, file=stream, desc=desc, bar_format=BAR_FORMAT,
                dynamic_ncols=True, leave=True, smoothing=0.0,
            )

    def postfix(self, metrics: Mapping[str, Any]) -> str:
        """The text after the bar, e.g. "reward=0.412 kl=0.0031" (missing metrics left out)."""
        parts = []
        for label, key in self.show.items():
            if key in metrics:
                try:
                    parts.append(f"{label}={float(metrics[key]):.4g}")
                except (TypeError, ValueError):
                    continue
        return " ".join(parts)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Move the bar to `step` (steps done so far) and show the chosen metrics."""
        if self._bar is None:
            return
        if metrics:
            self._bar.set_postfix_str(self.postfix(metrics), refresh=False)
        self._bar.n = int(step)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # closed or detached stream
        return False
