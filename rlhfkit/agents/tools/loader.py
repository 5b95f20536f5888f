"""Load tools named on the command line: `--agent.tools FILE_OR_MODULE:fn1,fn2`.

    --agent.tools tools.py:multiply,lookup     functions of a Python file
    --agent.tools mypkg.tools:search            functions of an importable module
    --agent.tools tools.py                      every public function defined in the file
    --agent.tools builtin:calculator            rlhfkit's tools (BUILTIN_TOOLS)
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

from rlhfkit.agents.tools.builtin import BUILTIN_TOOLS
from rlhfkit.errors import ConfigError
from rlhfkit.rewards.loader import import_python_file


def load_tools(spec: str) -> list[Callable]:
    """The functions `spec` names (see the module docstring).

    Raises:
      ConfigError: the file or module cannot be found or imported, or lacks a named function
        (the message names it and what it does define).
    """
    if spec in BUILTIN_TOOLS:
        return [BUILTIN_TOOLS[spec]()]
    if spec.startswith("builtin:"):
        raise ConfigError(f"--agent.tools {spec}: no such builtin tool; valid: {', '.join(sorted(BUILTIN_TOOLS))}")
    source, _, names = spec.partition(":") if not _is_windows_drive(spec) else (spec, "", "")
    module = _module(source)
    public = {k: v for k, v in vars(module).items()
              if inspect.isfunction(v) and not k.startswith("_") and v.__module__ == module.__name__}
    if not names:
        if not public:
            raise ConfigError(f"--agent.tools {source} defines no public function; define one or name them "
                              "after a colon (FILE:fn1,fn2)")
        return list(public.values())
    out = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ConfigError(f"--agent.tools {source} has no function {name!r}; it defines "
                              f"{', '.join(sorted(public)) or 'none'}")
        out.append(fn)
    return out


def _is_windows_drive(spec: str) -> bool:
    return len(spec) > 2 and spec[1] == ":" and spec[2] in "\\/"


def _module(source: str):
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"--agent.tools {source} does not exist; give a .py file or a module name")
        return import_python_file(path, "tools file")
    try:
        return importlib.import_module(source)
    except ImportError as exc:
        raise ConfigError(f"--agent.tools {source}: cannot import it ({exc}); give a .py file or an importable "
                          "module") from exc
