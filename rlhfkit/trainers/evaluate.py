"""Greedy evaluation on held-out prompts, kept apart from the training reward.

`Evaluator` runs before training, every `eval_steps` RL steps (as a trainer callback) and at the
end; its metric is the reward function's mean score (e.g. accuracy) unless a `score_fn` is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from rlhfkit.rollout.base import GenerationEngine, SamplingParams
from rlhfkit.trainers.rl import PromptItem

ScoreFn = Callable[[list[str], Sequence[PromptItem]], dict[str, float]]


def greedy_responses(
    engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem], max_new_tokens: int
) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`, decoded without special tokens."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
    trajs = engine.generate([p.ids for p in prompts], params, generator=torch.Generator().manual_seed(0))
    return tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)


def reward_score_fn(reward_fn) -> ScoreFn:
    """Score responses with a reward function: mean reward and mean score (in [0, 1])."""

    def score(responses: list[str], prompts: Sequence[PromptItem]) -> dict[str, float]:
        texts = [p.text for p in prompts]
        out = reward_fn([t + r for t, r in zip(texts, responses)], texts, [p.label for p in prompts],
                        responses=responses)
        return {"eval/reward": float(out.rewards.mean()), "eval/accuracy": float(out.scores.mean())}

    return score


class Evaluator:
    """Greedy evaluation of `items`; call it as `evaluator(trainer, step)` or register
    `evaluator.periodic` as a trainer callback."""

    def __init__(self, items: Sequence[PromptItem], max_new_tokens: int, eval_steps: int, score_fn: ScoreFn):
        self.items, self.max_new_tokens, self.eval_steps, self.score_fn = list(items), max_new_tokens, eval_steps, score_fn
        self.examples: dict[str, list[dict]] = {}

    def __call__(self, trainer, step: int, tag: str | None = None) -> dict[str, float]:
        if not self.items:
            return {}
        t0 = time.perf_counter()
        responses = greedy_responses(trainer.engine, trainer.tokenizer, self.items, self.max_new_tokens)
        metrics = self.score_fn(responses, self.items)
        if trainer.tracker is not None:
            trainer.tracker.metrics.log(step, metrics)
        shown = ", ".join(f"{k.split('/')[-1]} {v:.1%}" for k, v in metrics.items() if "accuracy" in k)
        print(f"[eval {tag or f'step {step}'}] {shown} on {len(self.items)} held-out prompts "
              f"in {time.perf_counter() - t0:.0f}s")
        self.examples[tag or f"step {step}"] = [
            {"prompt": p.text, "label": str(p.label), "response": r} for p, r in zip(self.items[:8], responses[:8])
        ]
        return metrics

    def periodic(self, trainer, step: int, metrics: dict) -> None:
        if self.eval_steps > 0 and step % self.eval_steps == 0 and step < trainer.total_steps:
            self(trainer, step)
