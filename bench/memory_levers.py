"""Peak memory of one update micro-batch (forward + backward of the policy's response logprobs),
with and without each memory lever, side by side: peak RSS on the CPU (and the CUDA peak when the
device is a GPU). Each setting runs in a fresh process (peak RSS only grows), on a model of
SmolLM2-135M's shape built from its config with random weights (no download).

    python bench/memory_levers.py                       # SmolLM2-135M shape, 4 x 512 tokens, CPU
    python bench/memory_levers.py --device cuda --batch 16 --layers 30

Levers: gradient checkpointing (--actor.gradient_checkpointing_enable), LoRA rank 16 on all linear
layers (--ds.lora.rank 16: no gradients and no optimizer state for the base weights; the optimizer
state is counted by one AdamW step). Reference offload (--ref.offload) changes only device memory:
it is measured with --device cuda (on the CPU it is a no-op).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LEVERS = ("none", "gradient_checkpointing", "lora", "ref_offload")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one(args) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.data.batch import collate
    from rlhfkit.data.types import Trajectory
    from rlhfkit.models import response_logprobs
    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.memory import SMOLLM2_CONFIG
    from rlhfkit.models.precision import enable_gradient_checkpointing, on_device, resolve_device

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    c = dict(SMOLLM2_CONFIG, num_hidden_layers=args.layers)
    config = LlamaConfig(**{k: v for k, v in c.items() if k != "attention_bias"}, attn_implementation="sdpa")
    policy = LlamaForCausalLM(config)
    ref = LlamaForCausalLM(config) if args.lever == "ref_offload" or args.with_ref else None
    if args.lever == "lora":
        policy = add_lora(policy, 16, 32, "all-linear")
    if args.lever == "gradient_checkpointing":
        enable_gradient_checkpointing(policy)
    policy.to(device).train()
    offload = args.lever == "ref_offload"
    if ref is not None:
        ref.eval().requires_grad_(False).to("cpu" if offload else device)
    g = torch.Generator().manual_seed(1)
    prompt, resp = args.tokens // 2, args.tokens - args.tokens // 2
    trajs = [Trajectory(prompt_ids=torch.randint(0, c["vocab_size"], (prompt,), generator=g),
                        response_ids=torch.randint(0, c["vocab_size"], (resp,), generator=g),
                        loss_mask=torch.ones(resp, dtype=torch.bool), logprobs=torch.zeros(resp),
                        finish_reason="length", version=0, group_id=i) for i in range(args.batch)]
    batch = collate(trajs, pad_id=0)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    base = rss_mib()
    t0 = time.perf_counter()
    if ref is not None:
        with torch.no_grad(), on_device(ref, device if offload else None):
            response_logprobs(ref, batch)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logp, _ = response_logprobs(policy, batch)
    (-(logp.float() * batch.loss_mask.to(logp.device)).sum() / batch.loss_mask.sum()).backward()
    opt.step()
    out = {"lever": args.lever, "seconds": round(time.perf_counter() - t0, 2), "rss_before_mib": round(base),
           "peak_rss_mib": round(rss_mib())}
    if device.type == "cuda":
        out["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=512, help="prompt + response tokens per sample")
    ap.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M: 30)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levers", default=",".join(LEVERS[:3]))
    ap.add_argument("--with_ref", action="store_true", help="also hold a reference (always with ref_offload)")
    ap.add_argument("--lever", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lever is not None:
        print(json.dumps(one(args)))
        return
    rows = []
    for lever in args.levers.split(","):
        cmd = [sys.executable, __file__, "--lever", lever, *sys.argv[1:]]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))
    keys = [k for k in rows[0] if k != "lever"]
    print(f"{'lever':<24}" + "".join(f"{k:>16}" for k in keys))
    for r in rows:
        print(f"{r['lever']:<24}" + "".join(f"{r.get(k, ''):>16}" for k in keys))
    print(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "lever"}, "rows": rows}))


if __name__ == "__main__":
    main()
