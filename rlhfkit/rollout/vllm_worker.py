"""The methods `VLLMEngine` adds to every vLLM worker (vLLM's `worker_extension_cls`), and the
weight formats both sides agree on.

vLLM imports this module by name inside its worker processes and mixes `WeightSyncExtension`
into its Worker class, so `self.model_runner` is the worker's. `LLM.collective_rpc(name, args)`
calls a method here on every worker (each tensor-parallel rank). Imports torch only: it must load
in a process that never imports the rest of rlhfkit.

Three ways weights reach a worker (`VLLMEngine` picks one from where the tensors are):
- tensors: the worker runs in the trainer's process (vLLM's engine core in-process), so the
  policy's tensors are handed over as they are; `load_weights` copies them into vLLM's parameters.
- ipc: the worker is another process on the same GPU; the tensors are copied into a flat uint8
  CUDA buffer of at most `bucket_bytes` (`plan_buckets`, `fill_bucket`), the buffer's CUDA IPC
  handle (`share_cuda_tensor`) is sent, and the worker maps the same GPU memory
  (`open_cuda_tensor`) and loads views into it (`bucket_views`). Peak extra memory: one bucket.
- bytes: raw bytes through CPU memory (`pack_tensors`): CPU tensors, workers on another machine
  or another GPU.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

import torch

BUCKET_ALIGN = 256  # byte offset of every tensor in a bucket (CUDA's allocation alignment)
_STORAGE_DEVICE_ARG = 6  # rebuild_cuda_tensor's `storage_device` in reduce_tensor's argument tuple


def pack_tensors(state) -> list[tuple[str, str, list[int], bytes]]:
    """HF-named tensors -> (name, dtype, shape, raw bytes): plain values that any RPC transport of
    vLLM carries unchanged (its msgpack encoder does not keep tensors nested in lists)."""
    out = []
    for name, t in state.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
    return out


def unpack_tensors(packed) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `pack_tensors`."""
    out = []
    for name, dtype, shape, raw in packed:
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out.append((name, flat.view(getattr(torch, dtype)).reshape(shape)))
    return out


# ------------------------------------------------------------------ buckets (the ipc path)
def tensor_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_buckets(sizes: Sequence[tuple[str, int]], bucket_bytes: int) -> list[list[tuple[str, int]]]:
    """Group named tensor sizes (bytes), in order, into buckets of at most `bucket_bytes`, each
    tensor at an offset aligned to BUCKET_ALIGN: [[(name, offset), ...], ...]. A tensor larger
    than `bucket_bytes` gets a bucket of its own (so the bound is max(bucket_bytes, largest))."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    end = 0
    for name, n in sizes:
        offset = -(-end // BUCKET_ALIGN) * BUCKET_ALIGN
        if current and offset + n > bucket_bytes:
            buckets.append(current)
            current, offset = [], 0
        current.append((name, offset))
        end = offset + n
    if current:
        buckets.append(current)
    return buckets


def fill_bucket(state: Mapping[str, torch.Tensor], bucket: Sequence[tuple[str, int]]
                ) -> tuple[torch.Tensor, list[tuple[str, str, list[int], int]]]:
    """Copy the bucket's tensors into one flat uint8 buffer on their device; returns the buffer
    and (name, dtype, shape, offset) of each tensor in it."""
    last_name, last_offset = bucket[-1]
    size = max(last_offset + tensor_nbytes(state[last_name]), 1)  # >= 1 byte: an empty buffer has no IPC handle
    buf = torch.empty(size, dtype=torch.uint8, device=state[bucket[0][0]].device)
    metas = []
    for name, offset in bucket:
        t = state[name].detach()
        n = tensor_nbytes(t)
        if n:
            buf[offset:offset + n].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        metas.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), offset))
    return buf, metas


def bucket_views(buf: torch.Tensor, metas: Sequence[tuple[str, str, list[int], int]]
                 ) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `fill_bucket`: (name, tensor) views into `buf`, no copy."""
    out = []
    for name, dtype, shape, offset in metas:
        dt = getattr(torch, dtype)
        n = torch.Size(shape).numel() * dt.itemsize
        view = buf[offset:offset + n].view(dt).reshape(shape) if n else torch.empty(shape, dtype=dt, device=buf.device)
        out.append((name, view))
    return out


