"""FSDP2 on CPU (gloo): `torchrun --nproc_per_node 2 ... train rl --fsdp.enable true` trains the tiny
model to the same parameters as one process on the same global batch (the RL loop, reference
model and the policy's EMA included, through the real CLI), and a critic (gae) likewise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError
from tests.integration.conftest import rl_flags, torchrun_worker, worker_module

REWARD = ("def reward_func(queries, prompts, labels, **kw):\n"
          "    return [len(set(q[len(p):])) / 8.0 for q, p in zip(queries, prompts)]\n")


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "data.label_key": None, "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 4,
        "rollout.max_new_tokens": 6, "train.batch_size": 8, "train.micro_batch_size": 2, "train.max_steps": 2,
        "train.max_epochs": 2, "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant",
        "algo.kl.init_coef": 0.01, "algo.kl.use_loss": "true", "algo.kl.estimator": "k3", "train.num_threads": 1,
        **over})


# DAPO's filter drops every group of an odd-numbered prompt (all scores 1.0)
DAPO_REWARD = ("import re\n\ndef reward_func(queries, prompts, labels, **kw):\n"
               "    return [1.0 if int(re.search(r'x(\\d+)y', p).group(1)) % 2 else len(set(q[len(p):])) / 8.0\n"
               "            for q, p in zip(queries, prompts)]\n")


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("fsdp", [{"q": f"x{i}y:"} for i in range(16)])
    (root / "reward.py").write_text(REWARD)
    (root / "dapo.py").write_text(DAPO_REWARD)
    return root


# the policy's EMA and a critic (gae) beside the reference model's KL loss: one run covers them all
WITH_CRITIC_AND_EMA = {"actor.ema_beta": 0.9, "algo.advantage.estimator": "gae", "critic.adam.lr": "1e-2"}


def run_fsdp(ws, out, **over) -> subprocess.CompletedProcess:
    """`train rl --fsdp.enable true` in 2 torchrun processes (gloo on the CPU) writing to `out`."""
    return torchrun_rl(flags(ws, out, **over))


def torchrun_rl(argv: list[str]) -> subprocess.CompletedProcess:
    """`train rl ARGV --fsdp.enable true` in 2 torchrun processes (gloo on the CPU)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "rlhfkit.cli.main", "train", "rl", *argv, "--fsdp.enable", "true"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def single_and_fsdp(ws, tmp_path, monkeypatch, over) -> None:
    """The same run in one process (tmp_path/single) and in 2 FSDP processes (tmp_path/fsdp)."""
    # Under FSDP the LM head is called as a module (its hook gathers the sharded weight), not fused
    # with the log-softmax; the single process takes the same path so the two sum the same floats.
    monkeypatch.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)
    assert main(["train", "rl", *flags(ws, tmp_path / "single", **over)]) == 0
    run_fsdp(ws, tmp_path / "fsdp", **over)


def assert_same_steps(tmp_path, norms=("actor/grad_norm",)) -> list[tuple[dict, dict, dict]]:
    """Every step's global gradient norm(s) and rewards are the single process's, and the ranks' shares of
    the policy loss add up to its loss; returns the (single, rank 0, rank 1) metrics of each step."""
    steps = list(zip(*(metrics(tmp_path / d) for d in ("single", "fsdp", "fsdp/rank1")), strict=True))
    for a, b, c in steps:
        for norm in norms:
            assert b[norm] == pytest.approx(a[norm], rel=1e-5), norm
        assert b["reward"] == a["reward"]  # same rollouts
        assert b["policy_loss"] + c["policy_loss"] == pytest.approx(a["policy_loss"], rel=1e-4, abs=1e-6)
    return steps


def assert_same_weights(ws, tmp_path, folders=("final",)) -> None:
    init = load_file(ws / "tiny" / "model.safetensors")
    for folder in folders:
        one = load_file(tmp_path / "single" / folder / "model.safetensors")
        two = load_file(tmp_path / "fsdp" / folder / "model.safetensors")
        assert one.keys() == two.keys()
        moved = max(float((one[k] - init[k]).abs().max()) for k in one)
        diff = max(float((one[k] - two[k]).abs().max()) for k in one)
        assert moved > 1e-3, folder  # 4 optimizer steps at lr 1e-2 moved the weights (and their EMA)
        # Adam divides by sqrt(v), which magnifies float-order noise in small gradients: measured 6e-5
        assert diff < 3e-4, f"{folder}: FSDP vs single process: max |param diff| {diff:.2e} (moved {moved:.2e})"


def test_two_fsdp_processes_equal_one_process(ws, tmp_path, monkeypatch):
    single_and_fsdp(ws, tmp_path, monkeypatch, WITH_CRITIC_AND_EMA)
    assert_same_weights(ws, tmp_path, ("final", "ema"))
    # The sharp check (Adam is blind to a gradient scale): the global gradient norm of every step,
    # and each rank's share of the policy loss adds up to the single process's.
    for _, b, c in assert_same_steps(tmp_path, ("actor/grad_norm", "critic/grad_norm")):
        assert b["idle_passes"] == c["idle_passes"] == 0  # equal shares of micro_batch_size rows


