"""Agents: the `AgentInstance` contract, single- and multi-turn executors, example environments.

Names follow OpenRLHF's `openrlhf.utils.agent` so that its agent files need only new imports.
"""

from rlhfkit.agents.base import AgentInstanceBase, StepResult, check_step_result
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
    "AgentInstanceBase",
    "MultiTurnAgentExecutor",
    "MultiTurnExecutor",
    "SingleTurnAgentExecutor",
    "SingleTurnExecutor",
    "StepResult",
    "TokenBudget",
    "agent_rewards",
    "check_step_result",
    "drift_count",
    "load_agent_file",
]
