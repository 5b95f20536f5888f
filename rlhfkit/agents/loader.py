"""Load a user's agent file (`--agent.func_path FILE`, OpenRLHF's `--agent_func_path`).

The file defines `AgentInstance` (an `AgentInstanceBase` subclass) and, optionally,
`AgentExecutor` (a `MultiTurnAgentExecutor` subclass built with no arguments, as in OpenRLHF).
A file written for OpenRLHF works after changing its import line to

    from rlhfkit.agents import AgentInstanceBase, MultiTurnAgentExecutor
"""

from __future__ import annotations

import inspect
from pathlib import Path

from rlhfkit.agents.base import AgentInstanceBase
from rlhfkit.agents.executor import MultiTurnExecutor
from rlhfkit.errors import RewardError
from rlhfkit.rewards.loader import import_python_file


def load_agent_file(path: str | Path) -> MultiTurnExecutor:
    """The file's `AgentExecutor()`, else a `MultiTurnExecutor` over its `AgentInstance`.

    Raises:
      RewardError: the file is missing or fails to import, defines neither class, or a class
        does not derive from the base it must (the message names the file and the class).
    """
    path = Path(path)
    if not path.is_file():
        raise RewardError(f"agent file {path} does not exist; check --agent.func_path")
    module = import_python_file(path, "agent file")
    executor_cls = getattr(module, "AgentExecutor", None)
    if executor_cls is not None:
        if not (inspect.isclass(executor_cls) and issubclass(executor_cls, MultiTurnExecutor)):
            raise RewardError(f"agent file {path}: AgentExecutor must subclass "
                              "rlhfkit.agents.MultiTurnAgentExecutor")
        try:
            executor = executor_cls()
        except TypeError as exc:
            raise RewardError(f"agent file {path}: AgentExecutor() failed ({exc}); its __init__ must take "
                              "no arguments and call super().__init__(AgentInstance)") from exc
        executor.source = str(path)
        return executor
    instance_cls = getattr(module, "AgentInstance", None)
    if not (inspect.isclass(instance_cls) and issubclass(instance_cls, AgentInstanceBase)):
        raise RewardError(f"agent file {path} defines no AgentInstance subclass of "
                          "rlhfkit.agents.AgentInstanceBase (and no AgentExecutor); define one")
    return MultiTurnExecutor(instance_cls, source=str(path))
