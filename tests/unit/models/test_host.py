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


# ---------------------------------------------------------------- parameters out of file mappings

linux = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")


def _mapped(t: torch.Tensor) -> bool:
    return host.in_ranges(t.untyped_storage().data_ptr(), host.file_mapped_ranges())


@pytest.fixture
def loaded(tmp_path):
    """A tiny tied Llama saved as safetensors and loaded back on the CPU in its stored dtype: transformers
    hands out views of the mapped file (checked: the premise of own_memory)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.tiny import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer(tie_embeddings=True)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert all(_mapped(p) for p in loaded.parameters())
    return model, loaded


def test_in_ranges_by_hand():
    ranges = [(10, 20), (30, 40)]
    assert [host.in_ranges(a, ranges) for a in (9, 10, 19, 20, 29, 30, 39, 40)] == [
        False, True, True, False, False, True, True, False]
    assert not host.in_ranges(5, [])


@linux
def test_own_memory_copies_mapped_parameters_and_keeps_their_values_and_ties(loaded):
    model, loaded = loaded
    params = list(loaded.parameters())
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # tied: one parameter
    assert host.own_memory(params) == len(params)
    assert not any(_mapped(p) for p in params)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    for (name, p), q in zip(loaded.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert host.own_memory(params) == 0  # nothing left to copy


@linux
def test_own_memory_keeps_views_of_one_storage_together(tmp_path):
    path = tmp_path / "flat.bin"
    torch.arange(12, dtype=torch.float32).numpy().tofile(path)
    flat = torch.from_file(str(path), shared=False, size=12)  # a private mapping of the file
    a, b = torch.nn.Parameter(flat[:4].view(2, 2)), torch.nn.Parameter(flat[2:])  # overlapping views
    assert _mapped(a) and _mapped(b)
    assert host.own_memory([a, b]) == 1
    assert not _mapped(a) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert torch.equal(a, torch.tensor([[0.0, 1.0], [2.0, 3.0]])) and torch.equal(b, torch.arange(2.0, 12.0))
    with torch.no_grad():
        b[0] = 100.0  # element 2 of the one storage: a sees it, the file does not
    assert a[1, 0].item() == 100.0
    assert torch.from_file(str(path), shared=False, size=12)[2].item() == 2.0


def test_own_memory_leaves_anonymous_memory_alone():
    p = torch.nn.Parameter(torch.ones(3))
    ptr = p.data_ptr()
    assert host.own_memory([p]) == 0 and p.data_ptr() == ptr


@linux
def test_own_memory_leaves_a_shared_mapping_shared(tmp_path):
    """A shared mapping (torch's share_memory_, a file mapped shared) is written through on purpose: kept."""
    path = tmp_path / "shared.bin"
    torch.zeros(4).numpy().tofile(path)
    p = torch.nn.Parameter(torch.from_file(str(path), shared=True, size=4))
    shm = torch.nn.Parameter(torch.ones(4).share_memory_())
    ptrs = [p.data_ptr(), shm.data_ptr()]
    assert host.own_memory([p, shm]) == 0 and [p.data_ptr(), shm.data_ptr()] == ptrs


@linux
def test_the_learner_trains_parameters_of_its_own_and_leaves_frozen_ones_mapped(loaded):
    from rlhfkit.trainers.learner import Learner

    _, loaded = loaded
    frozen = loaded.model.norm.weight
    frozen.requires_grad_(False)
    Learner(loaded, lr=1e-3)
    assert not any(_mapped(p) for p in loaded.parameters() if p.requires_grad)
    assert _mapped(frozen)


@linux
def test_the_hf_engine_copies_mapped_weights_before_loading_new_ones(loaded):
    from rlhfkit.models.tiny import tiny_tokenizer
    from rlhfkit.rollout.hf import HFEngine

    model, loaded = loaded
    engine = HFEngine(loaded, tiny_tokenizer())
    state = {k: v + 1 for k, v in model.state_dict().items() if k.endswith("q_proj.weight")}
    engine.update_weights(state, version=1)
    assert not any(_mapped(p) for p in loaded.parameters())
    assert torch.equal(loaded.model.layers[0].self_attn.q_proj.weight, state["model.layers.0.self_attn.q_proj.weight"])
