"""The configuration of `rlhfkit serve-training` (the Tinker API: --model NAME_OR_PATH [--lora.rank R | --full])."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ServedLora:
    """LoRA adapters (one per training client, all on the one base model)."""

    rank: int = 32
    """The rank of a client's adapter when its create request gives none (the SDK always gives one)."""


@dataclass(frozen=True)
class ServeTrainingConfig:
    """`rlhfkit serve-training`: Tinker's training API for the official `tinker` SDK (`pip install 'rlhfkit[tinker]'`)."""

    model: str = "smollm2"
    """The base model: an HF folder, a hub name (org/name) or smollm2. Clients name it as base_model."""
    full: bool = False
    """Full fine-tuning: each training client trains its own copy of every weight (no LoRA)."""
    lora: ServedLora = field(default_factory=ServedLora)
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (CUDA when there is one)."""
    dtype: str = "float32"
    """The base model's parameter dtype: float32 or bfloat16."""
    output_dir: str = "tinker_checkpoints"
    """Where save_state / save_weights_for_sampler write (kept across restarts)."""
    host: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes the server to the network."""
    port: int = 8000
    """TCP port to listen on."""
    api_key: str | None = None
    """The key clients send (their TINKER_API_KEY; starts with tml-); none = a random one, printed at start."""
    max_request_bytes: int = 64 << 20
    """Refuse request bodies larger than this (HTTP 413)."""


SERVE_TRAINING_RANGES = validate_table({"port": "[1, 65535]", "max_request_bytes": ">= 1", "lora.rank": ">= 1"})


def validate_serve_training(cfg: ServeTrainingConfig) -> None:
    check_ranges(cfg, SERVE_TRAINING_RANGES)
    if cfg.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"--dtype {cfg.dtype}: use float32 or bfloat16")
    if cfg.api_key is not None and not cfg.api_key.startswith("tml-"):
        raise ConfigError("--api_key: the tinker SDK only sends keys that start with tml-; use e.g. tml-mykey")
