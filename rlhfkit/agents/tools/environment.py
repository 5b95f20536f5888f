"""TRL's `environment_factory` contract: a class whose public methods are the episode's tools.

    class Counter:
        def reset(self, **row):              # the dataset row's columns; optional
            self.n = 0
            return "The counter is at 0."    # optional text appended to the last user turn
        def increment(self, by: int) -> int:
            \"\"\"Add to the counter.

            Args:
                by: how much
            \"\"\"
            self.n += by
            return self.n
        def get_reward(self) -> float:       # optional: the episode's reward
            return float(self.n == 10)

    ToolExecutor(environment_factory=Counter)     # RLTrainer.from_config(cfg, environment_factory=Counter)

One instance per episode. Its public methods other than `reset` and `get_reward` (typed, with
docstrings, as any tool) are the tools, bound to that instance, beside any plain `tools`. With
`get_reward`, the environment's reward is the episode's reward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rlhfkit.agents.base import to_float
from rlhfkit.errors import ConfigError, RewardError

RESERVED = ("reset", "get_reward")


def environment_tools(instance: Any) -> dict[str, Callable]:
    """The instance's public methods that are tools (name -> bound method)."""
    out = {}
    for name, member in inspect.getmembers(type(instance), callable):
        if name.startswith("_") or name in RESERVED or isinstance(member, type):
            continue
        out[name] = getattr(instance, name)
    if not out:
        raise ConfigError(f"environment {type(instance).__name__} has no public method to offer as a tool; "
                          "define one (typed, with a docstring)")
    return out


async def reset_environment(instance: Any, record: Mapping | None) -> str | None:
    """Call `reset(**row)` (the keywords it takes) when the class has one; its text, if any."""
    reset = getattr(instance, "reset", None)
    if reset is None:
        return None
    params = inspect.signature(reset).parameters
    row = dict(record or {})
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        row = {k: v for k, v in row.items() if k in params}
    try:
        out = reset(**row)
        out = await out if inspect.isawaitable(out) else out
    except Exception as exc:  # the user's environment, in one line
        raise RewardError(f"environment {type(instance).__name__}: reset() raised {type(exc).__name__}: {exc}") from exc
    if out is not None and not isinstance(out, str):
        raise RewardError(f"environment {type(instance).__name__}: reset() returned {type(out).__name__}; return "
                          "a str (appended to the prompt) or None")
    return out


async def environment_reward(instance: Any) -> float:
    try:
        out = instance.get_reward()
        out = await out if inspect.isawaitable(out) else out
    except Exception as exc:  # the user's environment, in one line
        raise RewardError(f"environment {type(instance).__name__}: get_reward() raised "
                          f"{type(exc).__name__}: {exc}") from exc
    return to_float(out, type(instance).__name__, "reward", "get_reward() returned")


def with_observation(messages: list[dict], text: str | None) -> list[dict]:
    """`text` appended to the last user turn (a new user turn when there is none); to a turn of content
    parts (a prompt with images) as a text part."""
    if not text:
        return messages
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            m["content"] = f"{m['content']}\n\n{text}"
            return out
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            m["content"] = [*m["content"], {"type": "text", "text": f"\n\n{text}"}]
            return out
    return out + [{"role": "user", "content": text}]
