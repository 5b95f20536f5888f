"""`evaluate_agent` (what `rlhfkit eval --agent.func_path` reports): the mean reward and the mean of each
value the agent returned in extra_logs over all episodes (a dropped one counting 0), an episode of two
segments counted once, and rows that say which prompt and label each episode answered; the trainer's
held-out evaluation reports the same for an agent function."""

import pytest
import torch

from rlhfkit.agents.endpoint.runner import evaluate_agent
from rlhfkit.api.run_folder import make_evaluator
from rlhfkit.config import RLConfig
from rlhfkit.data.types import Trajectory
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.evaluate import Evaluator


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

    provides_rewards = True

    def __init__(self):
        self.popped = False

    def run(self, engine, tokenizer, prompts, params, budget, seeds=None, allow_all_dropped=False):
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


def test_held_out_evaluation_during_training_reports_an_agent_function_as_rlhfkit_eval_does():
    """The trainer's Evaluator on an agent function's executor: the dropped episode counts 0 and the
    split one once (the mean over trajectories would be (1 + 0.5 + 0.5 + 0) / 4 = 0.5)."""
    ex = StubExecutor()
    ex.fallback_reward_fn = None  # what marks an agent function's executor
    prompts = [Prompt("What is 1 + 2?", "3"), Prompt("What is 2 + 2?", "4")]
    evaluator = Evaluator(prompts, 4, 10, score_fn=None, n_samples=2, temperature=1.0, executor=ex)
    metrics, rows = evaluator.evaluate(None, Tok())
    assert metrics == pytest.approx({"eval/reward": 0.375, "eval/dropped": 0.25, "eval/first_try": 0.25})
    assert [r["label"] for r in rows] == ["3", "3", "4"]


def test_the_eval_executor_of_an_agent_function_gets_the_runs_reward_function():
    ex = StubExecutor()
    ex.fallback_reward_fn = None

    def reward_func(queries, prompts, labels, **kw):
        raise AssertionError("not called here")

    make_evaluator(RLConfig(), [], reward_func, executor=ex)
    assert ex.fallback_reward_fn is reward_func  # episodes whose agent returns None are scored, not dropped
