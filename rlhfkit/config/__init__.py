"""Typed configs (a frozen dataclass per section), YAML + dotted flags, OpenRLHF aliases, validation.
May import nothing else from rlhfkit but errors (docs/architecture.md)."""

from rlhfkit.config.parse import parse_config, to_dict
from rlhfkit.config.rl import RL_ALIASES, BatchPlan, RLConfig, validate

__all__ = ["RLConfig", "RL_ALIASES", "BatchPlan", "parse_config", "to_dict", "validate"]
