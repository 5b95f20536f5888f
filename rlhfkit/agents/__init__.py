"""Agents: the AgentInstance contract (OpenRLHF's names), single- and multi-turn executors, environments.
May import core, rollout, rewards and data (docs/architecture.md)."""

from rlhfkit.agents.base import AgentInstanceBase, StepResult, check_step_result
from rlhfkit.agents.engine_adapter import EngineAdapter, VLLMSamplingParams
from rlhfkit.agents.execute import AgentExecutorBase, ExecuteRunner, ResultQueue
from rlhfkit.agents.executor import (
    MultiTurnExecutor,
    SingleTurnExecutor,
    TokenBudget,
    agent_rewards,
    drift_count,
)
from rlhfkit.agents.loader import load_agent_file

# OpenRLHF's names for the same classes.
MultiTurnAgentExecutor = MultiTurnExecutor
SingleTurnAgentExecutor = SingleTurnExecutor

__all__ = [
    "AgentExecutorBase",
    "AgentInstanceBase",
    "EngineAdapter",
    "ExecuteRunner",
    "MultiTurnAgentExecutor",
    "MultiTurnExecutor",
    "ResultQueue",
    "SingleTurnAgentExecutor",
    "SingleTurnExecutor",
    "StepResult",
    "TokenBudget",
    "VLLMSamplingParams",
    "agent_rewards",
    "check_step_result",
    "drift_count",
    "load_agent_file",
]
