"""The trainers on a device against the same work on the CPU, in float32: rollout tokens and
logprobs, greedy tokens (and `model.generate`'s), one update's gradients (with and without gradient
checkpointing), one RL step, a save and resume, LoRA in RL, bf16 parameters with float32 masters,
and the supervised trainers. Each test takes `device`: "cpu" runs in the default suite (the same
code, a CPU device), "cuda" under `-m gpu` (bench/gpu_check.py runs them on the GPU machine).

Tolerances: float32 kernels differ between devices (summation order), the math does not: ~1e-6
per logprob. Sampling draws its uniforms from CPU generators, so the same seeds give the same
tokens on both. Adam's first step moves a parameter by about lr whatever its gradient's size, so
one step's weights are compared as the whole update (L2 norm over all weights, within 2% of its size)
rather than element by element, where a gradient ~0 may flip a step's sign (metrics and gradients
tightly)."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.core.losses import policy_loss
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models.precision import enable_gradient_checkpointing
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from tests.unit.data.test_shared_prefix import random_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LR = 1e-3


def close(a: dict, b: dict, keys, rel: float) -> None:
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=rel, abs=rel), key


def updates_close(a: dict, b: dict, init: dict, rtol: float) -> None:
    """The weight updates from `init` agree to `rtol` of the update's size (L2 over all weights), and
    the weights moved: a run that skipped `optimizer.step()` is a whole update away, not within lr."""
    keys = [k for k in init if k in a]  # a reward model has a score head in place of lm_head
    moved = sum(float(((a[k].float().cpu() - init[k]) ** 2).sum()) for k in keys) ** 0.5
    apart = sum(float(((a[k].float().cpu() - b[k].float().cpu()) ** 2).sum()) for k in keys) ** 0.5
    assert moved > 0.05 and apart < rtol * moved, (apart, moved)


def weights_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name].float().cpu(), b[name].float().cpu(), atol=atol, rtol=0, msg=name)


# ------------------------------------------------------------------ rollout
def prompts(tok, count=4):
    return [tok(f"{i} plus {i}:", add_special_tokens=False)["input_ids"] for i in range(count)]


@pytest.mark.parametrize("device", DEVICES)
def test_rollout_tokens_and_logprobs_match_the_cpu_and_the_trainer_forward(device):
    cpu_model, tok = tiny_model_and_tokenizer(seed=0)
    model = copy.deepcopy(cpu_model).to(device).eval()
    params = SamplingParams(max_new_tokens=12, temperature=0.7, n=2)
    seeds = [11, 12, 13, 14]
    ref = HFEngine(cpu_model.eval(), tok).generate(prompts(tok), params, seeds=seeds)
    got = HFEngine(model, tok).generate(prompts(tok), params, seeds=seeds)
    assert [t.response_ids.tolist() for t in got] == [t.response_ids.tolist() for t in ref]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.logprobs.cpu(), b.logprobs, atol=2e-5, rtol=0)
    from rlhfkit.data.batch import collate

    batch = collate(got, pad_id=tok.pad_token_id)
    with torch.no_grad():
        forward = response_logprobs(model, batch, temperature=0.7)[0].cpu()
    for i, t in enumerate(got):
        torch.testing.assert_close(forward[i, : t.response_length], t.logprobs.cpu(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_tokens_match_the_cpu_and_model_generate(device):
    cpu_model, tok = tiny_model_and_tokenizer(seed=0)
    model = copy.deepcopy(cpu_model).to(device).eval()
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    ref = HFEngine(cpu_model.eval(), tok).generate(prompts(tok), greedy)
    got = HFEngine(model, tok).generate(prompts(tok), greedy)
    assert [t.response_ids.tolist() for t in got] == [t.response_ids.tolist() for t in ref]
    for p, t in zip(prompts(tok), got):
        ids = torch.tensor([p], device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        assert out[0, len(p): len(p) + t.response_length].tolist() == t.response_ids.tolist()


# ------------------------------------------------------------------ one update's gradients
def policy_gradients(model, batch):
    """PPO's clipped loss on `batch` (advantages and old logprobs drawn from a fixed seed)."""
    g = torch.Generator().manual_seed(3)
    shape = batch.response_ids.shape
    adv, noise = torch.randn(shape, generator=g), 0.05 * torch.randn(shape, generator=g)
    model.zero_grad()
    logp, _ = response_logprobs(model, batch, temperature=0.7)
    device = logp.device
    old = (logp.detach() + noise.to(device)).masked_fill(~batch.loss_mask.to(device), 0.0)
    loss, _ = policy_loss(logp, old, adv.to(device), batch.loss_mask.to(device))
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().cpu() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("device", DEVICES)
def test_one_update_has_the_cpu_gradients(device, checkpointing):
    cpu_model, _ = tiny_model_and_tokenizer(seed=0)
    model = copy.deepcopy(cpu_model).to(device).train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    batch, _ = random_batch(3)
    ref_loss, ref = policy_gradients(cpu_model.train(), batch)
    loss, got = policy_gradients(model, batch)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.gpu
