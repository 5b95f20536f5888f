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

With an `executor` (a tool-calling `ToolExecutor` or an agent's `MultiTurnExecutor`), each sample
is a whole episode: the response the reward functions score is the episode's text after the
prompt (actions, tool calls and results), TRL-contract functions get the episode's messages as
`completions`, and an executor that carries its own rewards (an agent file, an environment's
`get_reward`) scores the episodes when no reward function is given. An episode trained in
segments (--agent.on_rerender segment) is one sample, scored once on its last segment. The executor's counters come
out as `eval/tools/...` (calls, errors, valid_call_rate), beside `eval/tool_calls` (calls per
episode) and `eval/episodes_with_call`; each row holds the conversation (`messages`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

import torch

from rlhfkit.agents.executor import TokenBudget, agent_rewards, episode_rows
from rlhfkit.core.passk import pass_at_k
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.rewards.math import extract_answer, parse_number
from rlhfkit.rewards.reward_model import prompt_images
from rlhfkit.rollout.base import GenerationEngine, SamplingParams, image_kwargs

# responses, their prompts (and keywords: completion_messages of tool episodes) -> metrics
ScoreFn = Callable[..., dict[str, float]]
# responses, their prompts (and keywords) -> (correct per response, answer per response for majority voting)
VerifyFn = Callable[..., tuple[list[bool], list[str | None]]]


def sample_trajectories(
    engine: GenerationEngine, prompts: Sequence[PromptItem], max_new_tokens: int, n: int = 1,
    temperature: float = 0.0, seed: int = 0, executor=None, budget: TokenBudget | None = None, tokenizer=None,
    *, top_p: float = 1.0, top_k: int = -1,
) -> list[Trajectory]:
    """`n` samples per prompt (sample s of prompt i at i*n + s): one generation each, or an
    `executor`'s episodes (within `budget`), sampled with `temperature`, `top_p` and `top_k`. The generator
    is seeded afresh on each call, so repeated evaluations share their sampling noise."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=n, top_p=top_p, top_k=top_k)
    generator = torch.Generator().manual_seed(seed)
    if executor is not None:
        return executor.run(engine, tokenizer, prompts, params, budget, generator=generator)
    return engine.generate([p.ids for p in prompts], params, generator=generator, **image_kwargs(prompts))


def sample_responses(
    engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem], max_new_tokens: int,
    n: int = 1, temperature: float = 0.0, seed: int = 0,
) -> list[str]:
    """`n` completions per prompt (as `sample_trajectories`), decoded without special tokens."""
    trajs = sample_trajectories(engine, prompts, max_new_tokens, n, temperature, seed)
    return tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)


def greedy_responses(engine: GenerationEngine, tokenizer, prompts: Sequence[PromptItem],
                     max_new_tokens: int) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`."""
    return sample_responses(engine, tokenizer, prompts, max_new_tokens)


def reward_score_fn(reward_fn) -> ScoreFn:
    """Score responses with a reward function: mean reward and mean score (in [0, 1])."""

    def score(responses: list[str], prompts: Sequence[PromptItem], **extra) -> dict[str, float]:
        out = _call_reward(reward_fn, responses, prompts, **extra)
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

    def verify(responses: list[str], prompts: Sequence[PromptItem], **extra) -> tuple[list[bool], list[str | None]]:
        out = _call_reward(reward_fn, responses, prompts, **extra)
        return [bool(s > 0.5) for s in out.scores.tolist()], [normalize_answer(extract(r)) for r in responses]

    return verify


def _call_reward(reward_fn, responses: list[str], prompts: Sequence[PromptItem], **extra):
    texts = [p.text for p in prompts]
    return reward_fn([t + r for t, r in zip(texts, responses)], texts, [p.label for p in prompts],
                     responses=responses, raw_prompts=[p.text if p.raw is None else p.raw for p in prompts],
                     records=[p.record for p in prompts], **prompt_images(prompts), **extra)


def conversation_fields(info: dict) -> dict:
    """A log row's view of an episode's conversation: `messages` (all of it) and `prompt_messages`
    (how many of them are the prompt's, which the sample viewer leaves out); {} without one."""
    if "messages" not in info:
        return {}
    return {"messages": info["messages"], "prompt_messages": info.get("prompt_messages")}


def agent_score_fn(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """eval/reward and eval/accuracy of episodes that carry their agent's rewards."""
    out = agent_rewards(trajs)
    return {"eval/reward": float(out.rewards.mean()), "eval/accuracy": float(out.scores.mean())}


def episode_metrics(trajs: Sequence[Trajectory], counters: dict[str, float]) -> dict[str, float]:
    """eval/tool_calls (mean calls per episode), eval/episodes_with_call and the executor's counters
    (`counters`, e.g. tools/valid_call_rate) under eval/."""
    calls = [float(t.info.get("tool_calls", 0)) for t in trajs]
    out = {f"eval/{k}": v for k, v in counters.items()}
    if any("tool_calls" in t.info for t in trajs):
        out["eval/tool_calls"] = sum(calls) / max(len(calls), 1)
        out["eval/episodes_with_call"] = sum(c > 0 for c in calls) / max(len(calls), 1)
    out["eval/turns"] = sum(float(t.info.get("turns", 1)) for t in trajs) / max(len(trajs), 1)
    return out


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
    as a trainer callback, or call `evaluate(engine, tokenizer)` on any engine.

    `executor` (with its `budget`): samples are its episodes (see the module docstring); give the
    evaluator its own executor, not the trainer's (the counters are popped after each evaluation).
    """

    def __init__(self, items: Sequence[PromptItem], max_new_tokens: int, eval_steps: int,
                 score_fn: ScoreFn | None, n_samples: int = 1, temperature: float = 0.0,
                 ks: Sequence[int] = (1,), verifier: VerifyFn | None = None, seed: int = 0,
                 executor=None, budget: TokenBudget | None = None, top_p: float = 1.0, top_k: int = -1):
        self.items, self.max_new_tokens, self.eval_steps = list(items), max_new_tokens, eval_steps
        self.score_fn, self.n_samples, self.temperature = score_fn, n_samples, temperature
        self.top_p, self.top_k = top_p, top_k
        self.ks, self.verifier, self.seed = tuple(ks), verifier, seed
        self.executor, self.budget = executor, budget
        self.examples: dict[str, list[dict]] = {}

    def evaluate(self, engine: GenerationEngine, tokenizer) -> tuple[dict[str, float], list[dict]]:
        """(metrics, one row per sample: prompt, label, response, sample, and correct/answer with a
        verifier; with an executor also messages, the conversation after the prompt). An agent
        function's executor (the OpenAI-compatible endpoint) reports as `rlhfkit eval` does:
        rlhfkit.agents.endpoint.runner.evaluate_agent (episodes it dropped count 0)."""
        if hasattr(self.executor, "fallback_reward_fn"):
            return self._agent_function_eval(engine, tokenizer)
        n = self.n_samples
        trajs = sample_trajectories(engine, self.items, self.max_new_tokens, n, self.temperature, self.seed,
                                    self.executor, self.budget, tokenizer, top_p=self.top_p, top_k=self.top_k)
        # an executor's episode in segments is one sample, scored on its last segment
        rows_of = episode_rows(trajs) if self.executor is not None else None
        trajs = trajs if rows_of is None else [trajs[i] for i in rows_of[0]]
        responses = tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)
        items = [self.items[i // n] for i in range(len(responses))]
        infos = [getattr(t, "info", None) or {} for t in trajs]
        conversations = [i.get("completion_messages") for i in infos]
        extra = {"completion_messages": conversations} if any(c is not None for c in conversations) else {}
        own = self.executor is not None and getattr(self.executor, "provides_rewards", False)
        metrics = {}
        if self.score_fn is not None:
            metrics = self.score_fn(responses, items, **extra)
            if own:  # the environment's rewards beside the function's
                metrics["eval/env_reward"] = float(agent_rewards(trajs).rewards.mean())
        elif own:
            metrics = agent_score_fn(trajs)
        if self.executor is not None:
            pop = getattr(self.executor, "pop_metrics", None)
            metrics.update(episode_metrics(trajs, pop() if pop is not None else {}))
        rows = [{"prompt": p.text, "label": str(p.label), "response": r, "sample": i % n}
                for i, (p, r) in enumerate(zip(items, responses))]
        for row, info in zip(rows, infos):
            if "messages" in info:
                row.update(conversation_fields(info), tool_calls=info.get("tool_calls", 0))
        verified = None
        if self.verifier is not None:
            verified = self.verifier(responses, items, **extra)
        elif own:  # the agent's score decides, the answer voted on is the response's final answer
            scores = agent_rewards(trajs).scores.tolist()
            verified = [s > 0.5 for s in scores], [normalize_answer(extract_answer(r)) for r in responses]
        if verified is not None:
            correct, answers = verified
            metrics.update(task_metrics(correct, answers, n, self.ks))
            for row, c, a in zip(rows, correct, answers):
                row.update(correct=c, answer=a)
        return metrics, rows

    def _agent_function_eval(self, engine: GenerationEngine, tokenizer) -> tuple[dict[str, float], list[dict]]:
        from rlhfkit.agents.endpoint.runner import evaluate_agent  # noqa: PLC0415 - the agents extra

        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, n=self.n_samples,
                                top_p=self.top_p, top_k=self.top_k)
        return evaluate_agent(self.executor, engine, tokenizer, self.items, params, self.budget, seed=self.seed)

    def __call__(self, trainer, step: int, tag: str | None = None) -> dict[str, float]:
        if not self.items:
            return {}
        t0 = time.perf_counter()
        metrics, rows = self.evaluate(trainer.engine, trainer.tokenizer)
        if trainer.tracker is not None:
            trainer.tracker.metrics.log(step, metrics)
        keys = [k for k in metrics if "accuracy" in k or "@" in k] or list(metrics)  # an agent function's: all
        shown = ", ".join(f"{k.split('/')[-1]} {metrics[k]:.1%}" for k in keys)
        print(f"[eval {tag or f'step {step}'}] {shown} on {len(self.items)} held-out prompts "
              f"in {time.perf_counter() - t0:.0f}s")
        self.examples[tag or f"step {step}"] = rows[: 8 * self.n_samples : self.n_samples]
        return metrics

    def periodic(self, trainer, step: int, metrics: dict) -> None:
        """The evaluation every `eval_steps` steps; its metrics join the step's `metrics` for the
        callbacks after this one (the checkpointer's --ckpt.keep_best)."""
        if self.eval_steps > 0 and step % self.eval_steps == 0 and step < trainer.total_steps:
            metrics.update(self(trainer, step))
