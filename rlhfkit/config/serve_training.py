"""The configuration of `rlhfkit serve-training` (the Tinker API: --model NAME_OR_PATH [--lora.rank R | --full])."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.checks import check_gpu_ask
from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ServedLora:
    """LoRA adapters (one per training client, all on the one base model)."""

    rank: int = 32
    """The rank of a client's adapter when its create request gives none (the SDK always gives one)."""


@dataclass(frozen=True)
class ServedDistributed:
    """Where the models live: in the server's process, or in a Ray actor on a cluster node."""

    backend: str = "local"
    """local (the models in the server's process) or ray (base model, adapters, optimizer states and
    samplers in one Ray actor, on a node with a GPU when the cluster has one; the HTTP server stays
    in this process)."""
    address: str | None = None
    """Ray cluster to join (e.g. HEAD_IP:6379 from `ray start --head`); none = start a local one."""
    num_cpus: int | None = None
    """Logical CPUs of a local Ray cluster; none = 1 (the host actor's)."""
    num_gpus: float | None = None
    """GPUs the host actor asks Ray for; none = 1 when the cluster has a GPU, else 0."""
    num_threads: int | None = None
    """torch threads of the host actor (Ray gives an actor one by default); none = the node's CPU count."""


@dataclass(frozen=True)
class ServeTrainingConfig:
    """`rlhfkit serve-training`: Tinker's training API for the official `tinker` SDK
    (`pip install 'rlhfkit[tinker]'`)."""

    model: str = "smollm2"
    """The base model: an HF folder, a hub name (org/name) or smollm2. Clients name it as base_model."""
    full: bool = False
    """Full fine-tuning: each training client trains its own copy of every weight (no LoRA)."""
    lora: ServedLora = field(default_factory=ServedLora)
    distributed: ServedDistributed = field(default_factory=ServedDistributed)
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
    max_batch_tokens: int = 4096
    """Most padded tokens (rows x longest row) in one forward of forward / forward_backward: the data of
    the requests run together (several clients' included) are cut into forwards of at most this many;
    a longer datum runs alone."""


SERVE_TRAINING_RANGES = validate_table({"port": "[1, 65535]", "max_request_bytes": ">= 1", "lora.rank": ">= 1",
                                        "max_batch_tokens": ">= 1",
                                        "distributed.num_cpus": ">= 1", "distributed.num_gpus": ">= 0",
                                        "distributed.num_threads": ">= 1"})


def validate_serve_training(cfg: ServeTrainingConfig) -> None:
    check_ranges(cfg, SERVE_TRAINING_RANGES)
    if cfg.distributed.backend not in ("local", "ray"):
        raise ConfigError(f"--distributed.backend {cfg.distributed.backend}: use local or ray")
    if cfg.distributed.backend == "local" and cfg.distributed.address is not None:
        raise ConfigError("--distributed.address joins a Ray cluster: add --distributed.backend ray")
    check_gpu_ask("--distributed.num_gpus", cfg.distributed.num_gpus)
    if cfg.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"--dtype {cfg.dtype}: use float32 or bfloat16")
    if cfg.api_key is not None and not cfg.api_key.startswith("tml-"):
        raise ConfigError("--api_key: the tinker SDK only sends keys that start with tml-; use e.g. tml-mykey")
