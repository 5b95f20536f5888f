"""The GPU check's runs of what users run (bench/gpu_check.py starts each in its own process, so each
has its own peak memory, and prints one summary line per check). Random-weight models built from a
config (`gpu_check.build_model_folder`): real weights do not fit the files shipped to the GPU machine.

  sdpa_prefix    shared-prefix logprobs vs the same samples as padded rows, rows under and over
                 EAGER_ROW_TOKENS (512), and the attention each ran (SDPA on a GPU, eager on the CPU)
  learning       GRPO on a reward a random model can learn (the share of response tokens in the lower
                 half of the vocabulary, sampling top-k 8): the reward of the last steps vs the first
  ppo            PPO (gae) with a critic, a reference model, the KL loss and --ref.offload
  fsdp           `torchrun --nproc_per_node 1 ... --fsdp.enable true` (NCCL on a GPU, gloo on the CPU):
                 one update, a sharded checkpoint, then a resumed run from it
  compiled       --rollout.compile_decode vs the eager loop: tokens/s, peak memory, CUDA graph
                 recordings (cudagraph trees) and the static buffers' allocations and shapes
  big_shape      gradient checkpointing and bf16 parameters with float32 masters at the 1.5B shape
  long           long responses (1k-4k new tokens): peak memory of rollout and update vs `plan`'s estimate
  memory         memory after each of 20 steps (allocated on a GPU, RSS on the CPU): stable, not growing
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LEARN_LR = 1e-3  # Adam; --quick (tiny model): 3x. Measured on the CPU: tiny 0.53 -> 1.0 in 6 steps at 3e-3


def _device(a):
    import torch

    return torch.device(a.device)


def _sync(a) -> None:
    import torch

    if a.device == "cuda":
        torch.cuda.synchronize()


def _gpu_peak_reset(a) -> None:
    import torch

    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _gpu_peak_gib(a) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else None


def low_half_reward(vocab: int):
    """TRL-style reward: the share of response tokens whose id is in the lower half of the vocabulary."""
    def reward(completions, completion_ids, **_) -> list[float]:
        return [sum(t < vocab // 2 for t in ids) / max(len(ids), 1) for ids in completion_ids]
    return reward


def rl_run(a, flags: dict, steps: int, reward_fn, out: Path):
    """An RLTrainer run on `a.model_dir` (GRPO unless `flags` say otherwise); (trainer, history)."""
    from gpu_check import autocast, records

    import rlhfkit

    quick = a.size == "quick"
    base = {"actor.model_name_or_path": a.model_dir, "actor.device": a.device, "rollout.batch_size": 2 if quick else 8,
            "rollout.n_samples_per_prompt": 4 if quick else 8, "rollout.max_new_tokens": 8 if quick else 64,
            "train.micro_batch_size": 4 if quick else 16, "train.max_steps": steps, "actor.lr_scheduler": "constant",
            "actor.autocast": autocast(a.device), "data.input_key": "prompt", "data.apply_chat_template": "true",
            "ckpt.output_dir": out, "logger.progress_bar": "false", "logger.log_samples": 0}
    base.update(flags)
    base.setdefault("train.batch_size", int(base["rollout.batch_size"]) * int(base["rollout.n_samples_per_prompt"]))
    cfg = rlhfkit.RLConfig.from_args([x for k, v in base.items() for x in (f"--{k}", str(v))])
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=reward_fn,
                                            train_dataset=records(int(base["rollout.batch_size"]) * steps))
    history = trainer.loop.train()
    trainer.tracker.close()
    return trainer, history


def _vocab(a) -> int:
    return json.loads((Path(a.model_dir) / "config.json").read_text())["vocab_size"]


# ------------------------------------------------------------------ the checks
def check_sdpa_prefix(a) -> dict:
    import torch

    from rlhfkit.data.batch import collate
    from rlhfkit.data.packing import pack_shared_prefix
    from rlhfkit.data.types import Trajectory
    from rlhfkit.models import load_causal_lm, response_logprobs
    from rlhfkit.models.logprobs import (
        EAGER_ROW_TOKENS,
        attention_for,
        parameter_device_type,
    )

    model = load_causal_lm(a.model_dir).to(a.device).eval()
    g = torch.Generator().manual_seed(0)
    vocab = _vocab(a)
    out = {"device_type": parameter_device_type(model)}
    for label, prompt_len in (("under_512", 200), ("over_512", 700)):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g)
        trajs = [Trajectory(prompt, r, torch.ones(len(r), dtype=torch.bool), torch.zeros(len(r)), "stop", 0, 0)
                 for r in (torch.randint(0, vocab, (n,), generator=g) for n in (48, 32, 40, 16))]
        padded = collate(trajs, 0)
        shared = pack_shared_prefix(padded, torch.arange(len(trajs)), 0, max_row_tokens=4096)
        with attention_for(model, shared):
            ran = model.config._attn_implementation
        with torch.no_grad():
            a_lp = response_logprobs(model, shared)[0]
            b_lp = response_logprobs(model, padded)[0]
        mask = shared.response_mask
        out[label] = {"row_tokens": int(shared.attention_mask.shape[-1]), "attention": ran,
                      "max_abs_diff": float((a_lp.cpu() - b_lp.cpu()).abs()[mask].max())}
    ok = all(out[k]["max_abs_diff"] < 1e-3 for k in ("under_512", "over_512"))
    expect = "sdpa" if out["device_type"] != "cpu" else "eager"
    out["summary"] = (f"sdpa_prefix: {'OK' if ok else 'FAIL'} max|diff| {out['under_512']['max_abs_diff']:.1e} "
                      f"(<= {EAGER_ROW_TOKENS} tokens, {out['under_512']['attention']}, expected {expect}) / "
                      f"{out['over_512']['max_abs_diff']:.1e} (> {EAGER_ROW_TOKENS}, {out['over_512']['attention']})")
    return out


def check_learning(a) -> dict:
    quick = a.size == "quick"
    steps = 10 if quick else 30
    # top-k 8: a random model's near-uniform softmax over 49k tokens gives each token too few samples to
    # learn from; among its 8 likeliest tokens per position each sampled token's gradient counts
    flags = {"actor.adam.lr": LEARN_LR * (3 if quick else 1), "rollout.batch_size": 4,
             "rollout.n_samples_per_prompt": 8, "rollout.max_new_tokens": 16 if quick else 32,
             "train.micro_batch_size": 16 if quick else 32, "rollout.top_k": 8}
    _, history = rl_run(a, flags, steps, low_half_reward(_vocab(a)), Path(a.work) / "learning")
    rewards = [m["reward"] for m in history]
    k = max(1, len(rewards) // 5)
    first, last = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    return {"rewards": rewards, "first": first, "last": last,
            "summary": f"learning: {'OK' if last > first + 0.05 else 'FAIL'} reward {first:.3f} -> {last:.3f} "
                       f"over {len(rewards)} steps (lower-half-vocabulary share)"}


def check_ppo(a) -> dict:
    flags = {"algo.advantage.estimator": "gae", "critic.adam.lr": 1e-5, "algo.kl.init_coef": 0.01,
             "algo.kl.use_loss": "true", "algo.kl.estimator": "k3", "ref.offload": "true", "actor.adam.lr": 1e-5}
    trainer, history = rl_run(a, flags, 3, low_half_reward(_vocab(a)), Path(a.work) / "ppo")
    last = history[-1]
    keys = [k for k in ("policy_loss", "value_loss", "kl_loss", "kl") if k in last]
    finite = all(math.isfinite(v) for m in history for k, v in m.items() if k in keys)
    ref = getattr(getattr(trainer.loop, "experience", None), "ref", None)
    ref_device = str(next(ref.parameters()).device) if ref is not None else "none"
    return {"last": {k: last[k] for k in keys}, "ref_device_between_passes": ref_device,
            "memory": {k: v for k, v in last.items() if k.startswith("memory/")},
            "summary": f"ppo: {'OK' if finite and 'value_loss' in last else 'FAIL'} gae + critic + ref (offload, "
                       f"on {ref_device} between passes) + KL loss, {len(history)} steps, "
                       + ", ".join(f"{k} {last[k]:.3g}" for k in keys)}


def check_fsdp(a) -> dict:
    """Runs torchrun itself (this check's process is only the launcher)."""
    out_dir = Path(a.work) / "fsdp"
    quick = a.size == "quick"
    prompts = out_dir / "prompts.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps({"q": f"Count to {i}:"}) + "\n" for i in range(16)))
    reward = out_dir / "reward.py"
    reward.write_text("def reward_func(queries, prompts, labels, **kw):\n"
                      "    return [len(set(q[len(p):])) / 8.0 for q, p in zip(queries, prompts)]\n")
    common = ["--actor.model_name_or_path", a.model_dir, "--data.prompt_dataset", str(prompts), "--data.input_key",
              "q", "--reward.remote_url", str(reward), "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt",
              "4", "--rollout.max_new_tokens", "8" if quick else "32", "--train.batch_size", "8",
              "--train.micro_batch_size", "4", "--actor.adam.lr", "1e-5", "--logger.progress_bar", "false",
              "--ckpt.output_dir", str(out_dir / "run"), "--ckpt.save_steps", "1", "--fsdp.enable", "true"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    runs = {}
    for name, extra in (("first", ["--train.max_steps", "1"]), ("resumed", ["--train.max_steps", "2",
                                                                           "--ckpt.load_enable", "true"])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--standalone", "-m",
               "rlhfkit.cli.main", "train", "rl", *common, *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.child_timeout, env=env, cwd=REPO,
                              check=False)
        runs[name] = {"exit": proc.returncode, "wall_s": time.perf_counter() - t0}
        if proc.returncode != 0:
            runs[name]["log_tail"] = (proc.stdout + proc.stderr)[-2000:]
    steps = [json.loads(ln)["step"] for ln in (out_dir / "run" / "metrics.jsonl").read_text().splitlines()
             if ln.strip() and "step" in json.loads(ln)] if (out_dir / "run" / "metrics.jsonl").exists() else []
    checkpoints = sorted(p.name for p in (out_dir / "run" / "checkpoints").glob("*")) \
        if (out_dir / "run" / "checkpoints").exists() else []
    ok = all(r["exit"] == 0 for r in runs.values()) and len(checkpoints) >= 1
    return {"runs": runs, "logged_steps": steps, "checkpoints": checkpoints,
            "summary": f"fsdp: {'OK' if ok else 'FAIL'} torchrun x1 ({'nccl' if a.device == 'cuda' else 'gloo'}): "
                       f"update + sharded save (exit {runs['first']['exit']}), resume (exit "
                       f"{runs['resumed']['exit']}), checkpoints {checkpoints}, steps logged {steps}"}


def check_compiled(a) -> dict:
    import torch
    from gpu_check import records

    import rlhfkit.models.compile as compile_module
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.rollout.base import SamplingParams
    from rlhfkit.rollout.hf import HFEngine

    quick = a.size == "quick"
    tok = load_tokenizer(a.model_dir)
    model = load_causal_lm(a.model_dir).to(a.device).eval()
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
           for r in records(4 if quick else 16)]
    params = SamplingParams(max_new_tokens=8 if quick else 128, temperature=1.0, n=4 if quick else 8)
    if a.device == "cpu":  # the compiled step's inputs stepped eagerly: inductor on the CPU is no faster
        compile_module.compile_decode_step = lambda m, on_cpu=False: compile_module._call
    dtype = torch.bfloat16 if a.device == "cuda" else None
    out = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        engine = HFEngine(model, tok, autocast_dtype=dtype, compile_decode=compiled,
                          max_batch_size=4 * params.n)  # several chunks: the buffers must be reused
        engine.generate(ids, params, seeds=list(range(len(ids))))  # warm-up (the compile)
        _gpu_peak_reset(a)
        _sync(a)
        t0 = time.perf_counter()
        trajs = engine.generate(ids, params, seeds=list(range(100, 100 + len(ids))))
        _sync(a)
        out[name] = {"tokens_per_s": sum(t.response_length for t in trajs) / (time.perf_counter() - t0),
                     "peak_gpu_gib": _gpu_peak_gib(a), "compiled_step": engine._compiled_step is not None}
        if compiled:
            out[name].update(static_buffer_allocations=engine.static_buffers.allocations,
                             static_shapes=len(engine.static_buffers.shapes), cudagraph_recordings=_recordings())
    c, e = out["compiled"], out["eager"]
    return {**out, "speedup": c["tokens_per_s"] / e["tokens_per_s"],
            "summary": f"compiled: {'on' if c['compiled_step'] else 'OFF (fell back)'} {c['tokens_per_s']:.0f} vs "
                       f"eager {e['tokens_per_s']:.0f} tokens/s ({c['tokens_per_s'] / e['tokens_per_s']:.2f}x), "
                       f"graph recordings {c['cudagraph_recordings']}, buffer allocations "
                       f"{c['static_buffer_allocations']}, shapes {c['static_shapes']}"}


def _recordings():
    """CUDA graph recordings of torch.compile's cudagraph trees so far (None off CUDA / unknown)."""
    from torch._dynamo.utils import counters

    value = counters.get("inductor", {}).get("cudagraph_recorded_non_static_inputs")
    graphs = sum(v for k, v in counters.get("inductor", {}).items() if "cudagraph" in k)
    return graphs if graphs else value


def check_big_shape(a) -> dict:
    flags = {"actor.gradient_checkpointing_enable": "true", "actor.dtype": "bfloat16", "actor.adam.lr": 1e-6,
             "rollout.max_new_tokens": 8 if a.size == "quick" else 64}
    _, history = rl_run(a, flags, 2, low_half_reward(_vocab(a)), Path(a.work) / "big")
    last = history[-1]
    return {"update_s": last.get("time/update"), "memory": {k: v for k, v in last.items() if k.startswith("memory/")},
            "summary": f"big_shape: OK gradient checkpointing + bf16 params / fp32 masters, update "
                       f"{last.get('time/update', float('nan')):.2f} s, peak update memory "
                       f"{_gib(last.get('memory/update_peak_gib'))}"}


def _gib(value) -> str:
    return "n/a (CPU)" if value is None else f"{value:.2f} GiB"


def check_long(a) -> dict:
    import rlhfkit
    from rlhfkit.cli.plan_cmd import model_config
    from rlhfkit.core.advantages import ESTIMATORS
    from rlhfkit.models.memory import memory_estimate

    out = {}
    for new in ((32, 64) if a.size == "quick" else (1024, 4096)):
        flags = {"rollout.max_new_tokens": new, "rollout.batch_size": 2, "rollout.n_samples_per_prompt": 4,
                 "train.micro_batch_size": 2, "actor.adam.lr": 1e-6, "train.batch_size": 8}
        _, history = rl_run(a, flags, 1, low_half_reward(_vocab(a)), Path(a.work) / f"long{new}")
        m = history[-1]
        cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", a.model_dir])
        mcfg, _ = model_config(a.model_dir)
        est = memory_estimate(mcfg, param_dtype="float32", compute_dtype=cfg.actor.autocast or "float32",
                              micro_batch_size=2, decode_batch=8, prompt_len=64, max_new_tokens=new, with_ref=False,
                              with_critic=ESTIMATORS["group_norm"].needs_critic) if mcfg else {}
        out[str(new)] = {"response_tokens": m.get("response_tokens"),
                         "generate_peak_gib": m.get("memory/generate_peak_gib"),
                         "update_peak_gib": m.get("memory/update_peak_gib"),
                         "plan_kv_cache_gib": est.get("kv_cache", 0) / 2**30,
                         "plan_peak_gib": est.get("peak", 0) / 2**30}
    parts = [f"{k} tokens: rollout {_gib(v['generate_peak_gib'])} / update {_gib(v['update_peak_gib'])} "
             f"(plan: peak {v['plan_peak_gib']:.2f} GiB, KV cache {v['plan_kv_cache_gib']:.2f})"
             for k, v in out.items()]
    return {**out, "summary": "long: OK " + "; ".join(parts)}


def check_memory(a) -> dict:
    import resource

    import torch

    steps = 5 if a.size == "quick" else 20
    seen = []

    def after_step(loop, step, metrics):
        if a.device == "cuda":
            seen.append(torch.cuda.memory_allocated() / 2**30)
        else:
            seen.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)

    import rlhfkit.trainers.rl.loop as loop_module

    real = loop_module.RLLoop.train

    def train(self, *args, **kwargs):
        self.callbacks.append(after_step)
        return real(self, *args, **kwargs)

    loop_module.RLLoop.train = train
    try:
        rl_run(a, {"actor.adam.lr": 1e-6}, steps, low_half_reward(_vocab(a)), Path(a.work) / "memory")
    finally:
        loop_module.RLLoop.train = real
    later = seen[1:] or seen
    growth = (later[-1] - later[0]) if later else float("nan")
    what = "allocated GiB" if a.device == "cuda" else "peak RSS GiB"
    return {"after_each_step": seen, "growth": growth,
            "summary": f"memory: {'OK' if later and growth <= 0.05 * max(later[0], 1e-9) + 0.01 else 'GROWING'} "
                       f"{what} after steps 2..{len(seen)}: {later[0]:.3f} -> {later[-1]:.3f}" if later
                       else "memory: FAIL no step recorded"}


CHECKS = {"sdpa_prefix": check_sdpa_prefix, "learning": check_learning, "ppo": check_ppo, "fsdp": check_fsdp,
          "compiled": check_compiled, "big_shape": check_big_shape, "long": check_long, "memory": check_memory}
# the model shape each check runs at (full run; --quick: tiny), and its time cap on one H200 (seconds)
SHAPE_OF = {"big_shape": "qwen2-1.5b"}
CAPS = {"sdpa_prefix": 30, "learning": 60, "ppo": 40, "fsdp": 60, "compiled": 90, "big_shape": 50, "long": 70,
        "memory": 40}
