"""Process settings of the host (CPU) side: torch's threads, how freed memory is kept, and trained
parameters in memory of their own.

A training step makes and frees the same large tensors every time: autocast's bf16 copies of the
weights, the gradients, the vocabulary-wide logits, the rollout's bf16 copy of the weights. glibc's
malloc serves large blocks (from 128 KiB, a threshold that rises to at most 32 MiB as blocks are
freed) with their own `mmap` and returns them to the kernel when freed, and trims the top of its heap,
so each new one is faulted in again, one zeroed 4 KiB page at a time: on a 2-core CPU, casting a
113 MB float32 matrix to bf16 and adding it into fresh zeros took 92 ms, 25 ms with the pages kept.
`keep_freed_memory` tells malloc to serve every block from its heap and never hand freed memory back
(`mallopt(M_MMAP_MAX, 0)`, `mallopt(M_TRIM_THRESHOLD, -1)`), so the next step reuses the pages
already mapped. The price: the process keeps the memory of its peak until it exits (the peak itself
moved by +0.3% to +2% in the RL benches). glibc only (Linux); elsewhere nothing changes.

`own_memory`: transformers' `from_pretrained` on a CPU maps a safetensors checkpoint into memory
(a private file mapping) and hands out views of it when the stored dtype is the one asked for. An
optimizer writing such a parameter in place copies every 4 KiB page out of the file at its first
step, one fault at a time: SmolLM2-135M's first AdamW step took 1.13 s against 0.20 s with the
parameters copied into anonymous memory first (0.15 s). The learner copies the parameters it trains.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import functools
import logging
import platform
from collections.abc import Iterable

import torch

log = logging.getLogger("rlhfkit")

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
_NEVER_TRIM = -1  # mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"


@functools.cache
def _libc():
    """glibc (its `mallopt`), or None on another C library."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_memory() -> bool:
    """Keep memory freed by this process for its next allocations (module docstring). Returns whether
    it took effect (glibc's `mallopt` accepted both settings)."""
    libc = _libc()
    if libc is None:
        log.debug("keep_freed_memory: not glibc (%s); the allocator keeps its defaults", platform.libc_ver())
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM))


def apply_host_settings(num_threads: int | None, keep_freed: bool) -> None:
    """torch's intra-op threads (None: torch's default, one per core) and, with `keep_freed`,
    `keep_freed_memory` (--train.num_threads, --train.keep_freed_memory)."""
    if num_threads:
        torch.set_num_threads(num_threads)
    if keep_freed:
        keep_freed_memory()


def file_mapped_ranges() -> list[tuple[int, int]]:
    """The [start, end) address ranges of this process privately mapped from files (/proc/self/maps rows
    with an inode and a "p" in their permissions: writes there copy the file's page first; a shared
    mapping is written through, as whoever shares it means), sorted; empty where /proc is not there."""
    try:
        with open("/proc/self/maps") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    ranges = []
    for row in rows:
        if len(row) >= 5 and row[4] != "0" and row[1].endswith("p"):
            start, end = (int(x, 16) for x in row[0].split("-"))
            ranges.append((start, end))
    return sorted(ranges)


def in_ranges(address: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether `address` lies in one of the sorted, disjoint [start, end) `ranges`."""
    k = bisect.bisect_right(ranges, (address, float("inf"))) - 1
    return k >= 0 and ranges[k][0] <= address < ranges[k][1]


def own_memory(params: Iterable[torch.Tensor]) -> int:
    """Give each CPU parameter whose storage a file privately maps (module docstring) a copy of that storage in
    anonymous memory, in place (`.data` swapped: the Parameter objects, their ties and views of one
    storage are kept). Returns how many storages were copied."""
    ranges = file_mapped_ranges()
    if not ranges:
        return 0
    copies: dict[int, torch.UntypedStorage] = {}
    for p in params:
        if type(p.data) is not torch.Tensor or p.device.type != "cpu":
            continue
        storage = p.untyped_storage()
        key = storage.data_ptr()
        if key not in copies:
            if not storage.nbytes() or not in_ranges(key, ranges):
                continue
            copies[key] = storage.clone()
        p.data = torch.empty(0, dtype=p.dtype).set_(copies[key], p.storage_offset(), p.size(), p.stride())
    if copies:
        log.debug("own_memory: %d parameter storages copied out of file mappings", len(copies))
    return len(copies)
