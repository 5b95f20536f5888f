"""models.host: --train.keep_freed_memory keeps freed blocks for reuse (glibc), --train.num_threads."""

from __future__ import annotations

import ctypes
import multiprocessing
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.models import host

BLOCK = 64 << 20  # bytes: above glibc's largest mmap threshold (32 MiB), so mmap-served by default

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _heap() -> tuple[int, int]:
    with open("/proc/self/maps") as f:
        line = next(line for line in f if line.rstrip().endswith("[heap]"))
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    return lo, hi


def _block_after_free() -> tuple[bool, int]:
    """malloc, touch and free a 64 MiB block: whether it came from the heap (not its own mmap) and how
    many of its bytes the process handed back when it was freed."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    p = libc.malloc(BLOCK)
    ctypes.memset(p, 1, BLOCK)
    lo, hi = _heap()
    held = _rss_kib()
    libc.free(p)
    return lo <= p < hi, (held - _rss_kib()) * 1024


def _in_fork(conn) -> None:
    host.keep_freed_memory()  # mallopt is process-wide: in a child, not in this pytest worker
    conn.send(_block_after_free())
    conn.close()


@glibc
def test_freed_block_stays_with_the_process():
    ctx = multiprocessing.get_context("fork")  # the child runs no torch op (no OpenMP after fork)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_in_fork, args=(child,))
    proc.start()
    in_heap, released = parent.recv()
    proc.join(timeout=30)
    assert in_heap  # served from the heap, not a fresh mmap
    assert released < BLOCK // 8  # freeing it kept its pages: the next block reuses them without faults


@glibc
def test_by_default_glibc_hands_a_large_block_back():
    """What the setting changes, in a fresh interpreter (a forked pytest worker may hold free heap blocks)."""
    code = "from tests.unit.models.test_host import _block_after_free; print(*_block_after_free())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[3]).stdout.split()
    assert out[0] == "False"  # its own mmap
    assert int(out[1]) > BLOCK * 7 // 8


def test_apply_host_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "keep_freed_memory", lambda: calls.append(True))
    threads = torch.get_num_threads()
    try:
        host.apply_host_settings(1, keep_freed=False)
        assert torch.get_num_threads() == 1 and calls == []
        host.apply_host_settings(None, keep_freed=True)
        assert torch.get_num_threads() == 1 and calls == [True]  # None leaves the threads as they are
    finally:
        torch.set_num_threads(threads)


def test_not_glibc_changes_nothing(monkeypatch):
    monkeypatch.setattr(host, "_libc", lambda: None)
    assert host.keep_freed_memory() is False


def test_trainers_apply_the_flag(monkeypatch, tmp_path, tiny_folder):
    """`train rl`'s and the supervised trainers' configs reach apply_host_settings."""
    import rlhfkit
    from rlhfkit.api import rl as api_rl
    from rlhfkit.api import supervised as api_sup

    seen = []
    monkeypatch.setattr(api_rl, "apply_host_settings", lambda n, keep: seen.append(("rl", n, keep)))
    monkeypatch.setattr(api_sup, "apply_host_settings", lambda n, keep: seen.append(("sft", n, keep)))
    assert rlhfkit.RLConfig.from_args([]).train.keep_freed_memory is True
    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", str(tiny_folder), "--train.keep_freed_memory",
                                      "false", "--train.num_threads", "1", "--ckpt.output_dir", str(tmp_path / "rl")])
    rlhfkit.RLTrainer.from_config(cfg, reward_fn=lambda **kw: [0.0], train_dataset=[{"input": "a"}] * 16)
    sft = rlhfkit.SFTConfig.from_args(["--model.model_name_or_path", str(tiny_folder), "--ckpt.output_dir",
                                       str(tmp_path / "sft")])
    rlhfkit.SFTTrainer.from_config(sft, train_dataset=[{"input": "a", "output": "b"}] * 32)
    assert seen == [("rl", 1, False), ("sft", None, True)]


def test_ray_workers_and_trainer_actors_apply_it(monkeypatch, tiny_folder):
    """The Ray actors' constructors (run in their own processes) take the flag to apply_host_settings."""
    from rlhfkit.distributed import launch, worker

    seen = []
    monkeypatch.setattr(worker, "apply_host_settings", lambda n, keep: seen.append(("rollout", n, keep)))
    monkeypatch.setattr(launch, "apply_host_settings", lambda n, keep: seen.append(("trainer", n, keep)))
    worker.RolloutWorker(str(tiny_folder), None, "float32", None, None, keep_freed=True)
    launch.TrainerHost(2, keep_freed=True)
    launch.TrainerHost(None)
    assert seen == [("rollout", 1, True), ("trainer", 2, True), ("trainer", None, False)]
