"""reasoning-gym's own scoring as a reward (`--reward.remote_url builtin:reasoning_gym`).

Each sample's prompt record is a reasoning-gym entry (`question`, `answer`, `metadata`: what
`--data.prompt_dataset reasoning_gym:TASK` gives, or rows saved from `reasoning_gym.create_dataset`);
its reward is the task's own `score_answer(answer, entry)`, the task found by
`reasoning_gym.get_score_answer_fn(metadata["source_dataset"])`, as reasoning-gym's training examples
score. The answer is read from `<answer>...</answer>` as reasoning-gym's `extract_answer` reads it
(the tag's content, stripped), with departures that close shortcuts an RL policy finds:

  * the response must hold exactly one `<answer>` tag: several (a dump of candidate answers, of
    which `extract_answer` would take the last) and an empty one score 0, as does no tag;
  * an answer that holds the right one among other text scores 0, whatever the task gives it
    (compared without case and with runs of whitespace as one space): reasoning-gym's default
    `score_answer` gives `len(oracle) / len(answer)` to any answer holding the oracle ("10 11 12 13"
    earns 2/11 when 12 is right), and several tasks search the answer for the oracle and give full
    credit (knights_knaves to "The answer is " + oracle, spell_backward more than 1 to the word
    followed by anything). The instructions ask for the final answer only, so "12.0" or "12 legs"
    for 12 scores 0 too. Other partial credit a task gives (e.g. a sudoku's share of right cells) is
    kept;
  * a task whose `score_answer` gives full credit to a junk answer (`JUNK`) cannot tell right from
    wrong (reasoning-gym 0.1.23's game_of_life_halting credits any non-empty answer): RewardError
    naming it, rather than a reward of 1 for everything;
  * an answer the task's parsing raises on scores 0 (rather than failing the batch).

With `partial_credit=False` (`--reward.reasoning_gym.partial_credit false`) only exact answers score:
1 where the task scores the answer 1, else 0. Several tasks give partial credit to a constant answer
(reasoning-gym 0.1.23's time_intervals gives "0" 0.95 on some entries, rectangle_count gives "0" 0.32 to
0.64 where few rectangles are drawn, polynomial_equations gives "0" 0.5 where 0 is one of the roots), which a
policy can learn instead of solving the task.

`extra_logs["answer_tag"]` is 1 where the response held one non-empty answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
JUNK = "@@ not an answer @@"
"""What each task's scorer is tried on once: no task's right answer, so full credit for it is a broken scorer."""


def single_answer(response: str) -> str | None:
    """The stripped content of the response's one `<answer>...</answer>`; None when it has none, more
    than one opening tag, or an empty one.

    >>> single_answer("think... <answer> 42 </answer>"), single_answer("<answer>4</answer><answer>5</answer>")
    ('42', None)
    """
    if response.count("<answer>") != 1:
        return None
    found = _ANSWER.search(response)
    answer = found.group(1).strip() if found else ""
    return answer or None


def entry_of(record: Any, i: int) -> dict[str, Any]:
    """The reasoning-gym entry of sample i's prompt record; RewardError naming what is missing."""
    meta = record.get("metadata") if isinstance(record, Mapping) else None
    if not isinstance(meta, Mapping) or "source_dataset" not in meta or "answer" not in record:
        raise RewardError(f"builtin:reasoning_gym: sample {i}'s prompt record is not a reasoning-gym entry (it needs "
                          "answer and metadata.source_dataset); use --data.prompt_dataset reasoning_gym:TASK")
    return {"question": record.get("question"), "answer": record["answer"], "metadata": meta}


def score_response(response: str, entry: Mapping[str, Any], score_answer: Callable[..., Any],
                   partial_credit: bool = True) -> float:
    """The reward of one response (see the module docstring); without `partial_credit`, 1 where the task
    scores the answer 1 and 0 elsewhere."""
    answer = single_answer(response)
    if answer is None or holds_oracle(answer, entry["answer"]):
        return 0.0
    score = task_score(score_answer, answer, entry)
    return score if partial_credit else exact_only(score)


def exact_only(score: float) -> float:
    """1 for a task's full credit, 0 for any partial credit (`partial_credit=False`).

    >>> exact_only(1.0), exact_only(0.95)
    (1.0, 0.0)
    """
    return float(score >= 1.0)


def task_score(score_answer: Callable[..., Any], answer: str, entry: Mapping[str, Any]) -> float:
    """The task's score of `answer`; 0 where its parsing raises on the answer (reasoning-gym 0.1.23's
    prime_factorization reads each factor with int())."""
    try:
        return float(score_answer(answer, dict(entry)))
    except Exception:  # noqa: BLE001 - an answer the task cannot read is a wrong one, not a failed batch
        return 0.0


def task_scorer(task: str, entry: Mapping[str, Any], i: int) -> Callable[..., Any]:
    """reasoning-gym's `score_answer` of `task`, tried on `JUNK` against `entry` (sample i's); RewardError
    when the task is unknown or gives the junk full credit (see the module docstring)."""
    from reasoning_gym import get_score_answer_fn

    try:
        scorer = get_score_answer_fn(task)
    except ValueError as exc:
        raise RewardError(f"builtin:reasoning_gym: sample {i}'s task {task!r} is not one of this "
                          "reasoning-gym's; install the version that made the data") from exc
    if task_score(scorer, JUNK, entry) >= 1.0:
        raise RewardError(f"builtin:reasoning_gym: reasoning-gym's {task} gives full credit to the junk answer "
                          f"{JUNK!r}, so its rewards cannot tell right from wrong; leave the task out of the data")
    return scorer


def holds_oracle(answer: str, oracle: Any) -> bool:
    """True when `answer` holds the right answer `oracle` among other text (case and runs of whitespace
    aside): a dump of candidates or more than the answer, whose credit is taken away (see the module
    docstring).

    >>> holds_oracle("28 29 30", "30"), holds_oracle("30", "30"), holds_oracle("3", "30")
    (True, False, False)
    >>> holds_oracle("NO  Yes", "yes"), holds_oracle("Yes", "yes")
    (True, False)
    """
    if not isinstance(oracle, str) or not oracle.strip():
        return False
    answer, oracle = _plain(answer), _plain(oracle)
    return oracle in answer and answer != oracle


def _plain(text: str) -> str:
    """`text` without case, its runs of whitespace one space (what a task's lenient parsing may ignore)."""
    return " ".join(text.split()).casefold()


def reasoning_gym_reward(responses: Sequence[str], records: Sequence[Any],
                         partial_credit: bool = True) -> RewardOutput:
    """Rewards [B] of B responses to the reasoning-gym entries `records` (see the module docstring);
    `partial_credit` False: only exact answers score (1), the task's partial credit is 0."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError as exc:
        raise RewardError("builtin:reasoning_gym needs reasoning-gym: pip install 'rlhfkit[reasoning-gym]'") from exc
    scorers: dict[str, Callable[..., Any]] = {}
    rewards, tagged = [], []
    for i, (response, record) in enumerate(zip(responses, records)):
        entry = entry_of(record, i)
        task = str(entry["metadata"]["source_dataset"])
        if task not in scorers:
            scorers[task] = task_scorer(task, entry, i)
        rewards.append(score_response(response, entry, scorers[task], partial_credit))
        tagged.append(float(single_answer(response) is not None))
    r = torch.tensor(rewards, dtype=torch.float32)
    return RewardOutput(rewards=r, scores=r.clone(), extra_logs={"answer_tag": torch.tensor(tagged)})