def test_gradient_checkpointing_lowers_cuda_peak_memory():
    """Activation-bound: 8 rows x 512 tokens through 8 layers; the peak falls, the gradients stay."""
    model, _ = tiny_model_and_tokenizer(seed=0, hidden=256, layers=8, intermediate=1024, max_positions=1024)
    model = model.cuda().train()
    ids = torch.randint(4, 80, (8, 512), device="cuda")

    def peak() -> tuple[float, torch.Tensor]:
        model.zero_grad()
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=ids, labels=ids).loss.backward()
        return torch.cuda.max_memory_allocated(), model.model.embed_tokens.weight.grad.clone()

    plain, g_plain = peak()
    enable_gradient_checkpointing(model)
    ckpt, g_ckpt = peak()
    assert ckpt < 0.8 * plain, (ckpt, plain)
    torch.testing.assert_close(g_ckpt, g_plain, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ RL runs
def rl_flags(ws, out, **over):
    f = {"actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "prompts.jsonl",
         "data.input_key": "q", "reward.remote_url": ws / "reward.py", "rollout.batch_size": 4,
         "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 4, "train.batch_size": 8,
         "train.micro_batch_size": 4, "train.max_steps": 1, "actor.autocast": "none", "actor.adam.lr": LR,
         "actor.lr_scheduler": "constant", "logger.progress_bar": "false", "ckpt.output_dir": out,
         "algo.kl.init_coef": "0.1", "train.num_threads": "1"}
    f.update(over)
    return [x for k, v in f.items() for x in (f"--{k}", str(v))]


def run_rl(ws, out, **over):
    trainer = rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(rl_flags(ws, out, **over)))
    metrics = trainer.train()  # resumes first with --ckpt.load_enable
    return trainer, metrics, {k: v.detach().cpu().clone() for k, v in trainer.loop.policy.state_dict().items()}


# rewards that differ within a group, so that one step's policy gradient is not zero
SPREAD_REWARD = ("def reward_func(queries, prompts, labels, **kw):\n"
                 "    return [len(set(q[len(p):])) / 8.0 for q, p in zip(queries, prompts)]\n")


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("device_vs_cpu", [{"q": f"{i} plus {i}:"} for i in range(8)], sevens=True)
    (root / "spread.py").write_text(SPREAD_REWARD)
    return root


@pytest.fixture(scope="module")
def cpu_step(ws, tmp_path_factory):
    """The reference step: on the CPU, in micro-batches of 2 (the device runs take 4), so that the cpu
    variant compares two different computations of one step, not a run with its copy."""
    return run_rl(ws, tmp_path_factory.mktemp("cpu_step") / "run", **{
        "actor.device": "cpu", "train.micro_batch_size": 2, "reward.remote_url": ws / "spread.py"})


RL_NUMBERS = ("reward", "kl", "policy_loss", "actor/grad_norm", "response_length")


