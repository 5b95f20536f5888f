"""A ready-made reward file for math datasets with a numeric reference answer.

Use it as `--reward.remote_url rlhfkit/rewards/builtin_math_reward.py` with prompts loaded with
a `label_key` (e.g. GSM8K's final number). Each response is the part of its query after the
prompt (`queries[i][len(prompts[i]):]` when the query starts with the prompt, else the whole
query); it is scored by `math_exact_reward` in "answer" mode: the last `\\boxed{...}`, else the
number after "Answer:" / "answer is", else the last number, must equal the label.
Set MODE = "first_integer" in a copy of this file for short-answer tasks.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.rewards.math import math_exact_reward

MODE = "answer"


def split_response(query: str, prompt: str) -> str:
    """The response part of a decoded prompt + response string."""
    return query[len(prompt):] if query.startswith(prompt) else query


def reward_func(
    queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
) -> dict[str, Any]:
    """OpenRLHF-style reward: 1.0 for the right final number, else 0.0.

    Returns {"rewards": FloatTensor [B], "scores": FloatTensor [B],
             "extra_logs": {"answer_found": FloatTensor [B]}}.
    """
    responses = [split_response(q, p) for q, p in zip(queries, prompts)]
    out = math_exact_reward(responses, labels, mode=MODE)
    return {
        "rewards": out.rewards,
        "scores": out.scores,
        "extra_logs": dict(out.extra_logs),
    }
