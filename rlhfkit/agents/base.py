"""The `AgentInstance` contract (OpenRLHF's) and the checks on what it returns.

An agent environment is a class with two async methods, one instance per episode:

    class AgentInstance(AgentInstanceBase):
        async def reset(self, states, **kwargs):
            # states = {"observation": prompt text, "label": label}
            return {"observation": states["observation"]}        # the initial observation text
        async def step(self, states, **kwargs):
            # states = {"observation_text": all text so far, "action_text": the model's turn,
            #           "label": label, "sampling_params": the SamplingParams of the turn}
            return {"rewards": 1.0, "scores": 1.0, "environment_feedback": "...", "done": True,
                    "sampling_params": None, "extra_logs": {"name": value}}

`rewards` (float or 1-element tensor) are summed over the episode's steps; `scores` of the last
step are what dynamic filtering sees (default: the summed reward). `sampling_params` (optional)
replaces the next turn's parameters: a `SamplingParams` or a dict of its fields (vLLM's
`max_tokens` is read as `max_new_tokens`). `extra_logs` of the last step are logged.

With a vision-language policy, `step` may return `environment_images`: a list of images (PIL
images, paths, bytes) that the feedback shows, its text holding the model's image placeholder once
per image (Qwen2-VL: `<|vision_start|><|image_pad|><|vision_end|>`), as OpenRLHF's
`vlm_multiturn_agent.py` does; see executor.py.

`__init__` may be `async def` (as in OpenRLHF's examples); the executor awaits it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import numbers
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.errors import RewardError
from rlhfkit.rollout.base import SamplingParams

log = logging.getLogger("rlhfkit")


class AgentInstanceBase(ABC):
    """Base class of an environment; one instance per episode (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        return {"observation": states["observation"]}

    @abstractmethod
    async def step(self, states: dict, **kwargs: Any) -> dict:
        """One environment step on the model's action; see the module docstring."""


@dataclass
class StepResult:
    """A checked `step()` result."""

    reward: float
    score: float | None
    feedback: str
    done: bool
    sampling_params: Any  # the next turn's parameters (None: unchanged)
    extra_logs: dict[str, float]
    images: list = dataclasses.field(default_factory=list)  # environment_images (a VLM policy's)


async def new_instance(cls: type, *args: Any, **kwargs: Any) -> Any:
    """`cls(*args, **kwargs)`, awaiting an `async def __init__` (which plain `cls()` cannot call)."""
    init = cls.__init__
    if inspect.iscoroutinefunction(init):
        instance = cls.__new__(cls)
        await init(instance, *args, **kwargs)
        return instance
    return cls(*args, **kwargs)


def to_float(value: Any, source: str, what: str, origin: str = "step() returned") -> float:
    """A Python float from a float/int/bool or a one-element tensor/array."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "size", None) == 1:
        value = value.item()
    if isinstance(value, numbers.Real):
        out = float(value)
        if out == out and abs(out) != float("inf"):
            return out
    raise RewardError(f"agent {source}: {origin} {what}={value!r:.60}; give one finite number")


def check_step_result(result: Any, source: str, current: Any, merge=None) -> StepResult:
    """Check an `AgentInstance.step` result; RewardError names `source` and the field at fault.
    `merge(current, new, source)` reads its sampling_params (default: `merge_sampling_params`)."""
    if not isinstance(result, Mapping):
        raise RewardError(f"agent {source}: step() returned {type(result).__name__}; return a dict "
                          "with rewards, environment_feedback and done")
    for key in ("rewards", "environment_feedback", "done"):
        if key not in result:
            raise RewardError(f"agent {source}: step() result lacks {key!r} (keys: {sorted(result)})")
    feedback = result["environment_feedback"]
    if not isinstance(feedback, str):
        raise RewardError(f"agent {source}: environment_feedback must be a str, got {type(feedback).__name__}")
    score = result.get("scores")
    logs = result.get("extra_logs") or {}
    images = result.get("environment_images") or []
    if not isinstance(images, (list, tuple)):
        raise RewardError(f"agent {source}: environment_images must be a list of images, got {type(images).__name__}")
    return StepResult(
        reward=to_float(result["rewards"], source, "rewards"),
        score=None if score is None else to_float(score, source, "scores"),
        feedback=feedback,
        done=bool(result["done"]),
        sampling_params=(merge or merge_sampling_params)(current, result.get("sampling_params"), source),
        extra_logs={str(k): to_float(v, source, f"extra_logs[{k!r}]") for k, v in logs.items()},
        images=list(images),
    )


_PARAM_NAMES = {f.name for f in dataclasses.fields(SamplingParams)} | {"max_tokens"}


def merge_sampling_params(current: SamplingParams, new: Any, source: str) -> SamplingParams | None:
    """None (keep), a SamplingParams, or a dict of its fields over `current`; n is always 1."""
    if new is None or new is current:
        return None
    if isinstance(new, SamplingParams):
        return dataclasses.replace(new, n=1)
    if isinstance(new, Mapping):
        unknown = set(new) - _PARAM_NAMES
        if unknown:
            raise RewardError(f"agent {source}: sampling_params has unknown fields {sorted(unknown)}; "
                              f"valid: {sorted(_PARAM_NAMES)}")
        fields = dict(new)
        if "max_tokens" in fields:
            fields["max_new_tokens"] = fields.pop("max_tokens")
        if "stop_token_ids" in fields:
            fields["stop_token_ids"] = tuple(fields["stop_token_ids"])
        return dataclasses.replace(current, **fields, n=1)
    raise RewardError(f"agent {source}: sampling_params must be None, a dict or SamplingParams, "
                      f"got {type(new).__name__}")


class EnvErrors:
    """Episodes ended by an error of their environment's `step()` (the model's action made it raise, or
    it returned something malformed): the episode ends there with reward 0 (what it earned before
    included: crashing the environment must not keep a reward), counted (`agent/env_errors`) and
    logged once per distinct message in a batch; a batch whose every episode ended so is a RewardError
    naming the first error (the environment itself is broken: nothing would train)."""

    def __init__(self, source: str):
        self.source = source
        self.count = 0  # since the last pop_metrics
        self.batch: list[RewardError] = []  # this batch's errors
        self.ended: set[int] = set()  # id() of this batch's episodes ended so

    def start(self) -> None:
        self.batch, self.ended = [], set()

    def end(self, episode: Any, exc: RewardError) -> None:
        """End `episode` (reward 0, truncated) for `exc`, a RewardError naming the environment; an episode
        ended already (its close() failing after its step() did) is not counted again."""
        if id(episode) in self.ended:
            return
        self.ended.add(id(episode))
        episode.reward, episode.truncated = 0.0, True
        if hasattr(episode, "score"):
            episode.score = 0.0
        self.count += 1
        if all(str(e) != str(exc) for e in self.batch):
            log.warning("agent %s: an episode ended with reward 0: %s", self.source, exc)
        self.batch.append(exc)

    def check(self, episodes: int) -> None:
        if episodes and len(self.batch) == episodes:
            raise RewardError(f"agent {self.source}: the environment failed in all {episodes} episodes of the "
                              f"batch, so nothing would train; the first: {self.batch[0]}") from self.batch[0]

    def pop_metrics(self) -> dict[str, float]:
        out = {"agent/env_errors": float(self.count)} if self.count else {}
        self.count = 0
        return out


async def gather_or_cancel(aws: Iterable[Awaitable]) -> list:
    """Await `aws` together, their results in order; when one raises (or this is cancelled) the others are
    cancelled and awaited before the error goes on, so none of them still runs while the caller cleans up."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
