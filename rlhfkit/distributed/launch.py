"""Ray start-up and actor placement: a local cluster (or an existing one), the rollout workers and
the trainer actor (under FSDP, --fsdp.num_ranks trainer actors: distributed/fsdp_ray.py).

Placement: every rollout worker is one actor asking for 1 CPU and `num_gpus` GPUs; each trainer
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
from rlhfkit.models.host import apply_host_settings


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
               per_worker: int = 1, trainers: int = 1) -> tuple[float, float]:
    """(GPUs of each trainer actor, GPUs of each rollout worker actor): the given values, and for an
    unset one an equal share of the `gpus` present among the `trainers` trainer actors (FSDP's ranks) and
    the `num_workers` workers, at most 1 each (rounded down to Ray's 1e-4 resource precision, so the shares
    fit on the GPUs); a worker that runs on `per_worker` GPUs (a vLLM engine's tensor parallelism) counts
    `per_worker` times and gets that many shares. ConfigError where such a worker would get more than one
    GPU but not a whole number of them (Ray gives more than one GPU only in whole GPUs), and where several
    trainer actors would get parts of GPUs (nccl takes one GPU per rank: two ranks could land on one)."""
    share = math.floor(min(1.0, gpus / (num_workers * per_worker + trainers)) * 10_000) / 10_000
    if worker is None and 1 < share * per_worker != int(share * per_worker):
        raise ConfigError(f"a rollout worker with --vllm.tensor_parallel_size {per_worker} needs {per_worker} whole "
                          f"GPUs, and {gpus} GPUs for {num_workers} workers and the trainer give it "
                          f"{share * per_worker:g}: add GPUs, lower --rollout.num_workers or set "
                          "--distributed.num_gpus_per_worker")
    trainer = share if trainer is None else trainer
    if trainers > 1 and 0 < trainer < 1:
        raise ConfigError(f"--fsdp.num_ranks {trainers} trainer actors need a whole GPU each (nccl: one GPU per "
                          f"rank), and they would get {trainer:g}: add GPUs, lower --rollout.num_workers or set "
                          "--distributed.num_gpus_trainer 1 and --distributed.num_gpus_per_worker")
    return trainer, (share * per_worker if worker is None else worker)


def check_gpu_asks(asks: list[tuple[int, float, str]], gpus: int) -> None:
    """Refuse GPU asks that this machine's `gpus` (a local cluster's) cannot all hold at once: Ray would
    keep the actors pending forever. `asks`: (how many actors, GPUs each, what they are, as the message
    names them); whole asks take whole GPUs, and fractions are packed as Ray places them, each inside one
    GPU (first fit, largest first)."""
    sizes = sorted((each for count, each, _ in asks for _ in range(count)), reverse=True)
    whole = sum(int(a) for a in sizes if a >= 1)
    free: list[float] = []  # the room left on each GPU that holds fractions
    for a in (a for a in sizes if 0 < a < 1):
        slot = next((i for i, room in enumerate(free) if room >= a - 1e-9), None)
        if slot is None:
            free.append(1.0 - a)
        else:
            free[slot] -= a
    if whole + len(free) > gpus:
        who = " and ".join(f"{count} {what} asking {each:g} GPU each" for count, each, what in asks if count)
        raise ConfigError(f"{who} need {whole + len(free)} GPU(s), and this machine has {gpus}: Ray would wait for "
                          "them forever; ask for fewer, or leave the asks unset (the GPUs present are then shared)")


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
                   load_in_4bit: bool = False, vllm: dict | None = None,
                   keep_freed: bool = False) -> Callable[[int], object]:
    """slot -> a new RolloutWorker actor (1 CPU, `num_gpus` GPUs, one torch thread).
    `delays`: test-only slow-worker hook, slot -> seconds each weight update is held back;
    `partial_tokens`: partial rollouts; `lora`: the policy's LoRA settings; `record_experts`: routing
    replay; `frozen_tower`: a vision-language policy's frozen tower; `load_in_4bit`: QLoRA's 4-bit
    base; `vllm`: a vLLM engine's settings; `keep_freed`: --train.keep_freed_memory (see RolloutWorker)."""
    cls = ray.remote(concurrency_groups=WORKER_GROUPS)(RolloutWorker)

    def make(slot: int):
        return cls.options(num_cpus=1, num_gpus=num_gpus).remote(
            model_path, gguf_file, dtype, autocast, max_batch_size, delay_s=(delays or {}).get(slot, 0.0),
            partial_tokens=partial_tokens, lora=lora, record_experts=record_experts, frozen_tower=frozen_tower,
            load_in_4bit=load_in_4bit, vllm=vllm, keep_freed=keep_freed)

    return make


class TrainerHost:
    """A trainer actor: runs the single-process training function, unchanged, inside Ray (under FSDP,
    one rank's part of it)."""

    def __init__(self, num_threads: int | None, keep_freed: bool = False):
        apply_host_settings(num_threads, keep_freed)  # --train.num_threads, --train.keep_freed_memory

    def run(self, fn: Callable, *args):
        return fn(*args)

    def address(self) -> tuple[str, int]:
        """Where this actor, as rank 0, would take the trainer actors' process group (fsdp_ray.free_address)."""
        from rlhfkit.distributed.fsdp_ray import free_address

        return free_address()


def run_in_trainer_actors(fn: Callable, args: tuple, num_threads: int | None, num_gpus: float = 0.0,
                          ranks: int = 1, keep_freed: bool = False):
    """`fn(*args)` inside one trainer actor, or with `ranks` > 1 `fn(*args, rank, ranks, address)` in each of
    `ranks` actors (`address`: rank 0's (host, port) for their process group, fsdp_ray.init_group); rank 0's
    result. The first exception of any rank (e.g. a ConfigError) is re-raised here as itself and every
    actor is killed (the others would wait for it in a collective). `num_threads`, `keep_freed`: each actor's
    models.host.apply_host_settings."""
    hosts = [ray.remote(TrainerHost).options(num_cpus=1, num_gpus=num_gpus).remote(num_threads, keep_freed)
             for _ in range(ranks)]
    try:
        if ranks == 1:
            refs = [hosts[0].run.remote(fn, *args)]
        else:
            address = ray.get(hosts[0].address.remote())
            refs = [h.run.remote(fn, *args, rank, ranks, address) for rank, h in enumerate(hosts)]
        pending = list(refs)
        while pending:  # fail fast: the first rank to fail ends the run
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done[0])
        return ray.get(refs[0])
    except ray.exceptions.RayTaskError as exc:
        if exc.cause is not None:
            raise exc.cause from None
        raise
    finally:
        for host in hosts:
            ray.kill(host)
