"""Console output of a run: a progress bar on a terminal, a plain line per step elsewhere, and the
`rlhfkit` logger's messages.

On a terminal (stdout and stderr both TTYs) the bar redraws on stderr at every step:

    train 12/200 [00:31<08:05], reward=0.412 kl=0.0031

Time left is the average time per step so far times the steps left. When stdout is not a
terminal (`nohup`, a batch scheduler, `| tee log`, CI) a bar would print nothing readable, so
each step prints one plain line to stdout instead, flushed at once:

    train 12/200 reward=0.412 kl=0.0031 2.61s/step 8:11 left

`enabled=False` (--logger.progress_bar false) prints neither.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

DEFAULT_SHOW: dict[str, str] = {"reward": "reward", "kl": "kl"}
BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"
LOGGER = "rlhfkit"
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class ProgressBar:
    """Per-step console output: a tqdm bar on a terminal, else one plain line per step.

    Args:
      total: the number of steps of the run.
      show: label -> metric name of the values to show (default: reward, kl). A metric missing
        from an update is left out of the line.
      initial: the step a resumed run starts from (time left counts from here).
      enabled: False prints nothing at all.
      stream: where to write. Default: stderr (the bar) when stdout and stderr are both
        terminals, else stdout (the lines).
      desc: the label at the start of the line.
      require_tty: draw the bar only on a TTY and write plain lines elsewhere (default); False
        draws the bar on any stream.
      clock: seconds, monotonic (for tests).

    Attributes: `mode` is "bar", "lines" or None (disabled); `enabled` is `mode is not None`.
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stream is None:
            stream = sys.stderr if _is_tty(sys.stdout) and _is_tty(sys.stderr) else sys.stdout
        self.show = dict(DEFAULT_SHOW if show is None else show)
        self.total, self.desc, self.stream, self.clock = int(total), desc, stream, clock
        self.mode: str | None = None
        if enabled:
            self.mode = "bar" if not require_tty or _is_tty(stream) else "lines"
        self.enabled = self.mode is not None
        self._bar: tqdm | None = None
        self._start = self._last_time = clock()
        self._initial = self._last_step = int(initial)
        if self.mode == "bar":
            self._bar = tqdm(
                total=total, initial=initial, file=stream, desc=desc, bar_format=BAR_FORMAT,
                dynamic_ncols=True, leave=True, smoothing=0.0,
            )

    def postfix(self, metrics: Mapping[str, Any]) -> str:
        """The chosen metrics, e.g. "reward=0.412 kl=0.0031" (missing metrics left out)."""
        parts = []
        for label, key in self.show.items():
            if key in metrics:
                try:
                    parts.append(f"{label}={float(metrics[key]):.4g}")
                except (TypeError, ValueError):
                    continue
        return " ".join(parts)

    def line(self, step: int, metrics: Mapping[str, Any] | None, now: float) -> str:
        """The plain line of `step`: "train 3/10 reward=0.5 kl=0.01 2.50s/step 0:17 left". Seconds
        per step are those since the previous line; time left is the average step so far times the
        steps left. A step that did not advance (e.g. a final evaluation) shows no timing."""
        parts = [f"{self.desc} {step}/{self.total}"]
        shown = self.postfix(metrics or {})
        if shown:
            parts.append(shown)
        if step > self._last_step:
            parts.append(f"{(now - self._last_time) / (step - self._last_step):.2f}s/step")
            if step > self._initial and step < self.total:
                left = (now - self._start) / (step - self._initial) * (self.total - step)
                parts.append(f"{format_seconds(left)} left")
        return " ".join(parts)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Record that `step` steps are done, with the chosen metrics."""
        if self.mode == "lines":
            now = self.clock()
            print(self.line(int(step), metrics, now), file=self.stream, flush=True)
            if step > self._last_step:
                self._last_time, self._last_step = now, int(step)
            return
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


def format_seconds(seconds: float) -> str:
    """42 -> "0:42", 500 -> "8:20", 3725 -> "1:02:05"."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # closed or detached stream
        return False


# ------------------------------------------------------------------ the rlhfkit logger on the console
def set_log_level(level: str) -> None:
    """Set the level of the `rlhfkit` logger (and so of every `rlhfkit.*` logger): debug, info,
    warning or error."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is unknown; valid: {', '.join(LOG_LEVELS)}")
    logging.getLogger(LOGGER).setLevel(LOG_LEVELS[level])


class ConsoleLogHandler(logging.Handler):
    """Writes `rlhfkit` log records to the current sys.stderr (looked up at each record, so a
    redirected or captured stderr gets them): info as the bare message, other levels as
    "warning: message"."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.levelno != logging.INFO:
                msg = f"{record.levelname.lower()}: {msg}"
            print(msg, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001  (logging must never break the run)
            self.handleError(record)


def install_console_logging() -> None:
    """Give the `rlhfkit` logger a ConsoleLogHandler once (the CLI calls this; a library user
    configures logging as they like)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, ConsoleLogHandler) for h in logger.handlers):
        logger.addHandler(ConsoleLogHandler())
