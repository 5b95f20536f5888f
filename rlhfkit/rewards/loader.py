"""Load a reward function from a Python file (OpenRLHF's `--remote_rm_url reward.py` contract).

The file defines `reward_func(queries, prompts, labels, **kwargs)` (see `rlhfkit.rewards.base`).
`load_reward_file` imports it under a fresh module name, checks its signature once, and wraps
it so that every call:
  * passes the extra keyword arguments the function can take (all of them if it has **kwargs,
    else only those it names), so `def reward_func(queries, prompts, labels)` works;
  * runs an `async def reward_func` to completion with `asyncio.run` (so it must not be called
    from inside a running event loop);
  * turns an exception raised by the function into a `RewardError` naming the file;
  * checks the result with `normalize_reward_output`;
  * honours two opt-in attributes of the function (set them, or use `batched` / `grouped`):
    `reward_func.batch_size = K` calls it on chunks of at most K queries, and
    `reward_func.group_level = True` calls it once per group (all samples of one prompt, found
    from the `group_ids=` keyword the trainer passes). Chunks of an async function run
    concurrently under one event loop; per-sample keyword arguments are sliced to the chunk.

The file's folder is not added to `sys.path`; a reward file that imports a sibling module must
make that import work itself.

Example reward file:

    def reward_func(queries, prompts, labels):
        return [1.0 if q.strip().endswith(str(l)) else 0.0 for q, l in zip(queries, labels)]
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput, normalize_reward_output

FUNCTION_NAME = "reward_func"


class FileRewardFn:
    """A `RewardFn` around the `reward_func` of a Python file (build it with `load_reward_file`)."""

    def __init__(self, path: Path, func: Callable[..., Any]) -> None:
        self.path = path
        self.func = func
        self._takes_all_kwargs, self._kwarg_names = _keyword_parameters(func)

    def __repr__(self) -> str:
        return f"FileRewardFn({str(self.path)!r})"

    def __call__(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> RewardOutput:
        """Score B queries; queries, prompts, labels are lists of length B. Returns [B] values."""
        batch_size = len(queries)
        if len(prompts) != batch_size or len(labels) != batch_size:
            raise RewardError(
                f"reward function {self.path}: got {batch_size} queries, {len(prompts)} prompts "
                f"and {len(labels)} labels; pass one prompt and one label per query"
            )
        chunks = self._chunks(batch_size, kwargs.get("group_ids"))
        if not self._takes_all_kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k in self._kwarg_names}
        calls = []
        try:
            for rows in chunks:
                kw = {k: _slice(v, rows, batch_size) for k, v in kwargs.items()}
                calls.append(self.func([queries[i] for i in rows], [prompts[i] for i in rows],
                                       [labels[i] for i in rows], **kw))
            if any(inspect.isawaitable(c) for c in calls):
                calls = asyncio.run(_gather(calls))
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(
                f"reward function {self.path} raised {type(exc).__name__}: {_first_line(exc)}; "
                "fix the reward file (run it alone on a few queries to see the traceback)"
            ) from exc
        outs = [normalize_reward_output(o, len(rows), source=str(self.path)) for o, rows in zip(calls, chunks)]
        return _merge(outs, chunks, batch_size)

    def _chunks(self, batch_size: int, group_ids: Any) -> list[list[int]]:
        if getattr(self.func, "group_level", False):
            if group_ids is None:
                raise RewardError(f"reward function {self.path} asks for whole groups (group_level) "
                                  "but the caller passed no group_ids")
            groups: dict[int, list[int]] = {}
            for i, g in enumerate(torch.as_tensor(group_ids).tolist()):
                groups.setdefault(g, []).append(i)
            return list(groups.values())
        size = getattr(self.func, "batch_size", None) or batch_size
        return [list(range(s, min(s + size, batch_size))) for s in range(0, batch_size, size)] or [[]]


def batched(size: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: call this reward function on chunks of at most `size` queries."""

    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        func.batch_size = size
        return func

    return mark


def grouped(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: call this reward function once per group (all samples of one prompt)."""
    func.group_level = True
    return func


def _slice(value: Any, rows: list[int], batch_size: int) -> Any:
    """value[rows] for a per-sample list / tensor of length B; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch_size:
        return value[rows]
    if isinstance(value, (list, tuple)) and len(value) == batch_size:
        return [value[i] for i in rows]
    return value


def _merge(outs: list[RewardOutput], chunks: list[list[int]], batch_size: int) -> RewardOutput:
    if len(outs) == 1 and chunks[0] == list(range(batch_size)):
        return outs[0]
    rewards, scores = torch.zeros(batch_size), torch.zeros(batch_size)
    names = {k for o in outs for k in o.extra_logs}
    logs = {k: torch.zeros(batch_size) for k in names}
    for o, rows in zip(outs, chunks):
        idx = torch.tensor(rows, dtype=torch.long)
        rewards[idx], scores[idx] = o.rewards, o.scores
        for k, v in o.extra_logs.items():
            logs[k][idx] = v
    return RewardOutput(rewards=rewards, scores=scores, extra_logs=logs)


def load_reward_file(path: str | Path) -> FileRewardFn:
    """Import `path` and return its `reward_func` wrapped as a `RewardFn`.

    Raises:
      RewardError: the file is missing, fails to import (the exception's first line is shown),
        defines no callable `reward_func`, or `reward_func` cannot take
        (queries, prompts, labels) positionally.
    """
    path = Path(path)
    if not path.is_file():
        raise RewardError(f"reward file {path} does not exist; check --reward.remote_url")
    module = import_python_file(path)
    func = getattr(module, FUNCTION_NAME, None)
    if func is None or not callable(func):
        found = "is not callable" if func is not None else "is not defined"
        raise RewardError(
            f"reward file {path}: {FUNCTION_NAME} {found}; define "
            f"`def {FUNCTION_NAME}(queries, prompts, labels, **kwargs)` in it"
        )
    _check_positional(func, path)
    return FileRewardFn(path, func)


def import_python_file(path: Path, what: str = "reward file") -> Any:
    """Execute the file as a new module with a unique name (registered in sys.modules).

    Raises RewardError naming `what` and `path` when it cannot be imported.
    """
    name = f"rlhfkit_{what.replace(' ', '_')}_{path.stem}_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"{what} {path} cannot be imported as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the file look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise RewardError(
            f"{what} {path} failed to import: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return module


def _check_positional(func: Callable[..., Any], path: Path) -> None:
    """Raise RewardError unless func can be called as func(queries, prompts, labels)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # builtins without a signature: find out at call time
    try:
        signature.bind(None, None, None)
    except TypeError as exc:
        raise RewardError(
            f"reward file {path}: {FUNCTION_NAME}{signature} cannot be called with "
            f"(queries, prompts, labels) ({exc}); use "
            f"`def {FUNCTION_NAME}(queries, prompts, labels, **kwargs)`"
        ) from exc


def _keyword_parameters(func: Callable[..., Any]) -> tuple[bool, frozenset[str]]:
    """(takes **kwargs, names of the keyword-passable parameters after the first three)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return True, frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return True, frozenset()
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    n_positional = sum(p.kind in positional_kinds for p in params)
    taken = {p.name for p in params[: min(3, n_positional)]}  # queries, prompts, labels
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in params if p.kind in keyword_kinds and p.name not in taken}
    return False, frozenset(names)


async def _gather(calls: list[Any]) -> list[Any]:
    async def value(c: Any) -> Any:
        return await c if inspect.isawaitable(c) else c

    return list(await asyncio.gather(*(value(c) for c in calls)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
