"""Peak memory of the knowledge-distillation loss (forward + backward of KL(teacher || student) over
the vocabulary), direct from both models' logits vs chunked over positions from their hidden
states (core.distill.linear_forward_kl), at SmolLM2-135M's head shape (V 49152, H 576) with random
weights. Each setting runs in a fresh process (peak RSS only grows); on CUDA the allocator's peak.

    python bench/kd_memory.py                          # CPU, 512 / 2048 / 4096 positions
    python bench/kd_memory.py --device cuda --rows 2048,8192,32768

The direct loss keeps [positions, V] float32 logits and softmaxes of both models (its memory grows
with positions x V); the chunked one keeps [chunk, V] at a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(args) -> dict:
    import torch

    from rlhfkit.core.distill import forward_kl_from_logits, linear_forward_kl

    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    vocab, hidden = 49152, 576
    h_s = torch.randn(args.rows, hidden, generator=g, device=device, requires_grad=True)
    w_s = (torch.randn(vocab, hidden, generator=g, device=device) * 0.02).requires_grad_()
    h_t = torch.randn(args.rows, hidden, generator=g, device=device)
    w_t = torch.randn(vocab, hidden, generator=g, device=device) * 0.02
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = rss_mib()
    t0 = time.perf_counter()
    if args.mode == "direct":
        kl = forward_kl_from_logits(h_s @ w_s.T, h_t @ w_t.T)
    else:
        kl = linear_forward_kl(h_s, w_s, h_t, w_t, chunk_size=args.chunk_size)
    kl.mean().backward()
    out = {"mode": args.mode, "rows": args.rows, "chunk_size": args.chunk_size if args.mode == "chunked" else None,
           "seconds": round(time.perf_counter() - t0, 2), "kl_mean": round(float(kl.mean()), 6),
           "rss_peak_over_inputs_mib": round(rss_mib() - base, 1)}
    if device.type == "cuda":
        torch.cuda.synchronize()
        out["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", default="512,2048,4096", help="comma-separated numbers of response positions")
    p.add_argument("--chunk_size", type=int, default=1024)
    p.add_argument("--mode", choices=("direct", "chunked"), help=argparse.SUPPRESS)  # one setting (child)
    args = p.parse_args()
    if args.mode is not None:
        args.rows = int(args.rows)
        print(json.dumps(one(args)))
        return
    for rows in args.rows.split(","):
        for mode in ("direct", "chunked"):
            cmd = [sys.executable, __file__, "--device", args.device, "--rows", rows, "--mode", mode,
                   "--chunk_size", str(args.chunk_size)]
            print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
