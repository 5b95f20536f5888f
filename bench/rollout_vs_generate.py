"""Rollout throughput: HFEngine's decode loop vs plain `model.generate` on SmolLM2-135M-Instruct.

16 prompts x 8 samples x 16 new tokens at T=0.7 (no top-k/top-p) by default, fp32 and bf16
autocast. Prints generated tokens/s (stop tokens included, padding excluded) and the ratio, and the
engine with one sampling generator per prompt (`seeds=`, what the trainer uses) against one
generator for the whole batch; and the decode FLOP limit of the same run: 2 x parameters FLOPs per
generated token at the fp32 (or bf16) matmul rate of a 1024^2 probe, and the engine's time over it.
The decode bandwidth limit of the same run: the bytes a decode step must read (every weight once, in
the dtype the matmuls read: bf16 under autocast or with bf16 weights, plus the KV cache of every
row) over the read bandwidth of a probe (the sum of a 512 MiB tensor), summed over the steps;
printed as the engine's share of it (100% = at the limit). In bf16 the engine decodes over its bf16
copy of the weights (rollout.bf16_decode); a row without it (the model's forward under autocast) is
timed in the same run. `--bf16-weights` adds the engine over a
bf16 copy of the model with float32 norms (what `--actor.dtype bfloat16` decodes with: the
trainer's module itself, refreshed after every optimizer step) under bf16 autocast.
`--compile` adds the engine with `compile_decode=True` (and `compile_on_cpu=True` on the CPU, where the
engine otherwise decodes eagerly); its first call, which compiles, untimed.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/rollout_vs_generate.py [--prompts 4 --n 4] [--dtype fp32] [--compile]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/rollout_vs_generate.py --profile [--prompts 4 --n 4] [--dtype fp32]
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

DTYPES = {"fp32": None, "bf16": torch.bfloat16}
QUESTIONS = [f"What is {a}+{b}?" for a, b in zip(range(3, 19), range(7, 55, 3))]


def run_engine(model, tok, prompts, params, dtype, seed, compile_decode=False):
    engine = HFEngine(model, tok, autocast_dtype=dtype, compile_decode=compile_decode)
    trajs = engine.generate(prompts, params, torch.Generator().manual_seed(seed))
    return sum(t.response_length for t in trajs)


def run_engine_seeded(model, tok, prompts, params, dtype, seed, compile_decode=False, bf16_decode=True):
    engine = HFEngine(model, tok, autocast_dtype=dtype, compile_decode=compile_decode, compile_on_cpu=compile_decode,
                      bf16_decode=bf16_decode)
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


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    reps = reps if dtype == torch.float32 else 2  # bf16 is ~100x slower on a CPU without native bf16
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def read_gbytes_per_s(mib: int = 512, reps: int = 5) -> float:
    """Memory read bandwidth: the sum of a `mib` MiB float32 tensor (larger than the caches), best of `reps`."""
    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return mib * 2**20 / best / 1e9


def decode_bytes(model, rows: int, prompt_len: int, max_new: int, weight_bytes: int) -> float:
    """Bytes the decode steps of one rollout read at least: each step every weight once (`weight_bytes`
    per element; the embedding reads only its rows, counted once with the tied head) and the KV cache
    of `rows` rows (bf16) at the step's length; all rows counted at every step (an upper bound of the
    KV part: finished rows leave the batch)."""
    c = model.config
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2
    weights = sum(p.numel() for p in model.parameters()) * weight_bytes
    kv = sum(rows * (prompt_len + t) * kv_per_token for t in range(max_new))
    return max_new * weights + kv


def bf16_weights_copy(model):
    """A bf16 copy of `model` with float32 norms (models.precision.vectors_to_float32)."""
    import copy

    from rlhfkit.models.precision import vectors_to_float32

    twin = copy.deepcopy(model).to(torch.bfloat16)
    vectors_to_float32(twin)
    return twin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=Path("~/.cache/rlhfkit/models"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--compile", action="store_true", help="also the engine with compile_decode=True")
    ap.add_argument("--bf16-weights", action="store_true", help="also the engine over a bf16 copy of the weights")
    ap.add_argument("--profile", action="store_true",
                    help="instead: torch.profiler's top ops of one rollout with per-prompt seeds (the trainer's)")
    args = ap.parse_args()
    start = time.perf_counter()
    folder = materialize_smollm2(args.cache_dir)
    print(f"materialize (or cache hit): {time.perf_counter() - start:.2f}s -> {folder}")
    start = time.perf_counter()
    model, tok = load_causal_lm(folder).eval(), load_tokenizer(folder)
    print(f"load folder: {time.perf_counter() - start:.2f}s   torch threads: {torch.get_num_threads()}")
    questions = (QUESTIONS * (-(-args.prompts // len(QUESTIONS))))[: args.prompts]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    params = SamplingParams(max_new_tokens=args.max_new, temperature=0.7, n=args.n)
    dtypes = [(name, DTYPES[name]) for name in args.dtype.split(",")]
    run_engine(model, tok, prompts[:2], SamplingParams(max_new_tokens=2, n=2), None, 0)  # warm-up
    print(f"{args.prompts} prompts x {args.n} samples x {args.max_new} new tokens, T 0.7")
    if args.profile:
        profile(model, tok, prompts, params, dtypes[0][1])
        return
    n_params = sum(p.numel() for p in model.parameters())
    bandwidth = read_gbytes_per_s()
    prompt_len = sum(len(p) for p in prompts) / len(prompts)
    rows = args.prompts * args.n
    print(f"read bandwidth probe {bandwidth:.1f} GB/s; prompts {prompt_len:.0f} tokens on average")

    def bandwidth_share(seconds: float, weight_bytes: int) -> str:
        limit = decode_bytes(model, rows, prompt_len, args.max_new, weight_bytes) / (bandwidth * 1e9)
        return f"decode bandwidth limit {limit:.2f}s: the engine at {limit / seconds:.0%} of it"

    for name, dtype in dtypes:
        e_tok, e_s = timed(lambda r: run_engine(model, tok, prompts, params, dtype, r), args.repeats)
        g_tok, g_s = timed(lambda r: run_generate(model, tok, prompts, params, dtype, r), args.repeats)
        s_tok, s_s = timed(lambda r: run_engine_seeded(model, tok, prompts, params, dtype, r), args.repeats)
        e_rate, g_rate, s_rate = e_tok / e_s, g_tok / g_s, s_tok / s_s
        limit_s = 2 * n_params * s_tok / (matmul_gflops(dtype or torch.float32) * 1e9)
        print(f"{name:6s} HFEngine per-prompt seeds {s_rate:7.1f} tok/s ({s_tok} tok, {s_s:.2f}s) | "
              f"vs one generator {s_rate / e_rate:.2f}x | decode FLOP limit {limit_s:.2f}s: {s_s / limit_s:.2f}x it | "
              f"{bandwidth_share(s_s, 4 if dtype is None else 2)}")
        print(
            f"{name:6s} HFEngine {e_rate:7.1f} tok/s ({e_tok} tok, {e_s:.2f}s) | "
            f"model.generate {g_rate:7.1f} tok/s ({g_tok} tok, {g_s:.2f}s) | ratio {e_rate / g_rate:.2f}x"
        )
        if dtype is not None:  # the engine's forwards through the model under autocast (no bf16 copy)
            f_tok, f_s = timed(lambda r: run_engine_seeded(model, tok, prompts, params, dtype, r, bf16_decode=False),
                               args.repeats)
            print(f"{name:6s} HFEngine without its bf16 copy (the model's forward under autocast), per-prompt seeds "
                  f"{f_tok / f_s:7.1f} tok/s ({f_tok} tok, {f_s:.2f}s) | the bf16 copy {f_s / s_s:.2f}x faster | "
                  f"{bandwidth_share(f_s, 2)}")
        if args.bf16_weights and dtype is not None:
            twin = bf16_weights_copy(model)
            w_tok, w_s = timed(lambda r: run_engine_seeded(twin, tok, prompts, params, dtype, r), args.repeats)
            print(f"{name:6s} HFEngine bf16 weights, per-prompt seeds {w_tok / w_s:7.1f} tok/s ({w_tok} tok, "
                  f"{w_s:.2f}s) | vs model.generate {w_tok / w_s / g_rate:.2f}x | vs autocast over float32 "
                  f"{s_s / w_s:.2f}x | {bandwidth_share(w_s, 2)}")
            del twin
        if args.compile:
            t0 = time.perf_counter()
            run_engine_seeded(model, tok, prompts, params, dtype, 0, compile_decode=True)
            first = time.perf_counter() - t0
            c_tok, c_s = timed(lambda r: run_engine_seeded(model, tok, prompts, params, dtype, r, True), args.repeats)
            print(f"{name:6s} HFEngine compile_decode {c_tok / c_s:7.1f} tok/s ({c_tok} tok, {c_s:.2f}s; first call "
                  f"{first:.0f}s) | vs eager {s_s / c_s:.2f}x | {c_s / limit_s:.2f}x the decode FLOP limit")


def profile(model, tok, prompts, params, dtype) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run_engine_seeded(model, tok, prompts, params, dtype, 0)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run_engine_seeded(model, tok, prompts, params, dtype, 1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