def test_fsdp_token_budget_micro_batches_equal_one_process(ws, tmp_path, monkeypatch):
    """--train.dynamic_batch_enable: each rank cuts its share by the token budget, so the ranks may
    cut different numbers of micro-batches; the one with fewer pads with idle passes."""
    single_and_fsdp(ws, tmp_path, monkeypatch, {"train.dynamic_batch_enable": "true",
                                                "train.max_tokens_per_micro_batch": 16})
    steps = assert_same_steps(tmp_path)
    assert sum(b["idle_passes"] + c["idle_passes"] for _, b, c in steps) > 0  # the counts did differ
    assert_same_weights(ws, tmp_path)


def test_fsdp_dynamic_filtering_equals_one_process(ws, tmp_path, monkeypatch):
    """--algo.dynamic_filtering_enable: the filtered batch (3 groups of 3 = 9 rows) makes steps of 4, 4 and
    1 rows; the 1-row step splits into shares of 1 and 0 rows (the empty share runs an idle pass)."""
    single_and_fsdp(ws, tmp_path, monkeypatch, {
        "algo.dynamic_filtering_enable": "true", "algo.dynamic_filtering_max_rounds": 1,
        "reward.remote_url": ws / "dapo.py", "rollout.n_samples_per_prompt": 3,
        "algo.advantage.estimator": "group_norm",
        "train.batch_size": 4, "train.micro_batch_size": 1})
    steps = assert_same_steps(tmp_path)
    assert any(a["filtered_groups"] > 0 for a, _, _ in steps)
    assert sum(b["idle_passes"] + c["idle_passes"] for _, b, c in steps) > 0  # unequal shares
    assert_same_weights(ws, tmp_path)


def test_fsdp_bf16_parameters_train_as_float32_masters_computing_in_bf16(ws, tmp_path):
    """--actor.dtype bfloat16 under FSDP (refused before): float32 sharded parameters (the masters) with
    bf16 compute (--fsdp.mixed_precision), said in one line. Its numbers against float32 are checked on
    a fixed batch below (here bf16 sampling already draws other tokens: rewards 0.680 vs 0.703)."""
    over = {"train.max_steps": 1, "train.max_epochs": 1}
    assert main(["train", "rl", *flags(ws, tmp_path / "single", **over)]) == 0
    proc = run_fsdp(ws, tmp_path / "fsdp", **over, **{"actor.dtype": "bfloat16"})
    assert proc.stdout.count("float32 sharded parameters (the master weights) computing in bfloat16") == 1
    (a,), (b,), (c,) = (metrics(tmp_path / d) for d in ("single", "fsdp", "fsdp/rank1"))
    assert b["reward"] == pytest.approx(a["reward"], abs=0.05)
    assert b["actor/grad_norm"] == c["actor/grad_norm"] > 0 and b["optimizer_steps"] == 2
    final = load_file(tmp_path / "fsdp" / "final" / "model.safetensors")
    assert {v.dtype for v in final.values()} == {torch.float32}  # the masters are saved


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fsdp_refuses_what_it_does_not_support():
    with pytest.raises(ConfigError, match="multiple of the number of torchrun processes"):
        fsdp.check_fsdp_settings(3, 8)
    fsdp.check_fsdp_settings(2, 8)


def test_fsdp_outside_torchrun_is_a_one_line_error(ws, tmp_path, capsys):
    assert main(["train", "rl", *flags(ws, tmp_path / "x"), "--fsdp.enable", "true"]) == 2
    assert "runs under torchrun" in capsys.readouterr().err


LM_WORKER = Path(__file__).with_name("fsdp_lm_worker.py")


def lm_worker():
    return worker_module(LM_WORKER)


