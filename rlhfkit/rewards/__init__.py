"""Reward functions: the contract, Python callables and reward files in OpenRLHF's or TRL's
contract, built-in verifiers."""

from rlhfkit.rewards.base import RewardFn, RewardOutput, normalize_reward_output
from rlhfkit.rewards.callables import CallableRewardFn, batched, grouped
from rlhfkit.rewards.loader import FileRewardFn, load_reward_file
from rlhfkit.rewards.math import (
    extract_answer,
    extract_first_integer,
    lenient_correct,
    math_exact_reward,
)

__all__ = [
    "CallableRewardFn",
    "FileRewardFn",
    "RewardFn",
    "RewardOutput",
    "batched",
    "extract_answer",
    "extract_first_integer",
    "grouped",
    "lenient_correct",
    "load_reward_file",
    "math_exact_reward",
    "normalize_reward_output",
]
