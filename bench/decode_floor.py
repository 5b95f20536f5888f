"""Where one bf16 decode step's time goes: the HF engine's step over its bf16 copy of SmolLM2-135M-Instruct
(rollout.bf16_decode) against the floors it cannot go below with the kernels this torch has.

One process, side by side, on the engine's own cache (rows x a prompt of --prompt tokens, prefilled once, then
--steps decode steps; medians of --repeats rounds):

- step: the engine's decode step as the rollout runs it (bf16 autocast, its packed oneDNN bf16 matrices);
- matmuls only: the same step's 4 linear maps per layer and the LM head at the same rows, back to back
  (the fastest bf16 product this torch has for them: oneDNN's packed kernel);
- everything else: the step with each linear map's product replaced by a precomputed tensor of its shape
  (norms, rotary embedding, KV-cache writes, attention, residual adds, casts: ~60 small ops per layer);
- the bandwidth limit: the step's bytes (every weight once in bf16, plus the KV cache) over a read probe
  (the sum of a 512 MiB tensor); and the bf16 FLOP limit: 2 x parameters x rows at a 1024^2 bf16 matmul's rate.

Prints each as milliseconds and as a share of the bandwidth limit (100% = at the limit).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/decode_floor.py [--rows 16] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_vs_generate import matmul_gflops, read_gbytes_per_s  # noqa: E402

from rlhfkit.models import load_causal_lm, materialize_smollm2  # noqa: E402
from rlhfkit.models.memory import kv_cache_bytes  # noqa: E402
from rlhfkit.rollout.bf16_decode import Bf16Decoder, _Linear, bf16_decode_support, packed_kernels  # noqa: E402
from rlhfkit.rollout.decode_attention import decode_attention  # noqa: E402
from rlhfkit.rollout.kv_cache import new_cache  # noqa: E402


def decode_steps(decoder: Bf16Decoder, model, rows: int, prompt: int, steps: int) -> float:
    """Median seconds of `steps` decode steps after a prefill of `rows` x `prompt` random tokens."""
    ids = torch.randint(100, 40000, (rows, prompt), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model, reserve=steps)
    mask = torch.ones(rows, prompt, dtype=torch.long)
    logits = decoder.forward(ids, mask, torch.arange(prompt).expand(rows, prompt), cache)
    times = []
    for s in range(steps):
        token = logits.argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], 1)
        t0 = time.perf_counter()
        logits = decoder.forward(token, mask, torch.full((rows, 1), prompt + s), cache)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmuls_only(decoder: Bf16Decoder, model, rows: int, steps: int) -> float:
    """Median seconds of one step's linear maps at `rows` rows, back to back."""
    c = model.config
    x = {n: torch.randn(rows, 1, n).to(torch.bfloat16) for n in (c.hidden_size, c.intermediate_size)}
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for qkv, o, gate_up, down in decoder.layers:
            qkv(x[c.hidden_size]), o(x[c.hidden_size]), gate_up(x[c.hidden_size]), down(x[c.intermediate_size])
        decoder.head(x[c.hidden_size][:, 0])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def without_matmuls(decoder: Bf16Decoder, model, rows: int, prompt: int, steps: int) -> float:
    """`decode_steps` with every linear map's product served from a table (one tensor per map and input shape)."""
    real, table = _Linear.__call__, {}

    def served(self, x):
        key = (id(self), tuple(x.shape))
        if key not in table:
            table[key] = real(self, x)
        return table[key]

    _Linear.__call__ = served
    try:
        decode_steps(decoder, model, rows, prompt, 2)  # fills the table for the decode shapes
        return decode_steps(decoder, model, rows, prompt, steps)
    finally:
        _Linear.__call__ = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="rows decoded together (the small RL size: 4 x 4)")
    ap.add_argument("--prompt", type=int, default=40, help="tokens in each row's cache before the first step")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_causal_lm(materialize_smollm2()).eval()
    if reason := bf16_decode_support(model):
        raise SystemExit(f"the bf16 decode step does not apply: {reason}")
    if not packed_kernels():
        print("no packed oneDNN bf16 kernels here (no AVX512-BF16 / AMX): the copy uses plain bf16 products")
    decoder = Bf16Decoder(model)
    c = model.config
    weights = sum(p.numel() for p in model.parameters())
    step_bytes = 2 * weights + kv_cache_bytes(c.to_dict(), args.rows, args.prompt + args.steps // 2, 2)  # bf16
    bandwidth, bf16_rate = read_gbytes_per_s(), matmul_gflops(torch.bfloat16)
    limit = step_bytes / (bandwidth * 1e9)
    flop_limit = 2 * weights * args.rows / (bf16_rate * 1e9)
    print(f"torch threads {torch.get_num_threads()}; read probe {bandwidth:.1f} GB/s; bf16 1024^2 matmul "
          f"{bf16_rate:.0f} GFLOP/s; {args.rows} rows, {args.prompt}-token prompts, {args.steps} steps")
    rounds = {"step": [], "matmuls only": [], "everything else": []}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), decode_attention(model):
        decoder.refresh()
        for _ in range(args.repeats):
            rounds["step"].append(decode_steps(decoder, model, args.rows, args.prompt, args.steps))
            rounds["matmuls only"].append(matmuls_only(decoder, model, args.rows, args.steps))
            rounds["everything else"].append(without_matmuls(decoder, model, args.rows, args.prompt, args.steps))
    print(f"{'bandwidth limit':16s} {limit * 1e3:7.2f} ms  ({step_bytes / 1e6:.0f} MB per step)")
    print(f"{'bf16 FLOP limit':16s} {flop_limit * 1e3:7.2f} ms  (the step's products at the 1024^2 probe's rate)")
    for name, values in rounds.items():
        ms = statistics.median(values) * 1e3
        print(f"{name:16s} {ms:7.2f} ms  at {limit * 1e3 / ms:4.0%} of the bandwidth limit  "
              f"(rounds: {', '.join(f'{v * 1e3:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
