"""Devices and memory levers on the CPU: --actor.device / --model.device (auto picks the CPU here, a
CUDA device that is not there is one line), gradient checkpointing (the same gradients, also on the
shared-prefix layout's 4-D masks and the fused LM head), --ref.offload / --reward.offload (the same
numbers; on the CPU the move is a no-op, the code path runs). The CUDA side runs in bench/gpu_check.py."""

import copy
import os
import sys

import pytest
import torch

import rlhfkit
from rlhfkit.cli.main import main
from rlhfkit.data.packing import pack_shared_prefix
from rlhfkit.errors import ConfigError
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models.precision import (
    enable_gradient_checkpointing,
    model_device,
    on_device,
    peak_memory,
    resolve_device,
)
from rlhfkit.models.reward import init_reward_model
from tests.unit.data.test_shared_prefix import random_batch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# ------------------------------------------------------------------ devices
def test_auto_is_cuda_when_there_else_cpu(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_a_cuda_device_that_is_not_there_is_refused(no_cuda, monkeypatch):
    with pytest.raises(ConfigError,
                       match=r"--actor.device cuda: torch sees no CUDA device here .*use --actor.device cpu"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"--model.device cuda:2: only 2 CUDA device\(s\) here"):
        resolve_device("cuda:2", "--model.device")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_device_names_are_checked_with_the_config():
    with pytest.raises(ConfigError, match="--actor.device 'gpu': not a device; valid: auto, cpu, cuda or cuda:N"):
        rlhfkit.RLConfig.from_args(["--actor.device", "gpu"])
    assert rlhfkit.RLConfig.from_args(["--device", "cuda:1"]).actor.device == "cuda:1"
    assert rlhfkit.SFTConfig.from_args(["--device", "cpu"]).model.device == "cpu"
    assert rlhfkit.DPOConfig.from_args(["--device", "cpu"]).model.device == "cpu"
    with pytest.raises(ConfigError, match="--model.device 'tpu'"):
        rlhfkit.RMConfig.from_args(["--model.device", "tpu"])


def test_on_device_and_peak_memory_do_nothing_on_the_cpu():
    model, _ = tiny_model_and_tokenizer(seed=0)
    with on_device(model, "cpu") as m, on_device(None, "cuda"):
        assert m is model and model_device(model).type == "cpu"
    peaks: dict = {}
    with peak_memory(torch.device("cpu"), peaks, "update"):
        pass
    assert peaks == {}


def rl_flags(ws, out, **over):
    f = {"actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "prompts.jsonl",
         "data.input_key": "q", "reward.remote_url": ws / "reward.py", "rollout.batch_size": 4,
         "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 4, "train.batch_size": 8,
         "train.micro_batch_size": 4, "train.max_steps": 2, "actor.autocast": "none", "actor.adam.lr": "1e-3",
         "logger.progress_bar": "false", "ckpt.output_dir": out, "algo.kl.init_coef": "0.1",
         "train.num_threads": "1"}
    f.update(over)
    return [x for k, v in f.items() for x in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    return tiny_ws("devices", [{"q": f"{i} plus {i}:"} for i in range(8)], sevens=True)


def run_rl(ws, out, **over):
    trainer = rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(rl_flags(ws, out, **over)))
    metrics = trainer.train()
    return metrics, {k: v.detach().clone() for k, v in trainer.loop.policy.state_dict().items()}


NUMBERS = ("reward", "kl", "policy_loss", "actor/grad_norm", "grad_norm", "loss", "margin")


def same_run(a, b, atol=0.0, weight_atol: float | None = 0.0):
    """The same numbers (to `atol`) and the same weights (to `weight_atol`; None: not compared)."""
    (ma, wa), (mb, wb) = a, b
    compared = [key for key in NUMBERS if key in ma]
    assert "actor/grad_norm" in compared or "grad_norm" in compared, sorted(ma)
    for key in compared:
        assert ma[key] == pytest.approx(mb[key], abs=atol, rel=atol), key
    for name in wa if weight_atol is not None else ():
        torch.testing.assert_close(wa[name], wb[name], atol=weight_atol, rtol=0)


def same_update(a, b, init: dict, rtol: float) -> None:
    """The runs' weight updates (from `init`) agree to `rtol` of the update's size (L2 over all weights),
    and the weights did move: a run that skipped its steps is a whole update away."""
    (_, wa), (_, wb) = a, b
    moved = sum(float(((wa[k] - init[k]) ** 2).sum()) for k in init) ** 0.5
    apart = sum(float(((wa[k] - wb[k]) ** 2).sum()) for k in init) ** 0.5
    assert moved > 0.05 and apart < rtol * moved, (apart, moved)


def test_cpu_device_and_ref_offload_give_the_same_run(ws, tmp_path):
    base = run_rl(ws, tmp_path / "auto")
    assert "kl" in base[0]
    assert not any(k.startswith("memory/") for k in base[0])  # peak memory is a CUDA metric
    same_run(base, run_rl(ws, tmp_path / "cpu", **{"actor.device": "cpu"}))
    same_run(base, run_rl(ws, tmp_path / "offload", **{"ref.offload": "true"}))


def test_gradient_checkpointing_gives_the_same_run(ws, tmp_path):
    """The same metrics (the gradient norm included) to float tolerance; the weights' update the same
    to 2% of its size (measured 0.7%): checkpointing keeps SDPA for the shared-prefix rows where the
    plain update swaps in eager attention (1e-6 apart), and Adam turns that into up to one step for a
    parameter whose gradient is ~0. That recompute happens is tests/integration/test_levers_observed.py."""
    from safetensors.torch import load_file

    plain, ckpt = run_rl(ws, tmp_path / "plain"), run_rl(ws, tmp_path / "ckpt", gradient_checkpointing="true")
    same_run(plain, ckpt, atol=1e-4, weight_atol=None)
    same_update(plain, ckpt, load_file(ws / "tiny" / "model.safetensors"), rtol=0.02)


def test_cuda_without_cuda_is_one_line_before_models_load(ws, tmp_path, capsys, no_cuda):
    for argv, needle in (
        (["train", "rl", *rl_flags(ws, tmp_path / "rl", **{"actor.device": "cuda"})],
         "--actor.device cuda: torch sees no CUDA device here"),
        (["train", "sft", "--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(ws / "prompts.jsonl"),
          "--device", "cuda:0", "--ckpt.output_dir", str(tmp_path / "sft")],
         "--model.device cuda:0: torch sees no CUDA device here"),
    ):
        rc = main(argv)
        err = capsys.readouterr().err
        lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], err
        assert "Traceback" not in err
    assert not (tmp_path / "sft").exists()  # refused before the run folder


