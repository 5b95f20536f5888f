"""Evaluation on held-out prompts, kept apart from the training reward.

`Evaluator` draws `n_samples` completions per prompt (greedy when n_samples is 1 and the
temperature 0) before training, every `eval_steps` RL steps (as a trainer callback) and at the
end; `rlhfkit eval` runs it once on a saved model. It reports two things:

  * `score_fn` (the training reward, or the demo's accuracies) over every sample:
    `eval/reward`, `eval/accuracy`;
  * with a `verifier` (the task metric, e.g. `builtin:math`, independent of the reward the policy
    is optimised for): `eval/pass@k` (the unbiased estimator of Chen et al. 2021,
    rlhfkit.core.passk) and `eval/maj@k` (majority vote over the extracted answers) for each k.

When the training reward rises and the verifier's pass@1 does not, the policy is gaming the
reward (reward hacking): both curves sit side by side in metrics.jsonl and accuracy.png.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

import torch

from rlhfkit.core.passk import pass_at_k
from rlhfkit.rewards.math import extract_answer, parse_number
from rlhfkit.rollout.base import GenerationEngine, SamplingParams, image_kwargs
from rlhfkit.data.types import PromptItem

ScoreFn = Callable[[list[str], Sequence[PromptItem]], dict[str, float]]
# responses, their prompts -> (correct per response, answer per response for majority voting)
VerifyFn = Callable[[list[str], Sequence[PromptItem]], tuple[list[bool], list[str | None]]]


def sample_responses(
    engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem], max_new_tokens: int,
    n: int = 1, temperature: float = 0.0, seed: int = 0,
) -> list[str]:
    """`n` completions per prompt (sample s of prompt i at i*n + s), decoded without special tokens.
    The generator is seeded afresh on each call, so repeated evaluations share their sampling noise."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=n)
    trajs = engine.generate([p.ids for p in prompts], params, generator=torch.Generator().manual_seed(seed),
                            **image_kwargs(prompts))
    return tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)


