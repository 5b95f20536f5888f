"""Rollout throughput: HFEngine's decode loop vs plain `model.generate` on SmolLM2-135M-Instruct.

16 prompts x 8 samples x 16 new tokens at T=0.7 (no top-k/top-p), fp32 and bf16 autocast.
Prints generated tokens/s (stop tokens included, padding excluded) and the ratio, and the
engine with one sampling generator per prompt (`seeds=`, what the trainer uses: one multinomial
per prompt per token) against one generator for the whole batch.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/rollout_vs_generate.py [--cache-dir DIR] [--repeats N] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from rlhfkit.models import load_causal_lm, load_tokenizer, materialize_smollm2
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

QUESTIONS = [f"What is {a}+{b}?" for a, b in zip(range(3, 19), range(7, 55, 3))]


def run_engine(model, tok, prompts, params, dtype, seed):
    engine = HFEngine(model, tok, autocast_dtype=dtype)
    trajs = engine.generate(prompts, params, torch.Generator().manual_seed(seed))
    return sum(t.response_length for t in trajs)


def run_engine_seeded(model, tok, prompts, params, dtype, seed):
    engine = HFEngine(model, tok, autocast_dtype=dtype)
    seeds = torch.randint(0, 2**62, (len(prompts),), generator=torch.Generator().manual_seed(seed)).tolist()
    trajs = engine.generate(prompts, params, seeds=seeds)
    return sum(t.response_length for t in trajs)


def run_generate(model, tok, prompts, params, dtype, seed):
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    torch.manual_seed(seed)
    ctx = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    with torch.inference_mode(), ctx:
        out = model.generate(
            **enc, do_sample=True, temperature=params.temperature, top_k=0, top_p=1.0,
            max_new_tokens=params.max_new_tokens, num_return_sequences=params.n, pad_token_id=tok.pad_token_id,
        )
    new = out[:, enc["input_ids"].shape[1] :]
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    total = 0
    for row in new.tolist():  # count up to and including the first stop token
        stops = [i for i, t in enumerate(row) if t in eos]
        total += stops[0] + 1 if stops else len(row)
    return total


def timed(fn, repeats, *args):
    best, tokens = float("inf"), 0
    for r in range(repeats):
        start = time.perf_counter()
        tokens = fn(*args, r)
        best = min(best, time.perf_counter() - start)
    return tokens, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=Path("~/.cache/rlhfkit/models"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", action="store_true",
                    help="instead: torch.profiler's top ops of one bf16 rollout with per-prompt seeds (the trainer's)")
    args = ap.parse_args()
    start = time.perf_counter()
    folder = materialize_smollm2(args.cache_dir)
    print(f"materialize (or cache hit): {time.perf_counter() - start:.2f}s -> {folder}")
    start = time.perf_counter()
    model, tok = load_causal_lm(folder).eval(), load_tokenizer(folder)
    print(f"load folder: {time.perf_counter() - start:.2f}s   torch threads: {torch.get_num_threads()}")
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    params = SamplingParams(max_new_tokens=16, temperature=0.7, n=8)
    run_engine(model, tok, prompts[:2], SamplingParams(max_new_tokens=2, n=2), None, 0)  # warm-up
    if args.profile:
        profile(model, tok, prompts, params)
        return
    for name, dtype in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
        e_tok, e_s = timed(lambda r: run_engine(model, tok, prompts, params, dtype, r), args.repeats)
        g_tok, g_s = timed(lambda r: run_generate(model, tok, prompts, params, dtype, r), args.repeats)
        s_tok, s_s = timed(lambda r: run_engine_seeded(model, tok, prompts, params, dtype, r), args.repeats)
        e_rate, g_rate, s_rate = e_tok / e_s, g_tok / g_s, s_tok / s_s
        print(f"{name:14s} HFEngine per-prompt seeds {s_rate:7.1f} tok/s ({s_tok} tok, {s_s:.2f}s) | "
              f"vs one generator {s_rate / e_rate:.2f}x")
        print(
            f"{name:14s} HFEngine {e_rate:7.1f} tok/s ({e_tok} tok, {e_s:.2f}s) | "
            f"model.generate {g_rate:7.1f} tok/s ({g_tok} tok, {g_s:.2f}s) | ratio {e_rate / g_rate:.2f}x"
        )


def profile(model, tok, prompts, params) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run_engine_seeded(model, tok, prompts, params, torch.bfloat16, 0)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run_engine_seeded(model, tok, prompts, params, torch.bfloat16, 1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