# ------------------------------------------------------------------ gradient checkpointing
def grads(model, mb):
    model.zero_grad()
    logp, ent = response_logprobs(model, mb, temperature=0.7, with_entropy=True)
    ((logp * mb.loss_mask).sum() + (ent * mb.loss_mask).sum()).backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_gradient_checkpointing_keeps_the_gradients(shared_prefix, attn):
    """The same gradients; with sdpa on shared-prefix rows, the plain forward swaps in eager attention
    on the CPU (models.logprobs.attention_for) and the checkpointed one keeps sdpa: 1e-5 apart."""
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.config._attn_implementation = attn
    model.train()
    tol = dict(atol=5e-5, rtol=1e-3) if attn == "sdpa" and shared_prefix else dict(atol=1e-6, rtol=1e-5)
    batch, rows = random_batch(3)
    mb = pack_shared_prefix(batch, rows, 0, 64) if shared_prefix else batch
    lp, g = grads(model, mb)
    enable_gradient_checkpointing(model)
    assert model.model.gradient_checkpointing
    lp_ckpt, g_ckpt = grads(model, mb)
    torch.testing.assert_close(lp_ckpt, lp, **tol)
    for a, b in zip(g_ckpt, g, strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_gradient_checkpointing_of_a_reward_model_and_a_lora_model(tmp_path):
    from rlhfkit.models.lora import add_lora

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    rm = init_reward_model(tmp_path / "tiny", tok.pad_token_id, torch.float32, seed=0)
    enable_gradient_checkpointing(rm)
    lora = add_lora(model, 4, 8, "all-linear")
    enable_gradient_checkpointing(lora)
    assert rm.model.gradient_checkpointing and lora.get_base_model().model.gradient_checkpointing


# ------------------------------------------------------------------ reward model offload, supervised commands
def test_reward_model_offload_scores_the_same(tmp_path):
    from rlhfkit.rewards.reward_model import RewardModelFn

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    init_reward_model(tmp_path / "tiny", tok.pad_token_id, torch.float32, seed=0).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    queries = ["1 plus 1: 2", "2 plus 2: 5", "x"]
    kept = RewardModelFn(tmp_path / "rm", micro_batch_size=2, device="cpu")
    offloaded = RewardModelFn(tmp_path / "rm", micro_batch_size=2, device="cpu", offload=True)
    a, b = kept(queries, queries, [None] * 3), offloaded(queries, queries, [None] * 3)
    assert torch.equal(a.rewards, b.rewards) and model_device(offloaded.model).type == "cpu"


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_supervised_device_and_gradient_checkpointing_give_the_same_run(ws, tmp_path, kind):
    import json

    rows = ([{"input": f"{i} plus {i}:", "output": f" {2 * i}"} for i in range(8)] if kind == "sft" else
            [{"prompt": f"{i} plus {i}:", "chosen": f" {2 * i}", "rejected": f" {i}"} for i in range(8)])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cls, trainer_cls = ((rlhfkit.SFTConfig, rlhfkit.SFTTrainer) if kind == "sft" else
                        (rlhfkit.DPOConfig, rlhfkit.DPOTrainer))

    def run(out, *extra):
        cfg = cls.from_args(["--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(data),
                             "--train.batch_size", "4", "--train.micro_batch_size", "2", "--adam.lr", "1e-3",
                             "--logger.progress_bar", "false", "--ckpt.output_dir", str(tmp_path / out),
                             "--train.num_threads", "1", *extra])
        t = trainer_cls.from_config(cfg)
        return t.train(), {k: v.detach().clone() for k, v in t.model.state_dict().items()}

    base = run("auto")
    same_run(base, run("cpu", "--model.device", "cpu"))
    same_run(base, run("ckpt", "--gradient_checkpointing"), atol=1e-5, weight_atol=1e-5)


# ------------------------------------------------------------------ LoRA in RL
def test_lora_in_rl_trains_the_adapters_only_against_the_base_model(ws, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from rlhfkit.data.batch import collate
    from tests.unit.data.test_shared_prefix import traj

    cfg = rlhfkit.RLConfig.from_args(rl_flags(ws, tmp_path / "lora", lora_rank=8, lora_alpha=16,
                                              **{"ds.lora.target_modules": "q_proj,v_proj"}))
    trainer = rlhfkit.RLTrainer.from_config(cfg)
    policy = trainer.loop.policy
    assert trainer.loop.experience.ref is policy  # no second copy of the weights
    assert trainer.loop.engine.model is policy  # the hf engine generates with the adapted weights
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    base = AutoModelForCausalLM.from_pretrained(ws / "tiny")
    batch = collate([traj([5, 6, 7], [8, 9]), traj([10], [11, 12, 13])], pad_id=0)
    trainer.train()
    after = policy.state_dict()
    adapters = [k for k in before if "lora_" in k]
    assert adapters and all("q_proj" in k or "v_proj" in k for k in adapters)
    assert any(not torch.equal(before[k], after[k]) for k in adapters if "lora_B" in k)  # adapters moved
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)  # base weights did not
    ref_logp = trainer.loop.experience.ref_logp(batch)
    torch.testing.assert_close(ref_logp, response_logprobs(base, batch)[0], atol=1e-6, rtol=1e-6)
    policy_logp = response_logprobs(policy, batch)[0]
    assert not torch.allclose(policy_logp, ref_logp, atol=1e-6)  # the adapters are active outside the ref pass
    final = tmp_path / "lora" / "final"
    assert (final / "adapter_config.json").exists()
    assert main(["lora", "merge", "--lora.adapter", str(final), "--ckpt.output_dir", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(response_logprobs(merged, batch)[0], policy_logp, atol=1e-5, rtol=1e-5)


def test_lora_in_rl_combines_with_the_vllm_engine_and_qlora_too():
    assert rlhfkit.RLConfig.from_args(["--ds.lora.rank", "8", "--rollout.engine", "vllm"]).ds.lora.rank == 8
    cfg = rlhfkit.RLConfig.from_args(["--ds.lora.rank", "8", "--ds.load_in_4bit", "true", "--rollout.engine", "vllm"])
    assert cfg.ds.load_in_4bit and cfg.rollout.engine == "vllm"  # synced dequantized (test_vllm_qlora.py)
    targets = rlhfkit.RLConfig.from_args(["--target_modules", "q_proj", "v_proj"]).ds.lora.target_modules
    assert targets == "q_proj,v_proj"


def test_lora_with_ema_keeps_the_ema_of_the_adapters(ws, tmp_path):
    """--actor.ema_beta with LoRA: the EMA runs over the adapters (the only trained weights) and
    ema/ is an adapter folder: ema = beta * ema + (1 - beta) * adapters after each step."""
    from safetensors.torch import load_file

    cfg = rlhfkit.RLConfig.from_args(rl_flags(ws, tmp_path / "lora_ema", lora_rank=4, lora_alpha=8,
                                              **{"ds.lora.target_modules": "q_proj,v_proj", "actor.ema_beta": "0.5"}))
    trainer = rlhfkit.RLTrainer.from_config(cfg)
    learner = trainer.loop.update.learner
    start = [p.detach().clone() for p in learner.params]
    assert all(torch.equal(e, s) for e, s in zip(learner.ema, start))
    trainer.train()
    ema_dir, final_dir = tmp_path / "lora_ema" / "ema", tmp_path / "lora_ema" / "final"
    assert (ema_dir / "adapter_config.json").exists() and (final_dir / "adapter_config.json").exists()
    ema, final = (load_file(d / "adapter_model.safetensors") for d in (ema_dir, final_dir))
    assert ema.keys() == final.keys() and all("lora_" in k for k in ema)
    moved = [k for k in final if "lora_B" in k]
    assert moved and all(not torch.equal(ema[k], final[k]) for k in moved)  # the EMA lags the adapters
    assert all(float(ema[k].abs().max()) > 0 for k in moved)  # ... but follows them from their zero start


def test_lora_with_the_vllm_engine_samples_with_the_merged_policy(ws, tmp_path, monkeypatch):
    """`train rl --rollout.engine vllm --ds.lora.rank 4` on a fake `vllm.LLM` (its worker the real
    weight-sync extension, its model the base's parameter names): after each step the engine holds
    the policy's adapters merged into their layers, equal to peft's `merge_and_unload`; the first
    sync in full, the next only the attention blocks; the reference stays the policy, adapters off."""
    import importlib.machinery
    import types

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.unit.rollout.test_vllm_colocated import FakeLLM, FakeModel

    seven = AutoTokenizer.from_pretrained(ws / "tiny")("7", add_special_tokens=False).input_ids[-1]

    class VariedLLM(FakeLLM):
        def generate(self, requests, sampling_params, use_tqdm):  # a "7" in every other sample: rewards differ
            ids = [seven if k % 2 else 5 for k in range(len(requests))]
            outs = [types.SimpleNamespace(token_ids=[t], logprobs=[{t: -0.5}], finish_reason="length") for t in ids]
            return [types.SimpleNamespace(outputs=[o]) for o in outs]

    base = AutoModelForCausalLM.from_pretrained(ws / "tiny").state_dict()
    llms = []

    def make_llm(**kwargs):  # vLLM loads the actor's folder: the base weights
        model = FakeModel(base)
        model.params = {k: v.clone() for k, v in base.items()}
        llms.append(VariedLLM(model))
        return llms[-1]

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    fake.LLM, fake.SamplingParams = make_llm, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    cfg = rlhfkit.RLConfig.from_args(rl_flags(ws, tmp_path / "lora_vllm", lora_rank=4, lora_alpha=8,
                                              **{"ds.lora.target_modules": "q_proj,v_proj",
                                                 "rollout.engine": "vllm"}))
    trainer = rlhfkit.RLTrainer.from_config(cfg)
    policy = trainer.loop.policy
    assert trainer.loop.experience.ref is policy  # the reference: the base, the policy's adapters off
    trainer.train()
    model = llms[0].worker.model_runner.model
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert sorted(model.params) == sorted(merged)
    assert all(torch.equal(model.params[k], merged[k]) for k in merged)
    assert any(not torch.equal(base[k], merged[k]) for k in merged)  # the adapters moved the merge
    assert len(model.handed) == 2 and len(model.handed[0]) == len(merged)  # two syncs, the first in full
    assert {n for n, _ in model.handed[1]} == {f"model.layers.{i}.self_attn.{m}_proj.weight"
                                               for i in range(2) for m in "qkvo"}
    assert trainer.loop.engine.version == 2
