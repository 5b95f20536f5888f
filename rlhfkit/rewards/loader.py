"""Load a reward function from a Python file (OpenRLHF's `--remote_rm_url reward.py` contract).

The file defines `reward_func(queries, prompts, labels, **kwargs)` (see `rlhfkit.rewards.base`).
`load_reward_file` imports it under a fresh module name, checks its signature once, and wraps
it so that every call:
  * passes the extra keyword arguments the function can take (all of them if it has **kwargs,
    else only those it names), so `def reward_func(queries, prompts, labels)` works;
  * runs an `async def reward_func` to completion with `asyncio.run` (so it must not be called
    from inside a running event loop);
  * turns an exception raised by the function into a `RewardError` naming the file;
  * checks the result with `normalize_reward_output`.

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
        if not self._takes_all_kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k in self._kwarg_names}
        try:
            out = self.func(queries, prompts, labels, **kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_await(out))
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(
                f"reward function {self.path} raised {type(exc).__name__}: {_first_line(exc)}; "
                "fix the reward file (run it alone on a few queries to see the traceback)"
            ) from exc
        return normalize_reward_output(out, batch_size, source=str(self.path))


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
    module = _import_file(path)
    func = getattr(module, FUNCTION_NAME, None)
    if func is None or not callable(func):
        found = "is not callable" if func is not None else "is not defined"
        raise RewardError(
            f"reward file {path}: {FUNCTION_NAME} {found}; define "
            f"`def {FUNCTION_NAME}(queries, prompts, labels, **kwargs)` in it"
        )
    _check_positional(func, path)
    return FileRewardFn(path, func)


def _import_file(path: Path) -> Any:
    """Execute the file as a new module with a unique name (registered in sys.modules)."""
    name = f"rlhfkit_reward_file_{path.stem}_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"reward file {path} cannot be imported as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the file look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise RewardError(
            f"reward file {path} failed to import: {type(exc).__name__}: {_first_line(exc)}"
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


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
