"""Greedy evaluation on held-out prompts, with a reward function's scores as the metric."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhfkit.rollout.base import GenerationEngine, SamplingParams
from rlhfkit.trainers.rl import PromptItem


def greedy_responses(
    engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem], max_new_tokens: int
) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`, decoded without special tokens."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
    trajs = engine.generate([p.ids for p in prompts], params, generator=torch.Generator().manual_seed(0))
    return tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)


def evaluate(engine, tokenizer, prompts: Sequence[PromptItem], reward_fn, max_new_tokens: int) -> dict[str, float]:
    """Mean reward and mean score (in [0, 1], e.g. accuracy) of greedy completions."""
    responses = greedy_responses(engine, tokenizer, prompts, max_new_tokens)
    texts = [p.text for p in prompts]
    out = reward_fn([t + r for t, r in zip(texts, responses)], texts, [p.label for p in prompts], responses=responses)
    return {"eval/reward": float(out.rewards.mean()), "eval/accuracy": float(out.scores.mean())}
