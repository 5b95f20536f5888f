"""Typed configs, YAML + dotted CLI flags, validation and batch arithmetic."""

from rlhfkit.config.parse import parse_config, to_dict
from rlhfkit.config.rl import RL_ALIASES, BatchPlan, RLConfig, validate

__all__ = ["RLConfig", "RL_ALIASES", "BatchPlan", "parse_config", "to_dict", "validate"]
