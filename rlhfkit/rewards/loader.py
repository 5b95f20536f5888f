"""Load a reward function from a Python file (`--reward.remote_url reward.py`).

The file defines `reward_func` in OpenRLHF's contract, `reward_func(queries, prompts, labels,
**kwargs)`, or in TRL's, `reward_func(completions, **kwargs)` (see `rlhfkit.rewards.callables`
for both); a file without `reward_func` may define verl's `compute_score(data_source, solution_str,
ground_truth, extra_info=None)` instead (`rlhfkit.rewards.verl`). `FILE.py:NAME` names the function
(verl's `custom_reward_function.name`), of any of the three contracts. `load_reward_file` imports it under a
fresh module name and wraps it in the `CallableRewardFn` that callables passed from Python also get: the
same keyword arguments
(dataset columns included), `async def` support, `batched(K)` / `grouped` (importable from here
or from `rlhfkit.rewards.callables`), result checks, and a `RewardError` naming the file when it
raises. Its name in the logs of a list of reward functions is the file's stem.

The file's folder is not added to `sys.path`; a reward file that imports a sibling module must
make that import work itself.

Example reward file:

    def reward_func(queries, prompts, labels):
        return [1.0 if q.strip().endswith(str(l)) else 0.0 for q, l in zip(queries, labels)]
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import uuid
from pathlib import Path
from typing import Any

from rlhfkit.errors import RewardError, first_line
from rlhfkit.rewards.callables import CallableRewardFn, batched, grouped

__all__ = ["FUNCTION_NAME", "FileRewardFn", "batched", "grouped", "import_python_file",
           "load_reward_file", "split_function"]

FUNCTION_NAME = "reward_func"
VERL_FUNCTION_NAME = "compute_score"  # read when the file has no reward_func
FileRewardFn = CallableRewardFn  # the name before callables shared the wrapper


def split_function(spec: str) -> tuple[str, str | None]:
    """(file, function) of `FILE.py:NAME` (verl's custom_reward_function.path and .name in one); (spec,
    None) for a spec without a function name or naming an existing file.

    >>> split_function("rewards.py:gsm8k_score"), split_function("rewards.py")
    (('rewards.py', 'gsm8k_score'), ('rewards.py', None))
    """
    file, sep, name = spec.rpartition(":")
    if not sep or not file.endswith(".py") or not name.isidentifier() or Path(spec).exists():
        return spec, None
    return file, name


def load_reward_file(path: str | Path, function: str | None = None) -> CallableRewardFn:
    """Import `path` and return its `reward_func` (or `function`, when named) wrapped as a `RewardFn`.

    Raises:
      RewardError: the file is missing, fails to import (the exception's first line is shown),
        defines no callable `reward_func` (or `function`), or it fits no contract.
    """
    path = Path(path)
    where = f"{path}:{function}" if function else str(path)
    if not path.is_file():
        raise RewardError(f"reward file {path} does not exist; check --reward.remote_url "
                          "(or reward_fn=)")
    module = import_python_file(path)
    if function is not None:
        func = getattr(module, function, None)
        if not callable(func):
            found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                           and v.__module__ == module.__name__)
            raise RewardError(f"reward file {path} has no function {function!r} (its functions: "
                              f"{', '.join(found) or 'none'}); give FILE.py:NAME of one of them")
        return CallableRewardFn(func, source=where, name=function)
    func = getattr(module, FUNCTION_NAME, None)
    if func is None:  # a verl file: custom_reward_function.name's default
        func = getattr(module, VERL_FUNCTION_NAME, None)
    if func is None or not callable(func):
        found = "is not callable" if func is not None else f"is not defined (nor {VERL_FUNCTION_NAME})"
        raise RewardError(
            f"reward file {path}: {FUNCTION_NAME} {found}; define "
            f"`def {FUNCTION_NAME}(queries, prompts, labels, **kwargs)` (OpenRLHF), "
            f"`def {FUNCTION_NAME}(completions, **kwargs)` (TRL) or `def {VERL_FUNCTION_NAME}(data_source, "
            "solution_str, ground_truth, extra_info=None)` (verl) in it"
        )
    return CallableRewardFn(func, source=str(path), name=path.stem)


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
            f"{what} {path} failed to import: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return module
