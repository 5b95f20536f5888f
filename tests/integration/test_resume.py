"""Exact resume: a real `rlhfkit train rl` subprocess on the tiny model is killed with SIGKILL
(mid-step at random moments, and mid-checkpoint-write), resumed with --ckpt.load_enable, and must
end with the same weights, metrics and samples as the uninterrupted run, bit for bit (CPU, one
thread)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.trainers.checkpoint import list_checkpoints
from tests.integration.conftest import rl_flags

REPO = Path(__file__).resolve().parents[2]
# Runs the CLI, but SIGKILLs itself at the N-th fsync of a checkpoint write (mid-write); under torchrun
# only rank 0 does (it seals and publishes the checkpoint; test_fsdp_resume).
KILL_AT_FSYNC = '''
import os, signal, sys
import rlhfkit.trainers.checkpoint as ckpt
n, calls, fsync = int(sys.argv[1]), [0], ckpt._fsync
def killing_fsync(path):
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    fsync(path)
if os.environ.get("RANK", "0") == "0":
    ckpt._fsync = killing_fsync
from rlhfkit.cli.main import main
sys.exit(main(sys.argv[2:]))
'''
STEPS = 6
VOLATILE = ("time/", "rollout_tokens_per_s")  # wall-clock metrics differ between any two runs


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)]
    root = tiny_ws("resume", rows, sevens=True)
    (root / "kill_at_fsync.py").write_text(KILL_AT_FSYNC)
    return root


def flags(ws, out, **over):
    # 24 prompts / 8 per rollout = 3 rollouts per episode: 6 steps cross an episode boundary.
    # Exercises: cosine schedule with warmup, EMA, adaptive KL, reward normalisation, critic (gae).
    return ["train", "rl", *rl_flags(ws, out, **{
        "rollout.batch_size": 8, "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 8,
        "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_epochs": 2, "train.max_steps": STEPS,
        "train.num_episodes": 4, "train.num_threads": 1, "actor.adam.lr": 1e-2,
        "actor.lr_scheduler": "cosine_with_min_lr", "actor.lr_warmup_ratio": 0.2, "actor.ema_beta": 0.9,
        "algo.advantage.estimator": "gae", "critic.adam.lr": 1e-2, "algo.kl.init_coef": 0.05,
        "algo.kl.target": 0.1, "algo.kl.horizon": 100, "reward.normalize": "true",
        "logger.log_samples": 2, "ckpt.save_steps": 1, "ckpt.max_num": 2, "ckpt.load_enable": "true", **over})]


def launch(argv, script=None, n=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "rlhfkit.cli.main", *argv] if script is None else \
        [sys.executable, str(script), str(n), *argv]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc):
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def n_lines(path):
    return len(path.read_text().splitlines()) if path.is_file() else 0


def kill_after_lines(proc, path, lines, delay):
    """SIGKILL `proc` `delay` seconds after `path` has `lines` lines (a random moment of a step)."""
    while n_lines(path) < lines:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    return finish(proc)


def rows(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in path.read_text().splitlines()]


def assert_same_run(ref, out):
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert rows(out / "metrics.jsonl") == rows(ref / "metrics.jsonl")
    assert rows(out / "samples.jsonl") == rows(ref / "samples.jsonl")
    ra = load_file(str(ref / "checkpoints" / f"step_{STEPS:08d}" / "state.safetensors"))
    rb = load_file(str(out / "checkpoints" / f"step_{STEPS:08d}" / "state.safetensors"))
    assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra)  # Adam, EMA, RNG states


@pytest.fixture(scope="module")
def reference(ws, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    rc, log = finish(launch(flags(ws, out)))
    assert rc == 0, log
    assert len(rows(out / "metrics.jsonl")) == STEPS
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == [f"step_{STEPS - 1:08d}",
                                                                           f"step_{STEPS:08d}"]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS:08d}"
    return out


def test_sigkill_mid_step_twice_and_corrupt_checkpoint_then_resume_is_bit_exact(ws, reference, tmp_path):
    rng = random.Random(6)
    out = tmp_path / "run"
    argv = flags(ws, out)
    for lines in sorted(rng.sample(range(2, STEPS - 1), 2)):
        rc, log = kill_after_lines(launch(argv), out / "metrics.jsonl", lines, rng.uniform(0.0, 0.3))
        assert rc == -signal.SIGKILL, log
    # bit rot in the newest checkpoint: it is skipped with a message and the one before is used
    newest = list_checkpoints(out / "checkpoints")[0]
    blob = bytearray((newest / "state.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (newest / "state.safetensors").write_bytes(bytes(blob))
    rc, log = finish(launch(argv))
    assert rc == 0, log
    assert f"skipping checkpoint {newest}: state.safetensors does not match its checksum" in log
    assert "resumed from" in log
    assert_same_run(reference, out)


# One checkpoint makes 15 fsyncs here: 9 files (1-9), manifest (10), model/ and the temp folder
# (11-12), checkpoints/ after the rename (13), the `latest` pointer (14), checkpoints/ again (15).
# Each process below resumes from the newest intact checkpoint, so its first write is call 1.
KILLS = [
    17,  # 2nd checkpoint, mid-way through its files
    15 + 14,  # 2nd checkpoint of this process: renamed into place, `latest` not yet updated
    10,  # 1st checkpoint of this process: manifest written, folders not yet flushed or renamed
]


def test_sigkill_mid_checkpoint_write_then_resume_is_bit_exact(ws, reference, tmp_path):
    out = tmp_path / "run"
    argv = flags(ws, out)
    for n in KILLS:
        rc, log = finish(launch(argv, ws / "kill_at_fsync.py", n))
        assert rc == -signal.SIGKILL, log
        assert list((out / "checkpoints").glob(".tmp.*")) or n == 29  # torn temp folder left behind
    rc, log = finish(launch(argv))
    assert rc == 0, log
    assert_same_run(reference, out)
    assert not list((out / "checkpoints").glob(".t*"))  # torn temporary folders were cleaned up


def test_fp16_run_killed_mid_checkpoint_write_resumes_bit_exact(ws, tmp_path):
    """float16 policy (float32 masters, float16 autocast; the float32 critic under the same autocast), both
    with dynamic loss scaling doubling every 2 good steps: killed while writing the 3rd checkpoint, resumed
    from the 2nd, the run ends bit for bit as the uninterrupted one, its logged loss scales included."""
    fp16 = {"actor.dtype": "float16", "actor.autocast": "float16", "train.loss_scale.initial_scale_power": 8,
            "train.loss_scale.window": 2}
    ref, out = tmp_path / "ref", tmp_path / "run"
    rc, log = finish(launch(flags(ws, ref, **fp16)))
    assert rc == 0, log
    scales = [(r["actor/loss_scale"], r["critic/loss_scale"]) for r in rows(ref / "metrics.jsonl")]
    assert len(scales) == STEPS and len(set(scales)) > 1
    rc, log = finish(launch(flags(ws, out, **fp16), ws / "kill_at_fsync.py", 2 * 15 + 4))
    assert rc == -signal.SIGKILL, log
    rc, log = finish(launch(flags(ws, out, **fp16)))
    assert rc == 0, log
    assert_same_run(ref, out)
