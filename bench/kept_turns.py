"""Multi-turn rollout throughput: HFEngine with an episode's KV cache kept across its turns vs without.

E episodes of T turns (4 by default) on a random-weight model: a prompt of P tokens, each turn M new
tokens (greedy; fp32 by default, where both runs must give the same tokens: asserted; under bf16 the
turns whose tokens differ by rounding are counted) and then F tokens
of feedback (a tool result, an environment's observation) appended, as the multi-turn executors do.
Without the kept cache every turn prefills the whole history again; with it only the action's last
token and the feedback. Prints generated tokens/s of both side by side (best of `--repeats`, the two
interleaved in one run), their ratio, the prefilled tokens of each, and the largest logprob gap.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/kept_turns.py [--shape tiny|smollm2-135m] [--episodes 16]
        [--prompt 256 --feedback 64 --max-new 16 --turns 4] [--dtype fp32|bf16] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

# SmolLM2-135M's shape (random weights): what bench/gpu_check.py builds too
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
                "max_position_embeddings": 2048, "vocab_size": 49152}


def build(shape: str):
    """(model, tokenizer) of `shape`: the tiny Llama, or SmolLM2-135M's shape with random weights."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    if shape == "tiny":
        return model, tok
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_135M, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    return LlamaForCausalLM(config).eval(), tok


def episodes(engine, prompts, feedback, params, turns: int):
    """Run `turns` turns of one episode per prompt; returns (per turn the trajectories, seconds)."""
    history, out = [list(p) for p in prompts], []
    start = time.perf_counter()
    for turn in range(turns):
        trajs = engine.generate(history, params, episode_keys=list(range(len(history))))
        out.append(trajs)
        for row, t in enumerate(trajs):
            history[row] = history[row] + t.response_ids.tolist() + feedback[turn][row]
    return out, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", choices=["tiny", "smollm2-135m"])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (P)")
    ap.add_argument("--feedback", type=int, default=64, help="feedback tokens after each turn (F)")
    ap.add_argument("--max-new", type=int, default=16, help="new tokens per turn (M)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = build(args.shape)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, vocab, (args.prompt,), generator=gen).tolist() for _ in range(args.episodes)]
    feedback = [[torch.randint(4, vocab, (args.feedback,), generator=gen).tolist() for _ in prompts]
                for _ in range(args.turns)]
    params = SamplingParams(max_new_tokens=args.max_new, temperature=0.0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else None
    best = {True: float("inf"), False: float("inf")}
    results, prefilled = {}, {}
    for _ in range(args.repeats):
        for keep in (True, False):  # interleaved: both see the same machine state
            engine = HFEngine(model, tok, autocast_dtype=dtype, keep_turns=keep)
            results[keep], seconds = episodes(engine, prompts, feedback, params, args.turns)
            best[keep], prefilled[keep] = min(best[keep], seconds), engine.prefilled_tokens
    gap, differ = 0.0, 0
    for turn_a, turn_b in zip(results[True], results[False]):
        for a, b in zip(turn_a, turn_b):
            same = a.response_ids.tolist() == b.response_ids.tolist()
            differ += not same
            if same:
                gap = max(gap, float((a.logprobs - b.logprobs).abs().max()))
    # fp32: the same tokens. bf16: both runs round differently (the kept keys and values were computed
    # one decode step at a time, a full prefill recomputes them), so a near-tie may go the other way.
    assert differ == 0 or dtype is not None, "kept turns changed the greedy fp32 tokens"
    generated = sum(t.response_length for turn in results[True] for t in turn)
    print(f"{args.shape} {args.dtype}: {args.episodes} episodes x {args.turns} turns, prompt {args.prompt}, "
          f"{args.max_new} new + {args.feedback} feedback tokens per turn; threads {torch.get_num_threads()}")
    print(f"| | tokens/s | seconds (best of {args.repeats}) | prefilled tokens |")
    print("|---|---|---|---|")
    for keep, name in ((True, "kept across turns"), (False, "full prefill every turn")):
        print(f"| {name} | {generated / best[keep]:.1f} | {best[keep]:.2f} | {prefilled[keep]:,} |")
    print(f"speed-up {best[False] / best[True]:.2f}x; turns whose tokens differ: {differ} of "
          f"{args.episodes * args.turns}; largest logprob gap (turns with the same tokens) {gap:.2e}")


if __name__ == "__main__":
    main()