def train_one_process(device="cpu") -> tuple[torch.nn.Module, list[float]]:
    """fsdp_lm_worker's training in this process, float32: the model and its losses."""
    worker = lm_worker()
    model, _ = worker.tiny_model_and_tokenizer(seed=0)
    model.to(device).train()
    ids = worker.global_batch().to(device)
    return model, worker.train(model, ids, ids[:, 1:].numel())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_shard_model_trains_like_one_process(tmp_path, device):
    """shard_model alone (no RL loop): 2 processes (gloo on CPU, nccl on 2 GPUs) = 1 process."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    model, _ = train_one_process(device)
    torchrun_worker(LM_WORKER, str(tmp_path / "two.safetensors"))
    two = load_file(tmp_path / "two.safetensors")
    one = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    diff = max(float((one[k] - two[k]).abs().max()) for k in two)
    assert diff < 1e-5, f"max |param diff| {diff:.2e}"


def test_shard_model_in_bf16_over_float32_masters_is_float32_within_bf16_tolerance(tmp_path):
    """mixed_precision (what --actor.dtype bfloat16 becomes under FSDP): float32 shards computing in bf16
    with float32 reduction train like the float32 single process (docs/scaling.md): the first step's loss
    within 2e-4 relative, steps 2 and 3 within 5e-3 (they show the gradients were reduced and applied:
    each step lowers the loss by ~30%), the weights' update within 15% of its size (L2). Measured:
    1.6e-4, 1.4e-3, 2.3e-3 and 7.5% (bf16's spacing at 1.0 is 2^-7 = 0.8%)."""
    model, losses = train_one_process()
    torchrun_worker(LM_WORKER, str(tmp_path / "two.safetensors"), "bf16")
    bf16 = json.loads((tmp_path / "two.safetensors.json").read_text())
    two = load_file(tmp_path / "two.safetensors")
    assert {v.dtype for v in two.values()} == {torch.float32}
    init = lm_worker().tiny_model_and_tokenizer(seed=0)[0].state_dict()
    one = {k: v.detach() for k, v in model.state_dict().items()}
    assert bf16[0] == pytest.approx(losses[0], rel=2e-4), (bf16, losses)
    assert bf16[1:] == pytest.approx(losses[1:], rel=5e-3), (bf16, losses)
    assert losses[0] - losses[2] > 20 * 5e-3 * losses[0]  # the steps moved the loss far more than the tolerance
    assert bf16[0] != losses[0]  # it did compute in bf16
    apart, moved = _update_gap(one, two, init)
    assert apart < 0.15 * moved, (apart, moved)


def _update_gap(a: dict, b: dict, init: dict) -> tuple[float, float]:
    """(|a - b|, |a - init|): L2 norms over all weights."""
    moved = sum(float(((a[k] - init[k]) ** 2).sum()) for k in b) ** 0.5
    return sum(float(((a[k] - b[k]) ** 2).sum()) for k in b) ** 0.5, moved


def test_lora_under_fsdp_equals_lora_in_one_process(ws, tmp_path, monkeypatch):
    """--ds.lora.rank with --fsdp.enable: the adapters are sharded with their layers, only they train (the
    reference is the base: the adapters off), and the final folder is the adapter folder one process writes,
    with the same adapter weights."""
    lora = {"ds.lora.rank": 4, "ds.lora.alpha": 8}
    single_and_fsdp(ws, tmp_path, monkeypatch, lora)
    for a, b, c in assert_same_steps(tmp_path)[1:]:  # after the first step the adapters move off the base
        assert a["kl_loss"] > 0 and b["kl_loss"] + c["kl_loss"] == pytest.approx(a["kl_loss"], rel=1e-4)
    one = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    two = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and all("lora_" in k for k in one)
    lora_b = [k for k in one if "lora_B" in k]  # zero at the start: what the steps moved
    assert max(float(one[k].abs().max()) for k in lora_b) > 1e-3
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 3e-4
    assert json.loads((tmp_path / "fsdp" / "final" / "adapter_config.json").read_text())["r"] == 4


def test_muon_under_fsdp_trains_as_muon_in_one_process(ws, tmp_path, monkeypatch):
    """--actor.optim muon and --critic.optim muon under FSDP (refused before): each hidden matrix's update
    is gathered and orthogonalised whole (trainers.sharded_muon; bit for bit on the same gradients:
    test_fsdp_muon.py). The first RL step's 4 optimizer steps have the one process's gradient norms
    (the mean of the 4, to 1e-5 relative) and both steps its rollouts. Beyond that Muon's bfloat16
    Newton-Schulz turns float-order noise into bf16 roundings of the update: one process with another
    micro-batch size ends as far from the first run as the 2 ranks do (measured: 0.039 vs 0.021, the
    weights moved 0.075), so the final weights are held to that, not to Adam's 3e-4."""
    muon = {"actor.optim": "muon", "critic.optim": "muon", "algo.advantage.estimator": "gae", "critic.adam.lr": "1e-2"}
    single_and_fsdp(ws, tmp_path, monkeypatch, muon)
    assert main(["train", "rl", *flags(ws, tmp_path / "mb4", **muon, **{"train.micro_batch_size": 4})]) == 0
    steps = list(zip(*(metrics(tmp_path / d) for d in ("single", "fsdp", "fsdp/rank1")), strict=True))
    (a, b, c), _ = steps
    for norm in ("actor/grad_norm", "critic/grad_norm"):
        assert b[norm] == pytest.approx(a[norm], rel=1e-5), norm
    assert b["policy_loss"] + c["policy_loss"] == pytest.approx(a["policy_loss"], rel=1e-4, abs=1e-6)
    assert all(b["reward"] == a["reward"] for a, b, _ in steps)
    init, one, two, mb4 = (load_file(path / "model.safetensors") for path in (
        ws / "tiny", tmp_path / "single" / "final", tmp_path / "fsdp" / "final", tmp_path / "mb4" / "final"))
    gap = {name: max(float((one[k] - other[k]).abs().max()) for k in one) for name, other in
           (("moved", init), ("fsdp", two), ("micro-batch 4", mb4))}
    assert gap["moved"] > 0.05 and gap["fsdp"] <= gap["micro-batch 4"], gap