def share_cuda_tensor(t: torch.Tensor) -> list:
    """The CUDA IPC handle of a flat uint8 CUDA buffer (torch's `reduce_tensor`) as plain values
    (ints, bools, bytes) that vLLM's RPC carries: the arguments of `rebuild_cuda_tensor` less the
    classes, dtype and device, which `open_cuda_tensor` puts back. No pickle on either side."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not t.is_cuda or t.dtype != torch.uint8 or t.dim() != 1:
        raise ValueError(f"share_cuda_tensor takes a 1-d uint8 CUDA tensor, got {t.dtype} "
                         f"{tuple(t.shape)} on {t.device}")
    torch.cuda.current_stream(t.device).synchronize()  # the bucket's copies are done
    _, args = reduce_tensor(t)
    size, stride, offset = args[1:4]
    return [list(size), list(stride), offset, *args[_STORAGE_DEVICE_ARG + 1:]]


def open_cuda_tensor(handle: list, device_index: int) -> torch.Tensor:
    """Map the GPU memory behind `share_cuda_tensor(t)` into this process (no copy). The device
    index is this process's for the same GPU (CUDA_VISIBLE_DEVICES may number it differently)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    size, stride, offset, *rest = handle
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage,
                               torch.uint8, device_index, *rest)


def release_cuda_shares() -> None:
    """Free the trainer-side memory of buckets whose worker-side views are gone."""
    torch.cuda.ipc_collect()


# ------------------------------------------------------------------ where a worker runs
def device_uuid(device: torch.device) -> str | None:
    """The GPU's UUID (the same whatever CUDA_VISIBLE_DEVICES numbers it); None off CUDA."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def process_identity(device: torch.device) -> dict:
    """Where a process and its tensors are: {"pid", "host", "device", "uuid"} (plain values)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "device": str(device), "uuid": device_uuid(device)}


class WeightSyncExtension:
    """Worker-side half of `VLLMEngine.update_weights`."""

    def _rlhfkit_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _rlhfkit_device(self) -> torch.device:
        return next(self._rlhfkit_model().parameters()).device

    def _rlhfkit_load(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors into the running model in place; returns how many.

        On CUDA: the model's own `load_weights` (maps q/k/v and gate/up into fused layers, shards
        them for tensor parallelism, copies into the existing parameters; unquantized weights need
        no kernel-format processing on CUDA), so a state may arrive in several buckets. Elsewhere:
        the worker's `reload_weights` when it has one (vLLM >= 0.2x: it re-runs the kernel-format
        processing, e.g. the CPU backend's repacked linear weights, which `load_weights` cannot
        write into); a whole state then comes in one call."""
        model, device = self._rlhfkit_model(), self._rlhfkit_device()
        if device.type != "cuda" and hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        else:
            model.load_weights(weights=((name, t.to(device)) for name, t in named))
        return len(named)

    def rlhfkit_load_weights(self, packed) -> int:
        """Load tensors sent as raw bytes (`pack_tensors` form)."""
        return self._rlhfkit_load(unpack_tensors(packed))

    def rlhfkit_load_tensors(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load tensors handed over in the same process (vLLM's engine core in-process): the
        trainer's own tensor objects, not copies."""
        return self._rlhfkit_load(list(named))

    def rlhfkit_load_ipc(self, handle: list, metas) -> int:
        """Load one bucket sent as a CUDA IPC handle (`share_cuda_tensor` of a `fill_bucket`
        buffer): views into the trainer's GPU memory, released before returning."""
        buf = open_cuda_tensor(handle, self._rlhfkit_device().index or 0)
        n = self._rlhfkit_load(bucket_views(buf, metas))
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)  # the copies out of the trainer's buffer are done
        del buf
        return n

    def rlhfkit_worker_info(self) -> dict:
        """`process_identity` of this worker and its model's device."""
        return process_identity(self._rlhfkit_device())

    def rlhfkit_weight_checksum(self) -> float:
        """Sum of every parameter (float64), to check in tests that weights arrived."""
        return float(sum(p.detach().double().sum() for p in self._rlhfkit_model().parameters()))
