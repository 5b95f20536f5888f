"""Sharded checkpoints under FSDP2 (`torchrun --nproc_per_node 2 ... train rl --fsdp.enable true`, gloo on
the CPU): the ranks are killed with SIGKILL mid-step and mid-checkpoint-write, resumed with
--ckpt.load_enable, and end with the weights, metrics, samples and trainer state of the
uninterrupted run, bit for bit. A checkpoint of 2 ranks resumes under 1 and one of 1 under 2
(resharding), continuing with the same gradient norms."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.trainers.checkpoint import (
    list_checkpoints,
    pack,
    read_state,
    step_dir_name,
)
from tests.integration.test_resume import KILL_AT_FSYNC, finish, rows
from tests.integration.test_resume import flags as single_process_flags

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def ws(tiny_ws):
    records = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)]
    root = tiny_ws("fsdp_resume", records, sevens=True)
    (root / "kill_at_fsync.py").write_text(KILL_AT_FSYNC)
    return root


def flags(ws, out, **over):
    # test_resume's run (24 prompts / 8 per rollout: step 4 crosses an episode boundary; cosine schedule with
    # warmup, the policy's EMA, adaptive KL, reward normalisation, a critic (gae)) under FSDP, sharded.
    return single_process_flags(ws, out, **{"train.max_steps": STEPS, "fsdp.enable": "true", **over})


def launch(argv, nproc=2, script=None, n=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    entry = ["-m", "rlhfkit.cli.main"] if script is None else [str(script), str(n)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           *entry, *argv]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (torchrun starts each rank in its own session)."""
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [k for c in kids for k in (c, *descendants(c))]


def kill_after_lines(proc, path, lines, delay):
    """SIGKILL torchrun and its ranks `delay` seconds after `path` has `lines` lines."""
    while not path.is_file() or len(path.read_text().splitlines()) < lines:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.01)
    time.sleep(delay)
    for pid in [*descendants(proc.pid), proc.pid]:
        os.kill(pid, signal.SIGKILL)
    return finish(proc)


def assert_same_tensors(a: Path, b: Path) -> None:
    x, y = load_file(str(a)), load_file(str(b))
    assert x.keys() == y.keys(), a
    for k in x:
        assert torch.equal(x[k], y[k]), (a, k)


def assert_same_run(ref, out):
    assert_same_tensors(ref / "final" / "model.safetensors", out / "final" / "model.safetensors")
    assert_same_tensors(ref / "ema" / "model.safetensors", out / "ema" / "model.safetensors")
    for rank_dir in (".", "rank1"):
        assert rows(out / rank_dir / "metrics.jsonl") == rows(ref / rank_dir / "metrics.jsonl"), rank_dir
        assert rows(out / rank_dir / "samples.jsonl") == rows(ref / rank_dir / "samples.jsonl"), rank_dir
    last = ref / "checkpoints" / step_dir_name(STEPS)
    files = sorted(p.relative_to(last) for p in last.rglob("*.safetensors"))
    assert len(files) == 4  # 2 ranks' shards (weights, Adam moments, EMA) and 2 ranks' trainer states
    for rel in files:
        assert_same_tensors(last / rel, out / "checkpoints" / step_dir_name(STEPS) / rel)
    for rank in ("rank_00000", "rank_00001"):  # data position, counters, schedule, KL, reward moments, torch RNG
        assert trainer_state(last / rank) == trainer_state(out / "checkpoints" / step_dir_name(STEPS) / rank)


def trainer_state(folder: Path) -> str:
    """A rank's state.json without python's and numpy's global RNG states: the run never draws from them
    (nor seeds them), so each process keeps its own start-up state, as in the single-process checkpoints."""
    state = read_state(folder)
    state["rng"] = {"torch": state["rng"]["torch"].tolist()}
    return json.dumps(pack(state, {}))


