"""The reward-function contract and the check every reward result passes through.

The contract is OpenRLHF's (`--remote_rm_url reward.py`): a function

    reward_func(queries, prompts, labels, **kwargs)

where `queries[i]` is the full decoded prompt + response string, `prompts[i]` the prompt string
and `labels[i]` the dataset label (or None). It returns either

    {"rewards": [B], "scores": [B], "extra_logs": {name: [B]}}     ("scores" and "extra_logs"
                                                                     optional)
or a plain list / tuple / tensor of B floats (then scores = rewards).

`scores` are what dynamic filtering looks at (conventionally in [0, 1]); `rewards` are what the
advantage estimator sees. Every result is checked by `normalize_reward_output`: right length,
numbers only, finite. A reward function that misbehaves stops the run with a `RewardError`
that names it, instead of silently corrupting the advantages.
"""

from __future__ import annotations

import asyncio
import inspect
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from rlhfkit.errors import RewardError

_REAL_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@dataclass
class RewardOutput:
    """A checked reward result for a batch of B responses.

    rewards     FloatTensor [B]   the scalar reward of each response
    scores      FloatTensor [B]   the score used for filtering (equals rewards when not given)
    extra_logs  dict[str, FloatTensor [B]]   per-sample values to log (e.g. "format_ok"; NaN or None:
                not applicable to that sample)
    steps       list of B FloatTensor [S_b], or None   a process reward model's score of each step of
                each response, in order (None: no per-step scores)
    step_ends   list of B LongTensor [S_b], or None    where each step ends: its last token's index in
                the response's token ids (those the caller gave; None: not known)
    """

    rewards: torch.Tensor
    scores: torch.Tensor
    extra_logs: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: list[torch.Tensor] | None = None
    step_ends: list[torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.rewards.numel())

    def select(self, rows: slice | list[int]) -> RewardOutput:
        """The output of the responses `rows` (a slice or a list of indices, repeats allowed)."""
        index = rows if isinstance(rows, slice) else torch.tensor(rows, dtype=torch.long)

        def pick(xs: list | None) -> list | None:
            return None if xs is None else (xs[rows] if isinstance(rows, slice) else [xs[i] for i in rows])

        return RewardOutput(self.rewards[index], self.scores[index], {k: v[index] for k, v in self.extra_logs.items()},
                            pick(self.steps), pick(self.step_ends))


def concat_outputs(outs: Sequence[RewardOutput]) -> RewardOutput:
    """The outputs of consecutive batches as one (an extra log one batch lacks is 0 there; per-step scores
    and step ends are kept only when every batch has them)."""
    names = {k for o in outs for k in o.extra_logs}

    def joined(attr: str) -> list | None:
        parts = [getattr(o, attr) for o in outs]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]

    return RewardOutput(
        rewards=torch.cat([o.rewards for o in outs]),
        scores=torch.cat([o.scores for o in outs]),
        extra_logs={k: torch.cat([o.extra_logs.get(k, torch.zeros(o.batch_size)) for o in outs]) for k in names},
        steps=joined("steps"), step_ends=joined("step_ends"))


