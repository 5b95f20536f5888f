"""The configuration of `rlhfkit serve MODEL` (an OpenAI-compatible server of a model)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ServeModelConfig:
    """`rlhfkit serve MODEL`: chat and text completions of a model for any OpenAI client
    (`pip install 'rlhfkit[agents]'`)."""

    model: str | None = None
    """The model: an HF folder (e.g. a run's final/), a hub name or smollm2 (also the first argument)."""
    host: str = "127.0.0.1"
    """Address to bind; only this machine can call it unless you change it."""
    port: int = 8000
    """TCP port to listen on (0: a free one, printed)."""
    api_key: str | None = None
    """The bearer key clients send as api_key; none: a random one, printed at start."""
    dtype: str = "float32"
    """Weights' dtype: float32, bfloat16 or float16."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto (CUDA when available)."""
    max_tokens: int = 512
    """Most new tokens of one reply."""
    max_context: int = 4096
    """Most tokens of a prompt + its reply."""
    max_request_bytes: int | None = None
    """Refuse request bodies larger than this (HTTP 413); none: 1 MiB, 16 MiB for a vision-language model
    (images come base64-encoded in the body)."""
    max_images: int = 8
    """A vision-language model: most distinct images one request may send (HTTP 400 beyond)."""


SERVE_MODEL_RANGES = validate_table({"port": "[0, 65535]", "max_tokens": ">= 1", "max_context": ">= 1",
                                     "max_request_bytes": ">= 1", "max_images": ">= 1"})


def validate_serve_model(cfg: ServeModelConfig) -> None:
    check_ranges(cfg, SERVE_MODEL_RANGES)
    if not cfg.model:
        raise ConfigError("rlhfkit serve needs a model: rlhfkit serve MODEL (an HF folder, a hub name or smollm2)")
    if cfg.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype {cfg.dtype!r}: choose float32, bfloat16 or float16")
