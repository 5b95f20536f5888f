"""OpenEnv environments as chat episodes, against a real OpenEnv server on 127.0.0.1 (openenv-core installed; it cannot
sit beside rlhfkit's pinned set, so this runs where it is installed): a session per episode, seeded reset, text
actions, rewards summed, the session closed when the episode is over, even when it is cut."""

import sys

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import load_text_env, openenv_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rollout.base import SamplingParams

pytest.importorskip("openenv.core", reason="openenv-core is not installed (rlhfkit[openenv])")

from tests.unit.agents.openenv_server import guess_server  # noqa: E402


class P:
    def __init__(self, text, record=None):
        self.text, self.raw, self.label, self.ids, self.record = text, text, None, [], record


def count_up(ctx):
    """Says 1, 2, 3, ...: one more than the turns so far."""
    return f"{ctx.count('<|im_start|>assistant')}<|im_end|>"


def run(factory, chat_tok, scripted, prompts, turns=4):
    return ToolExecutor(environment_factory=factory).run(
        scripted(chat_tok, count_up), chat_tok, prompts, SamplingParams(max_new_tokens=20), TokenBudget(20, 400, turns))


def test_an_openenv_server_plays_through_chat_turns(chat_tok, scripted):
    with guess_server(max_sessions=3) as url:  # every episode of a rollout holds a session at once
        factory = load_text_env(f"openenv:{url}")
        two, seven, again = run(factory, chat_tok, scripted, [P("Play.", {"seed": 2}), P("Play.", {"seed": 7}),
                                                               P("Play.", {"seed": 12})], turns=3)
    assert [(m["role"], m["content"]) for m in two.info["messages"]] == [
        ("user", "Play.\n\nGuess my digit."), ("assistant", "1"), ("user", "not 1"), ("assistant", "2")]
    assert two.info["agent_reward"] == 1.0 and two.finish_reason == "stop"
    # 7 is never reached in three tries: the server ends the episode itself (done), reward 0
    assert seven.info["agent_reward"] == 0.0 and seven.info["turns"] == 3
    assert again.info["agent_reward"] == 1.0  # seed 12: the digit 2 again


def test_sessions_of_episodes_cut_by_the_turn_budget_are_closed_too(chat_tok, scripted):
    with guess_server(max_sessions=2) as url:
        factory = openenv_env(url)
        for _ in range(2):  # two rollouts of two episodes cut after one turn: the second needs the first's sessions
            cut = run(factory, chat_tok, scripted, [P("Play.", {"seed": 5}), P("Play.", {"seed": 6})], turns=1)
            assert [t.finish_reason for t in cut] == ["length", "length"]


def test_typed_actions_and_observations_from_python(chat_tok, scripted):
    from openenv.core import GenericEnvClient

    with guess_server() as url:
        factory = openenv_env(lambda: GenericEnvClient(base_url=url), action=lambda text: {"message": text[::-1]},
                              observation=lambda obs: obs["prompt"].upper())
        (t,) = run(factory, chat_tok, scripted, [P("Play.", {"seed": 1})])
        assert t.info["messages"][0]["content"] == "Play.\n\nGUESS MY DIGIT." and t.info["agent_reward"] == 1.0
        blind = openenv_env(url, observation=lambda obs: 3)
        with pytest.raises(RewardError, match=r"reset\(\) gave a int observation"):
            run(blind, chat_tok, scripted, [P("Play.")])


def test_without_openenv_or_a_server_the_errors_are_one_line(chat_tok, scripted, monkeypatch):
    with pytest.raises(RewardError, match=r"environment openenv:http://127.0.0.1:9: reset\(\) raised ConnectionError"):
        run(openenv_env("http://127.0.0.1:9"), chat_tok, scripted, [P("Play.")])
    monkeypatch.setitem(sys.modules, "openenv.core", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"openenv.core is not installed: pip install 'rlhfkit\[openenv\]'"):
        load_text_env("openenv:http://127.0.0.1:9")
