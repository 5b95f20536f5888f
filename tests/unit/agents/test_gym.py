"""Gymnasium-style text environments through gym_agent and the multi-turn executor."""

import pytest

from rlhfkit.agents import MultiTurnExecutor, TokenBudget
from rlhfkit.agents.gym import gym_agent
from rlhfkit.errors import RewardError
from rlhfkit.rollout.base import SamplingParams


class Guess:
    """Guess the label; gymnasium's API on strings."""

    def reset(self, seed=None, options=None):
        self.target, self.tries = str(options["label"]), 0
        return " (guess 1-9)", {}

    def step(self, action):
        self.tries += 1
        right = action.strip() == self.target
        obs = "\nright\n" if right else "\nno\n"
        return obs, (1.0 if right else 0.0), right, self.tries >= 3, {"tries": self.tries}


class P:
    def __init__(self, tok, text, label):
        self.text, self.label, self.ids = text, label, tok(text, add_special_tokens=False)["input_ids"]


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_gym_env_episodes_sum_rewards_and_end_on_terminated_or_truncated(tok, scripted):
    engine = scripted(tok, lambda ctx: "4" if ctx.count("no") >= 1 else "2")
    ex = MultiTurnExecutor(gym_agent(Guess))
    right, wrong = ex.run(engine, tok, [P(tok, "g:", "4"), P(tok, "h:", "7")], SamplingParams(max_new_tokens=2),
                          TokenBudget(2, 40, 5))
    # the reset observation joins the prompt; "no" feedback is masked out; "right" ends the episode
    assert right.prompt_ids.tolist() == ids(tok, "g: (guess 1-9)")
    assert right.response_ids.tolist() == ids(tok, "2\nno\n4")
    assert right.loss_mask.tolist() == [True] + [False] * 4 + [True]
    assert right.info["agent_reward"] == 1.0 and right.info["turns"] == 2 and right.finish_reason == "stop"
    assert wrong.info["agent_reward"] == 0.0 and wrong.info["turns"] == 3  # truncated by the env after 3 tries
    assert wrong.info["extra_logs"] == {"tries": 3.0}


def test_a_step_that_breaks_the_contract_is_named():
    class Bad:
        def reset(self):
            return "x"

        def step(self, action):
            return "obs"

    import asyncio

    inst = gym_agent(Bad)()
    assert asyncio.run(inst.reset({"observation": "p:"})) == {"observation": "p:x"}
    with pytest.raises(RewardError, match="gym environment .*Bad: step\\(\\) must return"):
        asyncio.run(inst.step({"action_text": "a"}))
