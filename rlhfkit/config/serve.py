"""The configuration of `rlhfkit serve-reward` (flags: --reward.remote_url FILE.py --port N)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ServedReward:
    """What is served."""

    remote_url: str | None = None
    """A Python file defining reward_func(queries, prompts, labels, **kwargs), or builtin:NAME."""
    model_name_or_path: str | None = None
    """A reward model folder (not available yet: rlhfkit has no reward-model loader)."""


@dataclass(frozen=True)
class ServeRewardConfig:
    """`rlhfkit serve-reward`: a reward function over HTTP (`pip install 'rlhfkit[serve]'`)."""

    reward: ServedReward = field(default_factory=ServedReward)
    host: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes the server to the network (set --auth_token then)."""
    port: int = 5000
    """TCP port to listen on."""
    auth_token: str | None = None
    """Require `Authorization: Bearer TOKEN` on every request."""
    max_request_bytes: int = 8 << 20
    """Refuse request bodies larger than this (HTTP 413)."""


SERVE_RANGES = validate_table({"port": "[1, 65535]", "max_request_bytes": ">= 1"})


def validate_serve(cfg: ServeRewardConfig) -> None:
    check_ranges(cfg, SERVE_RANGES)
    if cfg.reward.model_name_or_path is not None:
        raise ConfigError("--reward.model_name_or_path: serving a reward model is not available yet (rlhfkit has "
                          "no reward-model loader); serve a reward file with --reward.remote_url FILE.py")
    if cfg.reward.remote_url is None:
        raise ConfigError("serve-reward needs --reward.remote_url FILE.py (a reward_func)")
