"""Reward functions: the contract, loaders for reward files, built-in verifiers."""

from rlhfkit.rewards.base import RewardFn, RewardOutput, normalize_reward_output
from rlhfkit.rewards.loader import FileRewardFn, load_reward_file
from rlhfkit.rewards.math import (
    extract_answer,
    extract_first_integer,
    lenient_correct,
    math_exact_reward,
)

__all__ = [
    "FileRewardFn",
    "RewardFn",
    "RewardOutput",
    "extract_answer",
    "extract_first_integer",
    "lenient_correct",
    "load_reward_file",
    "math_exact_reward",
    "normalize_reward_output",
]