@pytest.mark.parametrize("device", DEVICES)
def test_one_rl_step_matches_the_cpu(ws, tmp_path, cpu_step, device):
    trainer, metrics, weights = run_rl(ws, tmp_path / "run", **{"actor.device": device,
                                                                "reward.remote_url": ws / "spread.py"})
    assert next(trainer.loop.policy.parameters()).device.type == device
    close(metrics, cpu_step[1], RL_NUMBERS, rel=1e-4)
    updates_close(weights, cpu_step[2], load_file(ws / "tiny" / "model.safetensors"), rtol=0.02)
    if device == "cuda":
        assert metrics["memory/update_peak_gib"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_resumed_run_continues_as_the_uninterrupted_one(ws, tmp_path, device):
    common = {"actor.device": device, "ckpt.save_steps": 1, "ckpt.load_enable": "true"}
    _, whole, w_whole = run_rl(ws, tmp_path / "whole", **common, **{"train.max_steps": 2})
    run_rl(ws, tmp_path / "split", **common)
    trainer, resumed, w_resumed = run_rl(ws, tmp_path / "split", **common, **{"train.max_steps": 2})
    assert trainer.resume and trainer.loop.step == 2
    tol = 0.0 if device == "cpu" else 1e-5  # CUDA's atomics may reorder float sums between runs
    close(resumed, whole, RL_NUMBERS, rel=tol)
    weights_close(w_resumed, w_whole, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_lora_in_rl_on_the_device_trains_the_adapters_against_the_base(ws, tmp_path, device):
    from rlhfkit.data.batch import collate
    from tests.unit.data.test_shared_prefix import traj

    trainer = rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(
        rl_flags(ws, tmp_path / "lora", lora_rank=8, lora_alpha=16, **{"actor.device": device, "train.max_steps": 2})))
    policy = trainer.loop.policy
    before = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
    trainer.train()
    after = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    adapters = [k for k in before if "lora_B" in k]
    assert adapters and any(not torch.equal(before[k], after[k]) for k in adapters)
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)
    batch = collate([traj([5, 6, 7], [8, 9]), traj([10], [11, 12, 13])], pad_id=0)
    base, _ = tiny_model_and_tokenizer(seed=0)
    torch.testing.assert_close(trainer.loop.experience.ref_logp(batch).cpu(), response_logprobs(base, batch)[0],
                               atol=2e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_parameters_with_float32_masters(ws, tmp_path, device):
    trainer, metrics, _ = run_rl(ws, tmp_path / "bf16", **{"actor.device": device, "actor.dtype": "bfloat16",
                                                           "actor.autocast": "bfloat16"})
    params = list(trainer.loop.policy.parameters())
    # weight matrices in bf16; norm weights and biases (vectors) kept in float32
    assert {p.dtype for p in params if p.dim() >= 2} == {torch.bfloat16} and params[0].device.type == device
    assert {p.dtype for p in params if p.dim() < 2} <= {torch.float32}
    masters = trainer.loop.update.learner.master
    assert masters and all(m.dtype == torch.float32 and m.device == params[0].device for m in masters)
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("policy_loss", "actor/grad_norm"))


# ------------------------------------------------------------------ supervised trainers
SUPERVISED = {
    "sft": ([{"input": f"{i} plus {i}:", "output": f" {2 * i}"} for i in range(8)], "SFT"),
    "dpo": ([{"prompt": f"{i} plus {i}:", "chosen": f" {2 * i}", "rejected": f" {i}"} for i in range(8)], "DPO"),
    "rm": ([{"prompt": f"{i} plus {i}:", "chosen": f" {2 * i}", "rejected": f" {i}"} for i in range(8)], "RM"),
    "kto": ([{"prompt": f"q{i}:", "output": ("7" if i % 2 else "1") * 2, "label": bool(i % 2)} for i in range(8)],
            "KTO"),
}


def run_supervised(ws, tmp_path, kind, device, micro_batch_size=2):
    rows, name = SUPERVISED[kind]
    data = tmp_path / f"{kind}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = getattr(rlhfkit, f"{name}Config").from_args([
        "--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(data), "--model.device", device,
        "--train.batch_size", "4", "--train.micro_batch_size", str(micro_batch_size), "--adam.lr", str(LR),
        "--logger.progress_bar", "false", "--ckpt.output_dir", str(tmp_path / f"{kind}_{device}"),
        "--train.num_threads", "1"])
    trainer = getattr(rlhfkit, f"{name}Trainer").from_config(cfg)
    metrics = trainer.train()
    assert next(trainer.model.parameters()).device.type == device
    return metrics, {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def supervised_on_cpu(ws, tmp_path_factory):
    """The references: on the CPU in one micro-batch of 4 (the device runs take 2 of 2), so the cpu variant
    is not a copy of its reference; KTO keeps 2 (its KL reference point pairs samples within a micro-batch)."""
    return {kind: run_supervised(ws, tmp_path_factory.mktemp(kind), kind, "cpu",
                                 micro_batch_size=2 if kind == "kto" else 4) for kind in SUPERVISED}


@pytest.mark.parametrize("kind", list(SUPERVISED))
@pytest.mark.parametrize("device", DEVICES)
def test_supervised_trainers_on_the_device_match_the_cpu(ws, tmp_path, supervised_on_cpu, kind, device):
    got, w_got = run_supervised(ws, tmp_path, kind, device)
    ref, w_ref = supervised_on_cpu[kind]
    numbers = [k for k in ref if isinstance(ref[k], float) and not any(w in k for w in ("time", "per_s", "memory"))]
    assert "loss" in numbers
    close(got, ref, numbers, rel=1e-4)
    updates_close(w_got, w_ref, load_file(ws / "tiny" / "model.safetensors"), rtol=0.02)  # two Adam steps
