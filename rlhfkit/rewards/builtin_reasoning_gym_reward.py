"""A ready-made reward file for reasoning-gym's tasks: `--reward.remote_url builtin:reasoning_gym`.

The prompts are reasoning-gym entries (`--data.prompt_dataset reasoning_gym:TASK`, or rows with
`answer` and `metadata.source_dataset`); each response is scored with its task's own `score_answer`
on the content of its one `<answer>...</answer>` tag (`rlhfkit.rewards.reasoning_gym`). `exact_reward_func`
scores exact answers only (`--reward.reasoning_gym.partial_credit false`).
"""

from __future__ import annotations

from typing import Any

from rlhfkit.rewards.base import response_texts
from rlhfkit.rewards.reasoning_gym import reasoning_gym_reward


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """OpenRLHF-style reward: the task's score of each response's answer.

    Returns {"rewards": FloatTensor [B], "scores": FloatTensor [B], "extra_logs": {"answer_tag": [B]}}.
    """
    return _reward(queries, prompts, kwargs, partial_credit=True)


def exact_reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """As `reward_func`, but 1 only where the task scores the answer 1, else 0 (no partial credit)."""
    return _reward(queries, prompts, kwargs, partial_credit=False)


def _reward(queries: list[str], prompts: list[str], kwargs: dict[str, Any], partial_credit: bool) -> dict[str, Any]:
    out = reasoning_gym_reward(response_texts(queries, prompts, kwargs.get("responses")),
                               kwargs.get("records") or [None] * len(queries), partial_credit=partial_credit)
    return {"rewards": out.rewards, "scores": out.scores, "extra_logs": dict(out.extra_logs)}
