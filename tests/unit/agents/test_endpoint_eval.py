"""`evaluate_agent` (what `rlhfkit eval --agent.func_path` reports): the mean reward and the mean of each
value the agent returned in extra_logs over all episodes (a dropped one counting 0), an episode of two
segments counted once, and rows that say which prompt and label each episode answered."""

import pytest
import torch

from rlhfkit.agents.endpoint.runner import evaluate_agent
from rlhfkit.data.types import Trajectory
from rlhfkit.rollout.base import SamplingParams


class Prompt:
    def __init__(self, text, label):
        self.text, self.raw, self.label, self.record = text, None, label, {}


def traj(group_id, episode, reward, logs, token):
    return Trajectory(prompt_ids=torch.tensor([1]), response_ids=torch.tensor([token]), loss_mask=torch.tensor([True]),
                      logprobs=torch.tensor([0.0]), finish_reason="stop", version=0, group_id=group_id,
                      info={"agent_reward": reward, "agent_score": reward, "extra_logs": logs, "turns": 2,
                            "episode": episode})


class StubExecutor:
    """4 episodes (2 prompts x 2): a first-try success, a second-try one split into two segments, a
    failure, and one dropped (no trajectory)."""

    def __init__(self):
        self.popped = False

    def run(self, engine, tokenizer, prompts, params, budget, seeds=None):
        return [traj(0, "a", 1.0, {"first_try": 1.0}, 5), traj(0, "b", 0.5, {"first_try": 0.0}, 6),
                traj(0, "b", 0.5, {"first_try": 0.0}, 7), traj(1, "c", 0.0, {"first_try": 0.0}, 8)]

    def pop_metrics(self):
        self.popped = True
        return {}


class Tok:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{i}" for i in ids)


def test_extra_logs_are_reported_and_rows_name_their_prompt_and_label():
    ex = StubExecutor()
    prompts = [Prompt("What is 1 + 2?", "3"), Prompt("What is 2 + 2?", "4")]
    metrics, rows = evaluate_agent(ex, None, Tok(), prompts, SamplingParams(max_new_tokens=4, n=2), budget=None)
    assert metrics["eval/reward"] == pytest.approx((1.0 + 0.5 + 0.0) / 4)  # the dropped episode counts 0
    assert metrics["eval/dropped"] == pytest.approx(1 / 4)
    assert metrics["eval/first_try"] == pytest.approx(1 / 4)  # one first-try success of 4 episodes
    assert [(r["prompt"], r["label"], r["reward"]) for r in rows] == [
        ("What is 1 + 2?", "3", 1.0), ("What is 1 + 2?", "3", 0.5), ("What is 2 + 2?", "4", 0.0)]
    assert rows[1]["response"] == "t6" and rows[1]["extra_logs"] == {"first_try": 0.0}  # its first segment
    assert ex.popped
