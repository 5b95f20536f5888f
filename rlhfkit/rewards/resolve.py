"""`resolve_reward`: whatever a user names as the reward, as one `RewardFn`.

A reward spec is one of
  * a Python callable in OpenRLHF's or TRL's contract (see `rlhfkit.rewards.callables`);
  * a path (str or Path) to a Python file defining `reward_func` (see `rlhfkit.rewards.loader`), or
    "FILE.py:NAME" naming the file's function (verl's `custom_reward_function.name`);
  * "builtin:NAME", a reward file shipped with rlhfkit (the `BUILTIN_REWARDS` table);
  * an http(s) URL, or several joined by commas: reward servers (`RemoteRewardFn`);
  * an object that is a `RewardFn` already, i.e. its `__call__` is annotated to return
    `RewardOutput` (`RemoteRewardFn`, `TimeLimitedReward`, the trainers' `RewardModelFn`, ...):
    kept as it is;
or a list of these, combined by `RewardSum` as TRL's GRPOTrainer combines `reward_funcs`.

Example:

    def format_ok(completions, **kwargs):                    # TRL's contract
        return [1.0 if "</answer>" in c else 0.0 for c in completions]

    reward_fn = resolve_reward(["builtin:math", format_ok], weights=[1.0, 0.1])
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardFn, RewardOutput, normalize_reward_output
from rlhfkit.rewards.callables import CONTRACTS, CallableRewardFn
from rlhfkit.rewards.guard import TimeLimitedReward
from rlhfkit.rewards.loader import load_reward_file, split_function
from rlhfkit.rewards.remote import RemoteRewardFn, is_url

BUILTIN_REWARDS: dict[str, Path] = {
    "builtin:math": Path(__file__).resolve().parent / "builtin_math_reward.py",
    "builtin:code": Path(__file__).resolve().parent / "builtin_code_reward.py",
    "builtin:reasoning_gym": Path(__file__).resolve().parent / "builtin_reasoning_gym_reward.py",
}
"""Reward files shipped with rlhfkit, by the name a user gives (`builtin:NAME`)."""


def resolve_reward(spec: Any, weights: Sequence[float] | None = None, *,
                   timeout: float | None = None,
                   remote_options: Mapping[str, Any] | None = None,
                   code_options: Mapping[str, Any] | None = None,
                   reasoning_gym_options: Mapping[str, Any] | None = None) -> RewardFn:
    """One `RewardFn` from a reward spec or a list of them (see the module docstring).

    Args:
      spec: a reward spec, or a list / tuple of them (summed by `RewardSum`).
      weights: one weight per reward function of the list (default 1 each); given with a single
        spec, a list of one.
      timeout: seconds each call may take (`TimeLimitedReward`); None: no limit. Not applied to a
        spec that is only reward servers, which have their own request timeout.
      remote_options: keyword arguments of `RemoteRewardFn` (timeout, max_retries, batch_size,
        token) for the URLs.
      code_options: keyword arguments of `CodeReward` (the --reward.code.* settings) for builtin:code.
      reasoning_gym_options: the --reward.reasoning_gym.* settings for builtin:reasoning_gym
        (partial_credit, default True; False scores exact answers only).

    Raises:
      RewardError: an unknown builtin, a reward file that cannot be loaded, a callable in neither
        contract, a spec of any other type, an empty or nested list, weights of the wrong length.
    """
    is_list = isinstance(spec, (list, tuple))
    specs = list(spec) if is_list else [spec]
    if not specs:
        raise RewardError("reward_fn is an empty list; give at least one reward function")
    options = {"builtin:code": code_options or {}, "builtin:reasoning_gym": reasoning_gym_options or {}}
    fns = [_resolve_one(s, remote_options or {}, options) for s in specs]
    fn = RewardSum(fns, weights) if is_list or weights is not None else fns[0]
    if timeout is None or isinstance(fn, RemoteRewardFn):
        return fn
    return TimeLimitedReward(fn, timeout, source=getattr(fn, "source", None) or repr(fn))


class RewardSum:
    """Weighted sum of reward functions, as TRL's GRPOTrainer combines its `reward_funcs`.

        rewards[b] = Σ_i w_i r_i[b]   over the functions i that scored sample b

    A `None` from a callable means "does not apply to this sample" and is skipped (TRL's nansum);
    scores are summed likewise. Departure from TRL: a sample that no function scored is a
    `RewardError` naming them (TRL warns and gives it 0). extra_logs hold each function's own
    rewards under its name (NaN where it returned None, so average them with nanmean, as TRL
    logs them) and its own extra logs as "NAME/KEY". The functions run one after the other.
    """

    def __init__(self, fns: Sequence[RewardFn], weights: Sequence[float] | None = None) -> None:
        self.fns = list(fns)
        self.weights = _check_weights(weights, len(self.fns))
        self.names = _unique([getattr(f, "name", None) or type(f).__name__ for f in self.fns])
        self.source = " + ".join(self.names)

    def __repr__(self) -> str:
        return f"RewardSum({self.names}, weights={self.weights})"

    def __call__(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> RewardOutput:
        """Score B samples with every function; returns the weighted sums, [B] each."""
        batch_size = len(queries)
        rewards, scores = torch.zeros(batch_size), torch.zeros(batch_size)
        scored = torch.zeros(batch_size, dtype=torch.bool)
        logs: dict[str, torch.Tensor] = {}
        for fn, name, weight in zip(self.fns, self.names, self.weights):
            if isinstance(fn, CallableRewardFn):
                out, applies = fn.score(queries, prompts, labels, **kwargs)
            else:
                out = normalize_reward_output(fn(queries, prompts, labels, **kwargs), batch_size,
                                              source=name)
                applies = torch.ones(batch_size, dtype=torch.bool)
            rewards += torch.where(applies, weight * out.rewards, 0.0)
            scores += torch.where(applies, weight * out.scores, 0.0)
            scored |= applies
            logs[name] = torch.where(applies, out.rewards, float("nan"))
            logs.update({f"{name}/{k}": v for k, v in out.extra_logs.items()})
        if not bool(scored.all()):
            i = int((~scored).nonzero()[0, 0])
            raise RewardError(
                f"every reward function ({', '.join(self.names)}) returned None for sample {i} "
                f"of {batch_size}; at least one of them must score each sample"
            )
        return RewardOutput(rewards=rewards, scores=scores, extra_logs=logs)


def _resolve_one(spec: Any, remote_options: Mapping[str, Any],
                 builtin_options: Mapping[str, Mapping[str, Any]]) -> RewardFn:
    if isinstance(spec, (list, tuple)):
        raise RewardError("a list of reward functions cannot hold another list; flatten it")
    if isinstance(spec, str) and spec.startswith("builtin:"):
        if spec not in BUILTIN_REWARDS:
            raise RewardError(f"unknown reward {spec!r}; the built-in rewards are "
                              f"{', '.join(sorted(BUILTIN_REWARDS))}")
        if spec == "builtin:code":  # the file's reward_func with the --reward.code.* settings
            from rlhfkit.rewards.code import CodeReward
            return CodeReward(**builtin_options[spec])
        if spec == "builtin:reasoning_gym" and not builtin_options[spec].get("partial_credit", True):
            fn = load_reward_file(BUILTIN_REWARDS[spec], "exact_reward_func")  # exact answers only
            fn.name = BUILTIN_REWARDS[spec].stem
            return fn
        return load_reward_file(BUILTIN_REWARDS[spec])
    if isinstance(spec, str) and is_url(spec):
        return RemoteRewardFn(spec.split(","), **remote_options)
    if isinstance(spec, str):
        return load_reward_file(*split_function(spec))
    if isinstance(spec, os.PathLike):
        return load_reward_file(spec)
    if callable(spec):
        return spec if _is_reward_fn(spec) else CallableRewardFn(spec)
    raise RewardError(
        f"reward_fn of type {type(spec).__name__} is not a reward function; give a callable in "
        f"{CONTRACTS}, a path to a .py file defining reward_func, builtin:NAME, an http(s) URL, "
        "or a list of these"
    )


def _is_reward_fn(obj: Any) -> bool:
    """True for an object whose class's `__call__` is annotated to return RewardOutput."""
    call = getattr(type(obj), "__call__", None)
    if inspect.isroutine(obj) or not inspect.isfunction(call):
        return False
    annotation = inspect.signature(call).return_annotation
    return annotation is RewardOutput or annotation == "RewardOutput"


def _check_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    weights = list(weights)
    if len(weights) != n:
        raise RewardError(f"reward_weights has {len(weights)} entries for {n} reward functions; "
                          "give one weight per function")
    try:
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        values = [math.nan]
    if not all(math.isfinite(w) for w in values):
        raise RewardError(f"reward_weights must be finite numbers (got {weights})")
    return values


def _unique(names: list[str]) -> list[str]:
    """names with a repeated one suffixed by its position ("f", "f_2"), as log keys must differ."""
    return [n if n not in names[:i] else f"{n}_{i + 1}" for i, n in enumerate(names)]