@runtime_checkable
class RewardFn(Protocol):
    """A reward function: B query strings (prompt + response) in, a checked RewardOutput out.

    Extra keyword arguments (e.g. `responses=`, `response_lengths=`) carry what the caller
    knows; an implementation ignores the ones it does not use.
    """

    def __call__(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> RewardOutput: ...


def normalize_reward_output(out: Any, batch_size: int, source: str) -> RewardOutput:
    """Check a reward function's result and turn it into a `RewardOutput`.

    Accepts a `RewardOutput`, a dict with "rewards" (and optional "scores", "extra_logs"), or a
    list / tuple / tensor / numpy array of `batch_size` numbers. A scalar extra log is
    broadcast to [B]; every other value must have exactly B entries.

    Args:
      out: what the reward function returned.
      batch_size: B, the number of queries it was given.
      source: what produced `out` (a file path or a name), used in error messages.

    Raises:
      RewardError: wrong type, wrong length, a non-number, or a NaN / inf value (the message
        names `source`, the field and the index).
    """
    if isinstance(out, RewardOutput):
        out = {"rewards": out.rewards, "scores": out.scores, "extra_logs": out.extra_logs}
    if isinstance(out, Mapping):
        if "rewards" not in out:
            raise RewardError(
                f"reward function {source} returned a dict without 'rewards' (keys: "
                f"{sorted(map(str, out.keys()))}); return {{'rewards': [...], 'scores': [...], "
                "'extra_logs': {...}} or a plain list of floats"
            )
        rewards = _to_vector(out["rewards"], batch_size, source, "rewards")
        scores_raw = out.get("scores")
        scores = rewards.clone() if scores_raw is None else _to_vector(
            scores_raw, batch_size, source, "scores"
        )
        extra_logs = _to_extra_logs(out.get("extra_logs") or {}, batch_size, source)
        return RewardOutput(rewards=rewards, scores=scores, extra_logs=extra_logs)
    if isinstance(out, (list, tuple, torch.Tensor, np.ndarray)):
        rewards = _to_vector(out, batch_size, source, "rewards")
        return RewardOutput(rewards=rewards, scores=rewards.clone(), extra_logs={})
    raise RewardError(
        f"reward function {source} returned {type(out).__name__}; return a list of {batch_size} "
        "floats or a dict {'rewards': [...], 'scores': [...], 'extra_logs': {...}}"
    )


def _to_extra_logs(logs: Any, batch_size: int, source: str) -> dict[str, torch.Tensor]:
    if not isinstance(logs, Mapping):
        raise RewardError(
            f"reward function {source} returned extra_logs of type {type(logs).__name__}; "
            "it must be a dict {name: list of B floats}"
        )
    result = {}
    for name, value in logs.items():
        if is_scalar(value):
            value = [value] * batch_size
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):  # None: not applicable (NaN)
            value = [float("nan") if v is None else v for v in value]
        result[str(name)] = _to_vector(value, batch_size, source, f"extra_logs[{name!r}]", nan_ok=True)
    return result


def is_scalar(value: Any) -> bool:
    """A real number, or a 0-d tensor / array."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 0
    return isinstance(value, numbers.Real)


def _to_vector(value: Any, batch_size: int, source: str, what: str, nan_ok: bool = False) -> torch.Tensor:
    """FloatTensor [B] from a tensor / array / sequence of numbers, checked entry by entry (finite; with
    `nan_ok`, NaN allowed: an extra log's "not applicable")."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = value.tolist()
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(value).detach().cpu()
        if tensor.ndim != 1:
            raise RewardError(
                f"reward function {source} returned {what} of shape {tuple(tensor.shape)}; "
                f"it must be one number per query, shape ({batch_size},)"
            )
        if not (tensor.dtype.is_floating_point or tensor.dtype in _REAL_DTYPES):
            raise RewardError(
                f"reward function {source} returned {what} of dtype {tensor.dtype}; "
                "give real numbers"
            )
        tensor = tensor.to(torch.float32)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        floats = [_to_float(v, i, source, what) for i, v in enumerate(value)]
        tensor = torch.tensor(floats, dtype=torch.float32)
    else:
        raise RewardError(
            f"reward function {source} returned {what} of type {type(value).__name__}; "
            f"give a list or tensor of {batch_size} floats"
        )
    if tensor.numel() != batch_size:
        raise RewardError(
            f"reward function {source} returned {tensor.numel()} {what} for a batch of "
            f"{batch_size} queries; return exactly one value per query"
        )
    bad = (torch.isinf(tensor) if nan_ok else ~torch.isfinite(tensor)).nonzero()
    if bad.numel() > 0:
        i = int(bad[0, 0])
        raise RewardError(
            f"reward function {source} returned a non-finite value in {what} at index {i} "
            f"({float(tensor[i])}); make it return finite floats"
        )
    return tensor


def _to_float(v: Any, i: int, source: str, what: str) -> float:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.item())
    if isinstance(v, np.ndarray) and v.size == 1:
        return float(v.item())
    if isinstance(v, numbers.Real):
        return float(v)
    raise RewardError(
        f"reward function {source} returned {what} with a {type(v).__name__} at index {i} "
        f"({v!r:.60}); every value must be a number"
    )


def response_texts(queries: Sequence[str], prompts: Sequence[str], responses: Sequence[str] | None = None) -> list[str]:
    """`responses` when the caller passed them, else each query after its prompt (the whole query when
    it does not start with its prompt)."""
    if responses is not None:
        return list(responses)
    return [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]


async def gather_awaitables(calls: list[Any]) -> list[Any]:
    """The results of calls, the awaitable ones awaited concurrently (in the caller's event loop)."""
    async def value(c: Any) -> Any:
        return await c if inspect.isawaitable(c) else c

    return list(await asyncio.gather(*(value(c) for c in calls)))
