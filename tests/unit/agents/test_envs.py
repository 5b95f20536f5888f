"""The example environments: calculator tool and guessing game, alone and through the executor."""

import asyncio

import pytest

from rlhfkit.agents import MultiTurnExecutor, TokenBudget
from rlhfkit.agents.envs import calculator, guess
from rlhfkit.rollout.base import SamplingParams


@pytest.mark.parametrize("expr,value", [
    ("2*(3+4)", "14"), ("1/4", "1/4"), ("-3+10/2", "2"), ("1.5*2", "3"), ("1/0", "error: ZeroDivisionError"),
    ("__import__('os')", "error: ValueError"), ("2**10", "error: ValueError"), ("x", "error: ValueError"),
])
def test_calculate(expr, value):
    assert calculator.calculate(expr) == value


def test_parse_action_takes_the_first_tag():
    assert calculator.parse_action("hm <calc> 3+4 </calc> <answer>7</answer>") == ("calc", "3+4")
    assert calculator.parse_action("<answer>7</answer>") == ("answer", "7")
    assert calculator.parse_action("7") is None


@pytest.mark.parametrize("action,feedback,solved", [
    ("64", "\nhigher\n", False), ("80 or so", "\nlower\n", False), ("70", "\ncorrect\n", True),
    ("no idea", "\nsay a number\n", False),
])
def test_guess_feedback(action, feedback, solved):
    assert guess.guess_feedback(action, 70) == (feedback, solved)


def _step(env, action, label):
    return asyncio.run(env.step({"observation_text": "", "action_text": action, "label": label}))


def test_calculator_steps():
    env = calculator.AgentInstance()
    r = _step(env, "<calc>12*12</calc>", "144")
    assert r["environment_feedback"] == "<result>144</result>\n" and not r["done"] and r["rewards"] == 0.0
    r = _step(env, "so <answer>144</answer>", "144")
    assert r["done"] and r["rewards"] == 1.0 and r["extra_logs"] == {"tool_calls": 1.0}
    assert _step(calculator.AgentInstance(), "<answer>143</answer>", "144")["rewards"] == 0.0
    env = calculator.AgentInstance()
    results = [_step(env, "<calc>1+1</calc>", "2") for _ in range(calculator.MAX_CALLS)]
    assert [r["done"] for r in results] == [False] * (calculator.MAX_CALLS - 1) + [True]


def test_guess_rewards_faster_solutions_more():
    env = guess.AgentInstance()
    assert _step(env, "3", "5")["rewards"] == 0.0
    r = _step(env, "5", "5")
    assert r["done"] and r["rewards"] == pytest.approx(1 - guess.TURN_PENALTY) and r["scores"] == 1.0
    env = guess.AgentInstance()
    results = [_step(env, "1", "5") for _ in range(guess.MAX_GUESSES)]
    assert results[-1]["done"] and results[-1]["scores"] == 0.0


def test_calculator_episode_through_the_executor(tok, scripted):
    def policy(ctx):  # call the tool, then answer with its result
        return "<answer>12</answer>" if ctx.endswith("</result>\n") else "<calc>3*4</calc>"

    class Prompt:
        text, label = "q:", "12"
        ids = tok("q:", add_special_tokens=False)["input_ids"]

    engine = scripted(tok, policy)
    [t] = MultiTurnExecutor(calculator.AgentInstance).run(
        engine, tok, [Prompt()], SamplingParams(max_new_tokens=30), TokenBudget(30, 200, 4))
    text = tok.decode(t.response_ids.tolist())
    assert text == "<calc>3*4</calc><result>12</result>\n<answer>12</answer>"
    n_call, n_fb = len("<calc>3*4</calc>"), len("<result>12</result>\n")
    assert t.loss_mask.tolist() == [True] * n_call + [False] * n_fb + [True] * len("<answer>12</answer>")
    assert t.info["agent_reward"] == 1.0 and t.finish_reason == "stop"