def greedy_responses(engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem], max_new_tokens: int) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`."""
    return sample_responses(engine, tokenizer, prompts, max_new_tokens)


def reward_score_fn(reward_fn) -> ScoreFn:
    """Score responses with a reward function: mean reward and mean score (in [0, 1])."""

    def score(responses: list[str], prompts: Sequence[PromptItem]) -> dict[str, float]:
        out = _call_reward(reward_fn, responses, prompts)
        return {"eval/reward": float(out.rewards.mean()), "eval/accuracy": float(out.scores.mean())}

    return score


def normalize_answer(text: str | int | None) -> str | None:
    """The key majority voting compares: the exact number if `text` is one, else squashed text."""
    if text is None:
        return None
    value = parse_number(text)
    if isinstance(value, Fraction):
        return str(value)
    squashed = " ".join(str(text).split())
    return squashed or None


def reward_verifier(reward_fn, extract: Callable[[str], str | int | None] = extract_answer) -> VerifyFn:
    """A verifier from a reward function: correct when its score > 0.5; the answer voted on is
    `extract(response)` (default: the final answer of rlhfkit.rewards.math)."""

    def verify(responses: list[str], prompts: Sequence[PromptItem]) -> tuple[list[bool], list[str | None]]:
        out = _call_reward(reward_fn, responses, prompts)
        return [bool(s > 0.5) for s in out.scores.tolist()], [normalize_answer(extract(r)) for r in responses]

    return verify


def _call_reward(reward_fn, responses: list[str], prompts: Sequence[PromptItem]):
    texts = [p.text for p in prompts]
    return reward_fn([t + r for t, r in zip(texts, responses)], texts, [p.label for p in prompts],
                     responses=responses, raw_prompts=[p.text if p.raw is None else p.raw for p in prompts],
                     records=[p.record for p in prompts])


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Majority-vote accuracy of one prompt's n samples: the samples are cut into n // k
    consecutive blocks of k; a block is right when its most frequent answer (ties: the one seen
    first; None never votes) is a correct one. Returns the mean over blocks."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n (got k={k}, n={n})")
    hits = []
    for b in range(n // k):
        block = range(b * k, (b + 1) * k)
        votes = Counter(answers[i] for i in block if answers[i] is not None)
        if not votes:
            hits.append(0.0)
            continue
        top = max(votes.values())
        winner = next(answers[i] for i in block if votes.get(answers[i]) == top)
        hits.append(float(any(correct[i] for i in block if answers[i] == winner)))
    return sum(hits) / len(hits)


def task_metrics(correct: Sequence[bool], answers: Sequence[str | None], n: int, ks: Sequence[int]) -> dict[str, float]:
    """eval/pass@k and eval/maj@k over B prompts from their B*n verified samples (prompt-major)."""
    b = len(correct) // n
    num_correct = torch.tensor([sum(correct[i * n:(i + 1) * n]) for i in range(b)])
    out = {}
    for k in ks:
        out[f"eval/pass@{k}"] = float(pass_at_k(num_correct, n, k).mean())
        out[f"eval/maj@{k}"] = sum(maj_at_k(answers[i * n:(i + 1) * n], correct[i * n:(i + 1) * n], k)
                                   for i in range(b)) / b
    return out


class Evaluator:
    """Evaluation of `items`; call it as `evaluator(trainer, step)`, register `evaluator.periodic`
    as a trainer callback, or call `evaluate(engine, tokenizer)` on any engine."""

    def __init__(self, items: Sequence[PromptItem], max_new_tokens: int, eval_steps: int,
                 score_fn: ScoreFn | None, n_samples: int = 1, temperature: float = 0.0,
                 ks: Sequence[int] = (1,), verifier: VerifyFn | None = None, seed: int = 0):
        self.items, self.max_new_tokens, self.eval_steps, self.score_fn = list(items), max_new_tokens, eval_steps, score_fn
        self.n_samples, self.temperature, self.ks, self.verifier, self.seed = n_samples, temperature, tuple(ks), verifier, seed
        self.examples: dict[str, list[dict]] = {}

    def evaluate(self, engine: GenerationEngine, tokenizer) -> tuple[dict[str, float], list[dict]]:
        """(metrics, one row per sample: prompt, label, response, sample, and correct/answer with a verifier)."""
        n = self.n_samples
        responses = sample_responses(engine, tokenizer, self.items, self.max_new_tokens, n, self.temperature, self.seed)
        items = [self.items[i // n] for i in range(len(responses))]
        metrics = self.score_fn(responses, items) if self.score_fn is not None else {}
        rows = [{"prompt": p.text, "label": str(p.label), "response": r, "sample": i % n}
                for i, (p, r) in enumerate(zip(items, responses))]
        if self.verifier is not None:
            correct, answers = self.verifier(responses, items)
            metrics.update(task_metrics(correct, answers, n, self.ks))
            for row, c, a in zip(rows, correct, answers):
                row.update(correct=c, answer=a)
        return metrics, rows

    def __call__(self, trainer, step: int, tag: str | None = None) -> dict[str, float]:
        if not self.items:
            return {}
        t0 = time.perf_counter()
        metrics, rows = self.evaluate(trainer.engine, trainer.tokenizer)
        if trainer.tracker is not None:
            trainer.tracker.metrics.log(step, metrics)
        shown = ", ".join(f"{k.split('/')[-1]} {v:.1%}" for k, v in metrics.items()
                          if "accuracy" in k or "@" in k)
        print(f"[eval {tag or f'step {step}'}] {shown} on {len(self.items)} held-out prompts "
              f"in {time.perf_counter() - t0:.0f}s")
        self.examples[tag or f"step {step}"] = rows[: 8 * self.n_samples : self.n_samples]
        return metrics

    def periodic(self, trainer, step: int, metrics: dict) -> None:
        if self.eval_steps > 0 and step % self.eval_steps == 0 and step < trainer.total_steps:
            self(trainer, step)
