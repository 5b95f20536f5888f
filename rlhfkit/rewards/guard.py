"""A time limit on reward calls: a reward function that hangs stops the run with a RewardError.

The call runs in a daemon thread; when it does not finish within `timeout` seconds the caller gets a
RewardError and the thread is abandoned (Python cannot kill a thread; a daemon thread does not keep
the process alive, so the run exits cleanly with the error).
"""

from __future__ import annotations

import threading
from typing import Any

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput


class TimeLimitedReward:
    """Wraps a `RewardFn`; each call must return within `timeout` seconds (None: no limit)."""

    def __init__(self, fn: Any, timeout: float | None, source: str) -> None:
        self.fn, self.timeout, self.source = fn, timeout, source

    def __repr__(self) -> str:
        return f"TimeLimitedReward({self.fn!r}, timeout={self.timeout})"

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> RewardOutput:
        if self.timeout is None:
            return self.fn(queries, prompts, labels, **kwargs)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = self.fn(queries, prompts, labels, **kwargs)
            except BaseException as exc:  # handed to the caller's thread below
                box["exc"] = exc

        thread = threading.Thread(target=target, name="reward", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise RewardError(
                f"reward function {self.source} did not return within {self.timeout:g} s for a batch of "
                f"{len(queries)} queries; make it faster or raise --reward.timeout"
            )
        if "exc" in box:
            raise box["exc"]
        return box["out"]
