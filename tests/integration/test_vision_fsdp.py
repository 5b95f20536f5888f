"""FSDP2 on CPU (gloo) with a vision-language policy (a tiny random Qwen2-VL): `torchrun --nproc_per_node 2
... train rl --fsdp.enable true` with a frozen vision tower, a reference model (KL loss), a critic (gae)
and the policy's EMA trains as one process on the same global batch (gradient norms per step, rewards,
weights within the text FSDP test's tolerance), saves the processor beside the weights, and resumes from
its sharded checkpoint to the uninterrupted run's weights, bit for bit."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.api.export import export_checkpoint
from rlhfkit.cli.main import main
from rlhfkit.models.vision import load_processor
from tests.integration.conftest import colour_workspace, vision_rl_flags
from tests.integration.test_fsdp import assert_same_steps, metrics, torchrun_rl

STEPS = 3


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return colour_workspace(tmp_path_factory.mktemp("vision_fsdp"))


def flags(ws, out, **over):
    return vision_rl_flags(ws, out, **{
        "train.micro_batch_size": 2, "train.max_steps": STEPS, "algo.kl.init_coef": 0.01, "algo.kl.use_loss": "true",
        "algo.kl.estimator": "k3", "algo.advantage.estimator": "gae", "critic.adam.lr": "1e-2", "actor.ema_beta": 0.9,
        "actor.freeze_visual_encoder": "true", "ckpt.save_steps": 2, **over})


@pytest.fixture(scope="module")
def runs(ws, tmp_path_factory):
    """The run in one process (`single`) and in 2 FSDP processes (`fsdp`), under one folder."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:  # as test_fsdp: the LM head called as a module in both
        mp.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)
        assert main(["train", "rl", *flags(ws, root / "single")]) == 0
    torchrun_rl(flags(ws, root / "fsdp"))
    return root


def test_two_fsdp_processes_equal_one_process_and_save_the_processor(ws, runs):
    assert_same_steps(runs, ("actor/grad_norm", "critic/grad_norm"))
    init = load_file(ws / "vlm" / "model.safetensors")
    for folder in ("final", "ema"):
        one = load_file(runs / "single" / folder / "model.safetensors")
        two = load_file(runs / "fsdp" / folder / "model.safetensors")
        assert one.keys() == two.keys()
        assert all(torch.equal(init[k], two[k]) for k in init if k.startswith("visual."))  # the frozen tower
        moved = max(float((one[k] - init[k]).abs().max()) for k in one)
        diff = max(float((one[k] - two[k]).abs().max()) for k in one)
        print(f"{folder}: moved {moved:.2e}, FSDP vs one process {diff:.2e}")
        assert moved > 1e-3 and diff < 3e-4, (folder, moved, diff)
        assert type(load_processor(str(runs / "fsdp" / folder))).__name__ == "Qwen2VLProcessor"
    rows = metrics(runs / "fsdp")
    assert all(r["rollout/logprob_gap_max"] < 1e-4 for r in rows if "reward" in r)  # the forward saw the images


def test_resume_from_the_sharded_checkpoint_ends_with_the_uninterrupted_weights(ws, runs, tmp_path):
    """The checkpoint of step 2 (copied without what came after it) resumed under 2 ranks; its export is
    an HF folder with the processor."""
    resumed = tmp_path / "resumed"
    shutil.copytree(runs / "fsdp", resumed, ignore=shutil.ignore_patterns("final", "ema"))
    for f in (resumed / "metrics.jsonl", resumed / "rank1" / "metrics.jsonl"):
        f.write_text("".join(line + "\n" for line in f.read_text().splitlines() if json.loads(line)["step"] <= 2))
    proc = torchrun_rl(flags(ws, resumed, **{"ckpt.load_enable": "true"}))
    assert "(step 2 of 3)" in proc.stdout  # resumed, not started afresh
    a, b = load_file(runs / "fsdp" / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in metrics(resumed) if "reward" in r] == [1, 2, 3]
    out = export_checkpoint(resumed, tmp_path / "exported")
    assert type(load_processor(str(out))).__name__ == "Qwen2VLProcessor"
