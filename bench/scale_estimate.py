"""The worked estimate of docs/scaling.md: step time of GRPO on a 7B model on 8 GPUs, sync vs async.

Arithmetic only (no GPU was lent to the task that wrote it); every input is a named assumption
below, so a measured number (bench/gpu_check.py) can replace it.

    python bench/scale_estimate.py
"""

from __future__ import annotations

# ---- model: Qwen2.5-7B-like (GQA), bf16
PARAMS = 7.6e9
WEIGHT_BYTES = 2 * PARAMS
KV_BYTES_PER_TOKEN = 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads x 128 dims, bf16 = 57 KiB

# ---- one RL step (GRPO with a KL term): 128 prompts x 8 samples
SAMPLES = 128 * 8
PROMPT_TOKENS = 256
MEAN_RESPONSE, MAX_RESPONSE = 512, 1024
TRAIN_FLOPS_PER_TOKEN = 10 * PARAMS  # policy fwd+bwd 6N, recompute (activation checkpointing) 2N, reference fwd 2N

# ---- GPU: H100 SXM, published: 989 TFLOP/s dense bf16, 3.35 TB/s HBM
PEAK_FLOPS, HBM_BYTES_PER_S = 989e12, 3.35e12
TRAIN_MFU = 0.40  # FSDP on 8 GPUs; the CPU measured 44-50% of its own bf16 matmul rate (docs/performance.md)
DECODE_BW_EFF = 0.70  # share of HBM bandwidth a vLLM decode step reaches
PREFILL_MFU = 0.50
# Full-state weight sync, ASSUMING an NCCL / CUDA-IPC transport (not implemented). VLLMEngine today
# sends bytes through vLLM's RPC: 17 s for SmolLM2's 0.54 GB on the loaded 2-core CPU, minutes at 7B.
SYNC_S = 4.0
SLEEP_WAKE_S = 1.0  # colocated: vLLM sleep + wake per step


def train_seconds(gpus: int) -> float:
    tokens = SAMPLES * (PROMPT_TOKENS + MEAN_RESPONSE)
    return TRAIN_FLOPS_PER_TOKEN * tokens / (gpus * PEAK_FLOPS * TRAIN_MFU)


def generate_seconds(gpus: int) -> float:
    """One vLLM engine per GPU (7B fits, TP=1); samples split evenly. Decode is bandwidth-bound:
    each step reads the weights and the batch's KV cache; the step lasts until the longest
    response (MAX_RESPONSE steps, the batch shrinking from full to ~MEAN/MAX of it)."""
    per_gpu = SAMPLES / gpus
    prefill = 2 * PARAMS * per_gpu * PROMPT_TOKENS / (PEAK_FLOPS * PREFILL_MFU)
    mean_live = per_gpu * MEAN_RESPONSE / MAX_RESPONSE  # average sequences still decoding
    kv = mean_live * (PROMPT_TOKENS + MEAN_RESPONSE) * KV_BYTES_PER_TOKEN
    step = (WEIGHT_BYTES + kv) / (HBM_BYTES_PER_S * DECODE_BW_EFF)
    compute = 2 * PARAMS * mean_live / PEAK_FLOPS  # check: decode is not compute-bound
    return prefill + MAX_RESPONSE * max(step, compute)


def main() -> None:
    gen8, train8 = generate_seconds(8), train_seconds(8)
    sync = gen8 + train8 + SYNC_S + SLEEP_WAKE_S
    print(f"colocated, sync : generate {gen8:5.1f}s + train {train8:5.1f}s + weight sync {SYNC_S:.0f}s "
          f"+ sleep/wake {SLEEP_WAKE_S:.0f}s = {sync:5.1f}s per step")
    print(f"colocated, async: the same GPUs time-share, so nothing overlaps: {sync:5.1f}s")
    for g in (1, 2, 3, 4):
        gen, train = generate_seconds(g), train_seconds(8 - g)
        async_step = max(gen, train) + SYNC_S
        print(f"split {g} gen / {8 - g} train: generate {gen:5.1f}s, train {train:5.1f}s; "
              f"sync {gen + train + SYNC_S:5.1f}s, async (staleness 1) {async_step:5.1f}s "
              f"(hides {min(gen, train):4.1f}s)")


if __name__ == "__main__":
    main()