@pytest.fixture(scope="module")
def reference(ws, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    rc, log = finish(launch(flags(ws, out)))
    assert rc == 0, log
    assert len(rows(out / "metrics.jsonl")) == STEPS
    # --ckpt.max_num 2 pruned the older ones; `latest` names the newest
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [step_dir_name(STEPS), step_dir_name(STEPS - 1)]
    assert (out / "checkpoints" / "latest").read_text().strip() == step_dir_name(STEPS)
    manifest = json.loads((out / "checkpoints" / step_dir_name(STEPS) / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["step"] == STEPS
    return out


def test_sigkill_mid_step_then_resume_is_bit_exact(ws, reference, tmp_path):
    out = tmp_path / "run"
    argv = flags(ws, out)
    rc, log = kill_after_lines(launch(argv), out / "metrics.jsonl", 2, 0.2)
    assert rc == -signal.SIGKILL, log
    rc, log = finish(launch(argv))
    assert rc == 0, log
    assert "resumed from" in log
    assert_same_run(reference, out)


# Rank 0 makes 14 fsyncs per checkpoint: 6 files (2 shard files, 2 ranks' state.json + state.safetensors:
# 1-6), the manifest (7), shards/, rank_00000/, rank_00001/ and the temp folder (8-11), checkpoints/ after
# the rename (12), the `latest` pointer (13), checkpoints/ again (14). Each run resumes from the newest
# intact checkpoint, so its first write is call 1.
KILLS = [
    14 + 3,  # 2nd checkpoint, mid-way through its files
    7,  # manifest written, folders not yet flushed or renamed
    14 + 13,  # 2nd checkpoint renamed into place, `latest` not yet updated
]


@pytest.mark.slow  # 35 s; the one-process kill mid-write stays in the default run (test_resume.py)
def test_sigkill_mid_checkpoint_write_then_resume_is_bit_exact(ws, reference, tmp_path):
    out = tmp_path / "run"
    argv = flags(ws, out)
    for n in KILLS:
        rc, log = finish(launch(argv, script=ws / "kill_at_fsync.py", n=n))
        assert rc != 0, log
        assert list((out / "checkpoints").glob(".tmp.*")) or n == 27  # the torn temp folder is left behind
    rc, log = finish(launch(argv))
    assert rc == 0, log
    assert_same_run(reference, out)
    assert not list((out / "checkpoints").glob(".t*"))  # torn temporary folders were cleaned up


def resume_elsewhere(ref: Path, out: Path) -> None:
    """A copy of run `ref` whose newest checkpoint is gone: it resumes from step STEPS - 1."""
    shutil.copytree(ref, out)
    shutil.rmtree(out / "checkpoints" / step_dir_name(STEPS))


def assert_next_step_matches(ref: Path, out: Path) -> None:
    a, b = rows(ref / "metrics.jsonl")[-1], rows(out / "metrics.jsonl")[-1]
    assert a["reward"] == b["reward"]  # the same rollouts from the resharded weights
    for norm in ("actor/grad_norm", "critic/grad_norm"):
        # measured: actor 1e-7 (2 -> 1), 3e-8 (1 -> 2); critic 0
        assert b[norm] == pytest.approx(a[norm], rel=1e-5), norm
    assert rows(ref / "metrics.jsonl")[:-1] == rows(out / "metrics.jsonl")[:-1]


def test_checkpoint_of_two_ranks_resumes_under_one(ws, reference, tmp_path):
    out = tmp_path / "one"
    resume_elsewhere(reference, out)
    rc, log = finish(launch(flags(ws, out), nproc=1))
    assert rc == 0, log
    assert f"resumed from {out / 'checkpoints' / step_dir_name(STEPS - 1)}" in log
    assert_next_step_matches(reference, out)


def test_checkpoint_of_one_rank_resumes_under_two(ws, tmp_path):
    one = tmp_path / "one"
    rc, log = finish(launch(flags(ws, one), nproc=1))
    assert rc == 0, log
    out = tmp_path / "two"
    resume_elsewhere(one, out)
    rc, log = finish(launch(flags(ws, out), nproc=2))
    assert rc == 0, log
    assert_next_step_matches(one, out)
    # rank 1, absent from the checkpoint, took rank 0's trainer state and logs the same rewards
    assert rows(out / "rank1" / "metrics.jsonl")[-1]["reward"] == rows(out / "metrics.jsonl")[-1]["reward"]


def test_a_sharded_checkpoint_of_two_ranks_exports_to_a_model_folder(reference, tmp_path):
    """`rlhfkit export` reads both ranks' shards in one process: the folder has the trained policy's
    logits (final/ holds the same weights as the step-STEPS checkpoint)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.cli.main import main

    assert main(["export", str(reference / "checkpoints" / step_dir_name(STEPS)), str(tmp_path / "out")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    final = AutoModelForCausalLM.from_pretrained(reference / "final").eval()
    ids = torch.tensor([[5, 9, 12, 20, 7, 3]])
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, final(input_ids=ids).logits)
    assert main(["export", str(reference / "checkpoints" / step_dir_name(STEPS - 1)), str(tmp_path / "old")]) == 0
    older = AutoModelForCausalLM.from_pretrained(tmp_path / "old")
    assert not torch.equal(older(input_ids=ids).logits, final(input_ids=ids).logits)  # the step it names


def test_lora_under_fsdp_resumes_bit_exact(ws, tmp_path):
    """LoRA adapters sharded under FSDP (the same run with --ds.lora.rank 4): a resume from the step before
    the last repeats the last step to the bit, in the adapters, their EMA and every logged value."""
    lora_run_resumes_bit_exact(ws, tmp_path, {"ds.lora.rank": 4, "ds.lora.alpha": 8})


def lora_run_resumes_bit_exact(ws, tmp_path: Path, lora: dict) -> Path:
    """The run with the LoRA flags `lora` (in tmp_path/ref) and a copy of it resumed from the step before the
    last: the adapters, their EMA and both ranks' metrics are the uninterrupted run's, bit for bit, and the last
    checkpoint exports to the merged final/ (`assert_export_is_the_merged_final`). Returns the run's folder."""
    ref, out = tmp_path / "ref", tmp_path / "out"
    rc, log = finish(launch(flags(ws, ref, **lora)))
    assert rc == 0, log
    resume_elsewhere(ref, out)
    for folder in ("final", "ema"):
        shutil.rmtree(out / folder)
    rc, log = finish(launch(flags(ws, out, **lora)))
    assert rc == 0, log
    assert f"resumed from {out / 'checkpoints' / step_dir_name(STEPS - 1)}" in log
    for folder in ("final", "ema"):
        assert_same_tensors(ref / folder / "adapter_model.safetensors", out / folder / "adapter_model.safetensors")
    for rank_dir in (".", "rank1"):
        assert rows(out / rank_dir / "metrics.jsonl") == rows(ref / rank_dir / "metrics.jsonl"), rank_dir
    assert_export_is_the_merged_final(ws, ref, tmp_path)
    return ref


def assert_export_is_the_merged_final(ws: Path, ref: Path, tmp_path: Path) -> None:
    """`rlhfkit export` of a LoRA run's last sharded checkpoint (its adapter card beside the shards: the adapters
    read from every rank's shards over the base) writes the weights `rlhfkit lora merge` makes of final/."""
    from rlhfkit.cli.main import main

    exported, merged = tmp_path / "exported", tmp_path / "merged"
    assert main(["export", str(ref / "checkpoints" / step_dir_name(STEPS)), str(exported)]) == 0
    assert main(["lora", "merge", "--lora.adapter", str(ref / "final"), "--ckpt.output_dir", str(merged)]) == 0
    assert_same_tensors(exported / "model.safetensors", merged / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj.weight"
    moved = load_file(str(exported / "model.safetensors"))[q] - load_file(str(ws / "tiny" / "model.safetensors"))[q]
    assert float(moved.abs().max()) > 1e-3  # the trained adapters are in it
