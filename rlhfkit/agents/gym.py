"""Gymnasium-style text environments as agents: `reset()` and `step(action)` on strings.

    class Guess:                                   # any class with gymnasium's two methods
        def reset(self, seed=None, options=None):
            return "Guess my number (1-9).", {}                      # (observation, info)
        def step(self, action):
            ...
            return observation, reward, terminated, truncated, info

    AgentInstance = gym_agent(Guess)               # in an agent file: --agent.func_path FILE

`gym_agent(factory)` makes an `AgentInstance` class (OpenRLHF's contract, driven by
`MultiTurnExecutor`): one environment per episode from `factory()` (a class or a function);
`reset(seed=, options={"prompt": ..., "label": ...})` when it takes those keywords, else
`reset()`; its observation is appended to the prompt (an empty one leaves the prompt as is).
Each action's text goes to `step`; the observation it returns is the feedback, its reward is
summed over the episode, and `terminated or truncated` ends it. Old gym's 4-tuple
`(obs, reward, done, info)` and a bare observation from `reset` are accepted too. Sync or async
methods both work.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rlhfkit.agents.base import AgentInstanceBase
from rlhfkit.errors import RewardError


async def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def _reset_kwargs(reset: Callable, prompt: str, label: Any) -> dict:
    params = inspect.signature(reset).parameters
    if "options" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"options": {"prompt": prompt, "label": label}}
    return {}


def gym_agent(factory: Callable[[], Any], name: str | None = None) -> type[AgentInstanceBase]:
    """An AgentInstance class running `factory()` environments (see the module docstring)."""
    source = name or getattr(factory, "__qualname__", "gym environment")

    class GymAgentInstance(AgentInstanceBase):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.env = factory()

        async def reset(self, states: dict, **kwargs: Any) -> dict:
            prompt = states["observation"]
            out = await _call(self.env.reset, **_reset_kwargs(self.env.reset, prompt, states.get("label")))
            obs = out[0] if isinstance(out, tuple) else out
            if obs is not None and not isinstance(obs, str):
                raise RewardError(f"gym environment {source}: reset() gave a {type(obs).__name__} observation; "
                                  "text environments return a str")
            return {"observation": prompt + (obs or "")}

        async def step(self, states: dict, **kwargs: Any) -> dict:
            out = await _call(self.env.step, states["action_text"])
            if not isinstance(out, tuple) or len(out) not in (4, 5):
                raise RewardError(f"gym environment {source}: step() must return (observation, reward, terminated, "
                                  f"truncated, info), got {type(out).__name__}")
            obs, reward, *flags, info = out
            done = any(bool(f) for f in flags)
            logs = {k: float(v) for k, v in (info or {}).items() if isinstance(v, (int, float))}
            return {"rewards": reward, "scores": reward, "environment_feedback": "" if done else str(obs or ""),
                    "done": done, "extra_logs": logs}

    GymAgentInstance.__qualname__ = GymAgentInstance.__name__ = f"gym_agent({source})"
    return GymAgentInstance
