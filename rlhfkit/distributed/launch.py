"""Ray start-up and actor placement: a local cluster (or an existing one), the rollout workers and
the trainer actor.

Placement: every rollout worker is one actor asking for 1 CPU and `num_gpus` GPUs; the trainer
actor asks for 1 CPU and its own GPUs. Ray places them on any node of the cluster with free
resources (a local cluster: this machine; `ray start` on several machines: spread by Ray). Ray shows
an actor only the GPUs it asked for, so unset GPU counts default to the GPUs present (`gpu_shares`):
an actor asking for none would train or decode on the CPU of a GPU machine. A vLLM engine actor
counts as `--vllm.tensor_parallel_size` GPUs (vLLM runs its tensor-parallel ranks on the GPUs Ray
shows the actor).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import ray
import torch

from rlhfkit.distributed.worker import WORKER_GROUPS, RolloutWorker
from rlhfkit.errors import ConfigError


def start_ray(address: str | None, num_cpus: int, temp_dir: Path) -> bool:
    """Join the cluster at `address`, or start a local one (`num_cpus` logical CPUs, no dashboard,
    files under `temp_dir`). Returns True when this call started Ray (the caller shuts it down);
    False when Ray was already running in this process (the caller leaves it running)."""
    if ray.is_initialized():
        return False
    if address is not None:
        check_reachable(address)  # ray.init itself retries an unreachable address for minutes
        ray.init(address=address, include_dashboard=False)
        return True
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster: no token to set up
    ray.init(num_cpus=num_cpus, _temp_dir=ray_temp_dir(temp_dir), include_dashboard=False)
    return True


# Ray puts its sockets at TEMP/session_<date>_<time>_<pid>/sockets/plasma_store (up to 64 characters
# after TEMP), and a Unix socket path may hold at most 107 bytes.
MAX_RAY_TEMP_CHARS = 107 - 64


def ray_temp_dir(temp_dir: Path) -> str:
    """`temp_dir` (created), or a short folder under the system's temp dir when Ray's socket paths
    under it would pass the Unix limit (said in one line)."""
    path = temp_dir.resolve()
    if len(str(path)) <= MAX_RAY_TEMP_CHARS:
        path.mkdir(parents=True, exist_ok=True)
        return str(path)
    short = tempfile.mkdtemp(prefix="rlhfkit-ray-")
    logging.getLogger("rlhfkit").warning("Ray's files go to %s (%s is too long a path for Ray's sockets)", short, path)
    return short


def cluster_gpus(address: str | None) -> int:
    """The GPUs the actors can share: this machine's for a local cluster, the cluster's (as Ray reports
    them, after `start_ray`) for one at `address`."""
    if address is None:
        return torch.cuda.device_count()
    return int(ray.cluster_resources().get("GPU", 0))


def gpu_shares(trainer: float | None, worker: float | None, num_workers: int, gpus: int,
               per_worker: int = 1) -> tuple[float, float]:
    """(GPUs of the trainer actor, GPUs of each rollout worker actor): the given values, and for an
    unset one an equal share of the `gpus` present among the trainer and the `num_workers` workers, at
    most 1 each (rounded down to Ray's 1e-4 resource precision, so the shares fit on the GPUs); a worker
    that runs on `per_worker` GPUs (a vLLM engine's tensor parallelism) counts `per_worker` times and
    gets that many shares. ConfigError where such a worker would get more than one GPU but not a whole
    number of them (Ray gives more than one GPU only in whole GPUs)."""
    share = math.floor(min(1.0, gpus / (num_workers * per_worker + 1)) * 10_000) / 10_000
    if worker is None and 1 < share * per_worker != int(share * per_worker):
        raise ConfigError(f"a rollout worker with --vllm.tensor_parallel_size {per_worker} needs {per_worker} whole "
                          f"GPUs, and {gpus} GPUs for {num_workers} workers and the trainer give it "
                          f"{share * per_worker:g}: add GPUs, lower --rollout.num_workers or set "
                          "--distributed.num_gpus_per_worker")
    return (share if trainer is None else trainer), (share * per_worker if worker is None else worker)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse an address (HOST:PORT of a Ray head) that accepts no TCP connection. `auto` passes."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--distributed.address {address}: no Ray cluster answers there ({type(exc).__name__}: "
                          f"{exc}); start one with `ray start --head` and pass the HOST:PORT it prints") from exc


def worker_factory(model_path: str, gguf_file: str | None, dtype: str, autocast: str | None,
                   max_batch_size: int | None, num_gpus: float = 0.0,
                   delays: dict[int, float] | None = None, partial_tokens: int = 0,
                   lora: tuple | None = None, record_experts: bool = False, frozen_tower: bool = False,
                   load_in_4bit: bool = False, vllm: dict | None = None) -> Callable[[int], object]:
    """slot -> a new RolloutWorker actor (1 CPU, `num_gpus` GPUs, one torch thread).
    `delays`: test-only slow-worker hook, slot -> seconds each weight update is held back;
    `partial_tokens`: partial rollouts; `lora`: the policy's LoRA settings; `record_experts`: routing
    replay; `frozen_tower`: a vision-language policy's frozen tower; `load_in_4bit`: QLoRA's 4-bit
    base; `vllm`: a vLLM engine's settings (see RolloutWorker)."""
    cls = ray.remote(concurrency_groups=WORKER_GROUPS)(RolloutWorker)

    def make(slot: int):
        return cls.options(num_cpus=1, num_gpus=num_gpus).remote(
            model_path, gguf_file, dtype, autocast, max_batch_size, delay_s=(delays or {}).get(slot, 0.0),
            partial_tokens=partial_tokens, lora=lora, record_experts=record_experts, frozen_tower=frozen_tower,
            load_in_4bit=load_in_4bit, vllm=vllm)

    return make


class TrainerHost:
    """The trainer actor: runs the single-process training function, unchanged, inside Ray."""

    def __init__(self, num_threads: int | None):
        if num_threads:
            torch.set_num_threads(num_threads)

    def run(self, fn: Callable, *args):
        return fn(*args)


def run_in_trainer_actor(fn: Callable, args: tuple, num_threads: int | None, num_gpus: float = 0.0):
    """`fn(*args)` inside a trainer actor; its exception (e.g. a ConfigError) is re-raised here as itself."""
    host = ray.remote(TrainerHost).options(num_cpus=1, num_gpus=num_gpus).remote(num_threads)
    try:
        return ray.get(host.run.remote(fn, *args))
    except ray.exceptions.RayTaskError as exc:
        if exc.cause is not None:
            raise exc.cause from None
        raise
    finally:
        ray.kill(host)
