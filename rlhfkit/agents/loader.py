"""Load a user's agent file (`--agent.func_path FILE`, OpenRLHF's `--agent_func_path`).

The file defines `AgentInstance` (an `AgentInstanceBase` subclass) and, optionally, an
`AgentExecutor` of one of OpenRLHF's two contracts, told apart by its base class:

- since 2026: a `MultiTurnAgentExecutor` subclass built with no arguments
  (`super().__init__(AgentInstance)`); rlhfkit runs its episodes (executor.py);
- mid-2025: an `AgentExecutorBase` subclass built as `AgentExecutor(max_steps, max_length,
  llm_engine, hf_tokenizer, result_queue)` whose `execute` rlhfkit calls (execute.py).

A 2026 `AgentExecutor` that overrides `execute(prompt, label, sampling_params, max_length,
hf_tokenizer, llm_engine)` has that method called per sample too (execute.py, `instance=`).

A file written for OpenRLHF works after changing its import line to

    from rlhfkit.agents import AgentInstanceBase, MultiTurnAgentExecutor   # or AgentExecutorBase

A file that defines neither but an agent function, `async def agent(client, prompt, label, **row)`,
runs through the OpenAI-compatible endpoint (agents/endpoint/runner.py): `client` is an
`openai.AsyncOpenAI` pointed at the episode's own URL.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from rlhfkit.agents.base import AgentInstanceBase
from rlhfkit.agents.execute import AgentExecutorBase, ExecuteRunner
from rlhfkit.agents.executor import MultiTurnExecutor
from rlhfkit.errors import RewardError
from rlhfkit.rewards.loader import import_python_file

_EXECUTE_ARGS = ("max_steps", "max_length", "llm_engine", "hf_tokenizer", "result_queue")


def load_agent_file(path: str | Path, endpoint: dict | None = None):
    """The file's `AgentExecutor` (an instance, or an `ExecuteRunner` when rlhfkit calls its
    `execute`), else a `MultiTurnExecutor` over its `AgentInstance`, else an `EndpointExecutor`
    over its `agent` function (built with the `endpoint` keyword arguments).

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
        return _executor(executor_cls, path)
    instance_cls = getattr(module, "AgentInstance", None)
    if instance_cls is None and inspect.iscoroutinefunction(getattr(module, "agent", None)):
        from rlhfkit.agents.endpoint.runner import EndpointExecutor  # noqa: PLC0415 - needs the serve extra

        return EndpointExecutor(module.agent, source=str(path), **(endpoint or {}))
    if not (inspect.isclass(instance_cls) and issubclass(instance_cls, AgentInstanceBase)):
        raise RewardError(f"agent file {path} defines no AgentInstance subclass of "
                          "rlhfkit.agents.AgentInstanceBase, no AgentExecutor and no "
                          "`async def agent(client, prompt, label, **row)`; define one")
    return MultiTurnExecutor(instance_cls, source=str(path))


def _executor(executor_cls: Any, path: Path) -> MultiTurnExecutor | ExecuteRunner:
    """The runner of a file's `AgentExecutor`, by the contract it follows (module docstring)."""
    if not (inspect.isclass(executor_cls) and issubclass(executor_cls, (MultiTurnExecutor, AgentExecutorBase))):
        raise RewardError(f"agent file {path}: AgentExecutor must subclass "
                          "rlhfkit.agents.MultiTurnAgentExecutor or rlhfkit.agents.AgentExecutorBase")
    if issubclass(executor_cls, AgentExecutorBase) and not _returns_result(executor_cls):
        try:
            inspect.signature(executor_cls).bind(**{name: None for name in _EXECUTE_ARGS})
        except TypeError as exc:
            raise RewardError(f"agent file {path}: AgentExecutor cannot be built as AgentExecutor(max_steps, "
                              f"max_length, llm_engine, hf_tokenizer, result_queue) ({exc}); give its __init__ "
                              "these parameters, as OpenRLHF's AgentExecutorBase contract does") from exc
        return ExecuteRunner(executor_cls, source=str(path))
    try:
        executor = executor_cls()
    except TypeError as exc:
        raise RewardError(f"agent file {path}: AgentExecutor() failed ({exc}); its __init__ must take "
                          "no arguments and call super().__init__(AgentInstance)") from exc
    if isinstance(executor, MultiTurnExecutor):
        executor.source = str(path)
    if _returns_result(executor_cls):  # its own execute: rlhfkit calls it per sample
        return ExecuteRunner(executor_cls, source=str(path), instance=executor)
    return executor


def _returns_result(executor_cls: type) -> bool:
    """Whether the class has its own `execute(prompt, label, sampling_params, max_length,
    hf_tokenizer, llm_engine)` (OpenRLHF's 2026 signature), which returns the result."""
    execute = getattr(executor_cls, "execute", None)
    if execute is None or execute is MultiTurnExecutor.execute:
        return False
    return "llm_engine" in inspect.signature(execute).parameters
