"""QLoRA (--ds.load_in_4bit with --ds.lora.rank): the base model's linear layers load as bitsandbytes'
4-bit NF4 weights, only the LoRA adapters train over them, in `train sft`, `train rm` and `train rl` (where the
rollout samples with the same 4-bit weights the trainer differentiates: the logprob gap stays at
float noise; with --rollout.engine vllm, a fake vLLM in a subprocess, with the dequantized base and the
adapters merged) and OpenRLHF's --load_in_4bit maps onto it. Skipped where bitsandbytes is not installed."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.api.rl import RLTrainer
from rlhfkit.api.supervised import RMTrainer, SFTTrainer
from rlhfkit.config import RLConfig
from rlhfkit.config.preference import RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError
from tests.integration.conftest import fake_vllm_env, fake_vllm_events, rl_flags

bnb = pytest.importorskip("bitsandbytes")


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("qlora", [{"q": f"x{i}y:", "a": str(i % 7)} for i in range(16)], sevens=True)
    (root / "sft.jsonl").write_text("".join(json.dumps({"q": f"{i} + {i} =", "a": f" {2 * i}"}) + "\n"
                                            for i in range(32)))
    return root


def sft_flags(ws, out, *extra):
    return ["--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(ws / "sft.jsonl"),
            "--data.input_key", "q", "--data.output_key", "a", "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--train.max_steps", "3", "--adam.lr", "1e-2", "--ds.lora.rank", "4",
            "--ds.lora.alpha", "8", "--ckpt.output_dir", str(out), "--logger.progress_bar", "false",
            "--train.num_threads", "1", *extra]


def test_sft_trains_adapters_over_4bit_linear_layers(ws, tmp_path):
    cfg = SFTConfig.from_args(sft_flags(ws, tmp_path / "run", "--ds.load_in_4bit"))
    trainer = SFTTrainer.from_config(cfg)
    linears = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linears) == 2 * 7  # every linear layer of the 2 decoder layers (q k v o, gate up down)
    packed = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    metrics = trainer.train()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert all(torch.equal(p, packed[n]) for n, p in trainer.model.named_parameters() if n in packed)
    final = tmp_path / "run" / "final"
    adapters = load_file(final / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert max(float(v.abs().max()) for k, v in adapters.items() if "lora_B" in k) > 1e-3  # they learned


def test_rl_samples_and_trains_with_the_same_4bit_weights(ws, tmp_path):
    out = tmp_path / "rl"
    argv = rl_flags(ws, out, **{"ds.lora.rank": 4, "ds.lora.alpha": 8, "ds.load_in_4bit": "true",
                                "actor.adam.lr": "1e-2", "algo.kl.init_coef": 0.01, "train.max_steps": 2,
                                "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 4, "rollout.max_new_tokens": 8,
                                "train.batch_size": 16, "train.micro_batch_size": 8, "train.num_threads": 1})
    trainer = RLTrainer.from_config(RLConfig.from_args(argv))
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in trainer.policy.modules()) == 2 * 7
    trainer.train()
    steps = [m for m in lines(out / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 2
    for m in steps:  # the engine's logprobs are the trainer's: both run the 4-bit layers
        assert m["rollout/logprob_gap_mean"] < 1e-4, m["rollout/logprob_gap_mean"]
    assert (out / "final" / "adapter_config.json").is_file()


def test_rl_with_the_vllm_engine_samples_with_the_dequantized_base_and_merged_adapters(ws, tmp_path):
    """`train rl --rollout.engine vllm --ds.load_in_4bit` in a subprocess whose `vllm` is the fake (an HF
    model behind the real weight-sync extension): vLLM loads the folder's float weights, so the dequantized
    4-bit base is sent before the first rollout, then the adapted modules after every step; the engine's
    logprobs are the trainer's forward on the 4-bit layers from the first step on."""
    out, log = tmp_path / "rl_vllm", tmp_path / "vllm.jsonl"
    argv = rl_flags(ws, out, **{"ds.lora.rank": 4, "ds.lora.alpha": 8, "ds.load_in_4bit": "true",
                                "ds.lora.target_modules": "q_proj,v_proj", "rollout.engine": "vllm",
                                "actor.adam.lr": "1e-2", "train.max_steps": 3, "rollout.batch_size": 4,
                                "rollout.n_samples_per_prompt": 4, "rollout.max_new_tokens": 8,
                                "train.batch_size": 16, "train.micro_batch_size": 8, "train.num_threads": 1})
    done = subprocess.run([sys.executable, "-m", "rlhfkit", "train", "rl", *argv], capture_output=True, text=True,
                          env={**os.environ, **fake_vllm_env(log)}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [(e["event"], e.get("tensors")) for e in fake_vllm_events(log) if e["event"] != "init"]
    # the whole dequantized model first; after each step the attention blocks (q, v adapted; k, o with them)
    assert events == [("load", 21), ("generate", None)] + [("load", 8), ("generate", None)] * 2 + [("load", 8)]
    steps = [m for m in lines(out / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 3
    for m in steps:
        assert m["rollout/logprob_gap_mean"] < 1e-4, m["rollout/logprob_gap_mean"]
    assert steps[-1]["actor/grad_norm"] > 0


def test_qlora_needs_lora_and_openrlhfs_flag_maps_onto_it(ws, tmp_path):
    with pytest.raises(ConfigError, match="--ds.lora.rank R"):
        RLConfig.from_args(rl_flags(ws, tmp_path, **{"ds.load_in_4bit": "true"}))
    with pytest.raises(ConfigError, match="--ds.lora.rank R"):  # under FSDP too (tests/integration/test_fsdp_qlora.py)
        RLConfig.from_args(rl_flags(ws, tmp_path, **{"ds.load_in_4bit": "true", "fsdp.enable": "true"}))
    cfg = RLConfig.from_args([*rl_flags(ws, tmp_path), "--load_in_4bit", "--lora_rank", "4"])
    assert cfg.ds.load_in_4bit and cfg.ds.lora.rank == 4


def test_rm_trains_adapters_and_its_float_head_over_a_4bit_backbone(ws, tmp_path):
    pairs = [{"prompt": f"{i} + {i} =", "chosen": f" {2 * i}", "rejected": f" {i}"} for i in range(16)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    cfg = RMConfig.from_args(["--model.model_name_or_path", str(ws / "tiny"), "--data.dataset",
                              str(tmp_path / "pairs.jsonl"), "--train.batch_size", "8", "--train.micro_batch_size",
                              "4", "--train.max_steps", "2", "--ds.lora.rank", "4", "--load_in_4bit",
                              "--ckpt.output_dir", str(tmp_path / "rm"), "--logger.progress_bar", "false"])
    trainer = RMTrainer.from_config(cfg)
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in trainer.model.modules()) == 2 * 7
    head = [p for n, p in trainer.model.named_parameters() if "score" in n and p.requires_grad]
    assert head and all(p.dtype == torch.float32 for p in head)  # the new head trains in float32
    assert torch.isfinite(torch.tensor(trainer.train()["loss"]))
