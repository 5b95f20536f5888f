"""Reward functions: the contract, callables, reward files, verifiers, servers, reward and process reward models.
May import core, data and models (docs/architecture.md)."""

from rlhfkit.rewards.base import RewardFn, RewardOutput, normalize_reward_output
from rlhfkit.rewards.callables import CallableRewardFn, batched, grouped
from rlhfkit.rewards.loader import FileRewardFn, load_reward_file
from rlhfkit.rewards.math import (
    extract_answer,
    extract_first_integer,
    lenient_correct,
    math_exact_reward,
)
from rlhfkit.rewards.resolve import BUILTIN_REWARDS, RewardSum, resolve_reward

__all__ = [
    "BUILTIN_REWARDS",
    "CallableRewardFn",
    "FileRewardFn",
    "RewardFn",
    "RewardOutput",
    "RewardSum",
    "batched",
    "extract_answer",
    "extract_first_integer",
    "grouped",
    "lenient_correct",
    "load_reward_file",
    "math_exact_reward",
    "normalize_reward_output",
    "resolve_reward",
]
