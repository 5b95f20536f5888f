"""Muon (--actor.optim / --critic.optim muon, --train.optim muon) and the critic's warm-up
(--actor.freezing_steps) through the CLI on the tiny model: the actor stays bit for bit as loaded
over the warm-up while the critic trains, and a run killed inside the warm-up resumes bit for bit
(two optimizers per model in the checkpoint)."""

import json
import random
import re
import signal

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.trainers.checkpoint import read_state
from tests.integration import test_resume as rl_resume
from tests.integration import test_supervised_resume as sup_resume
from tests.integration.conftest import rl_flags

STEPS, FROZEN = 5, 3
ws = sup_resume.ws  # the supervised runs' workspace (a fixture: its data files, the kill script)


@pytest.fixture(scope="module")
def rl_ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)]
    return tiny_ws("warmup", rows, sevens=True)


def rl_argv(ws, out):
    return ["train", "rl", *rl_flags(ws, out, **{
        "rollout.batch_size": 8, "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 8,
        "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": STEPS, "train.num_episodes": 2,
        "train.num_threads": 1, "algo.advantage.estimator": "gae", "actor.optim": "muon", "critic.optim": "muon",
        "actor.muon.lr": 0.02, "critic.muon.lr": 0.02, "actor.adam.lr": 1e-3, "critic.adam.lr": 1e-3,
        "actor.lr_warmup_ratio": 0.2, "actor.freezing_steps": FROZEN, "ckpt.save_steps": 1, "ckpt.max_num": 10,
        "ckpt.load_enable": "true"})]


@pytest.fixture(scope="module")
def rl_reference(rl_ws, tmp_path_factory):
    out = tmp_path_factory.mktemp("warmup_ref") / "run"
    rc, log = rl_resume.finish(rl_resume.launch(rl_argv(rl_ws, out)))
    assert rc == 0, log
    return out, log


def step_tensors(out, step, name):
    folder = out / "checkpoints" / f"step_{step:08d}"
    return load_file(str(folder / "model" / "model.safetensors" if name == "model" else folder / f"{name}.safetensors"))


def test_the_actor_stays_as_loaded_over_the_warm_up_while_the_critic_trains(rl_ws, rl_reference):
    out, log = rl_reference
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["actor_frozen"] for m in metrics] == [1.0] * FROZEN + [0.0] * (STEPS - FROZEN)
    assert all("policy_loss" not in m for m in metrics[:FROZEN]) and all("policy_loss" in m for m in metrics[FROZEN:])
    assert all("critic/muon_lr" in m for m in metrics) and "actor/muon_lr" in metrics[-1]
    assert f"step {FROZEN}: actor frozen, only the critic is updated" in log
    assert f"step {FROZEN + 1}: actor frozen" not in log
    loaded = load_file(str(rl_ws / "tiny" / "model.safetensors"))
    for step in range(1, FROZEN + 1):
        assert sup_resume.tensors_equal(step_tensors(out, step, "model"), loaded), step
    assert not sup_resume.tensors_equal(step_tensors(out, FROZEN + 1, "model"), loaded)
    assert not sup_resume.tensors_equal(step_tensors(out, 1, "critic"), step_tensors(out, FROZEN, "critic"))
    trainer = read_state(out / "checkpoints" / f"step_{STEPS:08d}")["trainer"]
    for key in ("learner", "critic_learner"):  # Muon's momentum buffers are in the checkpoint
        assert trainer[key]["muon"]["optimizer"]["state"], key


def test_a_run_killed_inside_the_warm_up_resumes_bit_for_bit(rl_ws, rl_reference, tmp_path):
    ref, _ = rl_reference
    out = tmp_path / "run"
    argv = rl_argv(rl_ws, out)
    rc, log = rl_resume.kill_after_lines(rl_resume.launch(argv), out / "metrics.jsonl", 2,
                                         random.Random(3).uniform(0.0, 0.3))
    assert rc == -signal.SIGKILL, log
    rc, log = rl_resume.finish(rl_resume.launch(argv))
    assert rc == 0, log
    resumed = re.search(r"resumed from \S+ \(step (\d+) of", log)
    assert resumed and 1 <= int(resumed.group(1)) <= FROZEN, log  # a checkpoint inside the warm-up
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert sup_resume.tensors_equal(a, b)
    assert rl_resume.rows(out / "metrics.jsonl") == rl_resume.rows(ref / "metrics.jsonl")
    assert rl_resume.rows(out / "samples.jsonl") == rl_resume.rows(ref / "samples.jsonl")
    for name in ("state", "critic"):  # both optimizers of both models, the RNG states; the critic's weights
        assert sup_resume.tensors_equal(step_tensors(ref, STEPS, name), step_tensors(out, STEPS, name)), name


def test_train_sft_with_muon_trains_other_weights_and_resumes_bit_for_bit(ws, tmp_path, capsys):
    muon = {"train.optim": "muon", "muon.lr": 0.02}
    ref, adam = tmp_path / "ref", tmp_path / "adam"
    assert main(sup_resume.argv(ws, "sft", ref, **muon)) == 0
    assert main(sup_resume.argv(ws, "sft", adam)) == 0
    a, b = load_file(str(ref / "final" / "model.safetensors")), load_file(str(adam / "final" / "model.safetensors"))
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in moved  # a hidden matrix: Muon's
    out = tmp_path / "run"
    where, n, resumed = sup_resume.KILLS["sft"]
    rc, log = sup_resume.launch_killed(sup_resume.argv(ws, "sft", out, **muon), ws / "killer.py", where, n)
    assert rc == -signal.SIGKILL, log
    capsys.readouterr()
    assert main(sup_resume.argv(ws, "sft", out, **muon)) == 0
    assert f"(step {resumed} of {sup_resume.STEPS})" in capsys.readouterr().out
    sup_resume.assert_same_run(ref, out)


def test_train_rs_sft_stage_trains_with_muon(tiny_ws, capsys):
    root = tiny_ws("rs_muon", rows=[{"input": f"{a}+{b}=", "label": str(a + b)} for a in range(4) for b in range(4)])
    (root / "digits.py").write_text("def reward_func(queries, prompts, labels, responses=None, **kw):\n"
                                    "    return [sum(c.isdigit() for c in r) / max(len(r), 1) for r in responses]\n")
    out = root / "out"
    assert main(["train", "rs", *rl_flags(root, out, **{
        "data.input_key": "input", "data.label_key": "label", "reward.remote_url": root / "digits.py",
        "rollout.max_new_tokens": 8, "rollout.batch_size": 16, "train.num_threads": 1, "rs.best_of_n": 2,
        "rs.sft_enable": "true", "sft.train.optim": "muon", "sft.muon.lr": 0.05, "sft.train.batch_size": 4,
        "sft.train.micro_batch_size": 2, "sft.train.lr_warmup_ratio": 0})]) == 0
    steps = [json.loads(line) for line in (out / "round_1" / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["muon_lr"] == 0.05  # the stage's Muon, at its (constant-warmup-free) first step
