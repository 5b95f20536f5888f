"""SkyRL-Gym text environments (skyrl-gym installed: rlhfkit[skyrl]) as chat episodes: a BaseTextEnv
subclass from a file and the registered gsm8k / gsm8k_multi_turn, made per episode with the row as
their `extras`; `init` gives the prompt, `step`'s observations come back as chat turns, rewards are
summed, `close` runs when the episode is done."""

import sys

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import load_text_env, skyrl_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rollout.base import SamplingParams

pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (rlhfkit[skyrl])")

ENV = '''
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

CLOSED = []


class Countdown(BaseTextEnv):
    """Say the row's target digit; 0.25 for each wrong digit, 1 for the right one."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        assert "prompt" not in extras and "env_class" not in extras, "SkyRL passes neither"
        self.target, self.bonus = extras["target"], env_config.get("bonus", 0.0)

    def init(self, prompt):
        return [{"role": "system", "content": "Digits only."}, *prompt], {}

    def step(self, action):
        self.turns += 1
        right = action.strip() == str(self.target)
        obs = [] if right else [{"role": "user", "content": f"not {action.strip()}"}]
        return BaseTextEnvStepOutput(observations=obs, reward=1.0 if right else 0.25, done=right, metadata={})

    def close(self):
        CLOSED.append(self.target)
'''


class P:
    def __init__(self, text, record=None):
        self.text, self.raw, self.label, self.ids, self.record = text, text, None, [], record


def count_up(ctx):
    """Answers 1, 2, 3, ...: one more than the turns so far."""
    return f"{ctx.count('<|im_start|>assistant')}<|im_end|>"


def run(factory, chat_tok, scripted, prompts, policy=count_up, turns=4):
    ex = ToolExecutor(environment_factory=factory)
    return ex, ex.run(scripted(chat_tok, policy), chat_tok, prompts, SamplingParams(max_new_tokens=20),
                      TokenBudget(20, 400, turns))


def test_a_base_text_env_subclass_from_a_file_plays_through_chat_turns(chat_tok, scripted, tmp_path):
    (tmp_path / "envs.py").write_text(ENV)
    factory = load_text_env(f"{tmp_path / 'envs.py'}:Countdown")
    ex, (t,) = run(factory, chat_tok, scripted, [P("Count.", {"target": 2, "env_class": "x", "prompt": "Count."})])
    assert ex.provides_rewards
    msgs = t.info["messages"]
    # init's messages are the prompt; the wrong guess's observation is a user turn; the right one ends it
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("system", "Digits only."), ("user", "Count."), ("assistant", "1"), ("user", "not 1"),
        ("assistant", "2")]
    assert t.info["agent_reward"] == pytest.approx(0.25 + 1.0) and t.finish_reason == "stop"
    assert chat_tok.decode(t.prompt_ids.tolist()) == \
        "<|im_start|>system\nDigits only.<|im_end|>\n<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n"
    assert chat_tok.decode(t.response_ids.tolist()) == "1<|im_end|>\n<|im_start|>user\nnot 1<|im_end|>\n" \
        "<|im_start|>assistant\n2<|im_end|>"
    masked = chat_tok.decode([x for x, m in zip(t.response_ids.tolist(), t.loss_mask.tolist()) if not m])
    assert masked == "\n<|im_start|>user\nnot 1<|im_end|>\n<|im_start|>assistant\n"  # the observation: no loss
    closed = [m for name, m in sys.modules.items() if name.startswith("rlhfkit_environment_file_envs")]
    assert any(getattr(m, "CLOSED", None) == [2] for m in closed)  # close() ran once, when the episode was done


def test_each_episode_gets_its_own_environment_made_from_its_row(chat_tok, scripted, tmp_path):
    (tmp_path / "envs.py").write_text(ENV)
    factory = load_text_env(f"{tmp_path / 'envs.py'}:Countdown")
    _, (a, b) = run(factory, chat_tok, scripted, [P("Count.", {"target": 1}), P("Count.", {"target": 3})])
    assert a.info["agent_reward"] == 1.0 and b.info["agent_reward"] == pytest.approx(0.25 + 0.25 + 1.0)


def test_skyrl_gsm8k_scores_the_answer_against_the_rows_reward_spec(chat_tok, scripted):
    def answer(ctx):
        return "so #### 72<|im_end|>"

    rows = [{"reward_spec": {"method": "rule", "ground_truth": "72"}},
            {"reward_spec": {"method": "rule", "ground_truth": "71"}}]
    _, (right, wrong) = run(skyrl_env("gsm8k"), chat_tok, scripted, [P("Q?", r) for r in rows], answer)
    assert right.info["agent_reward"] == 1.0 and wrong.info["agent_reward"] == 0.0
    assert right.info["turns"] == 1 and right.finish_reason == "stop"  # gsm8k is done after one step


def test_skyrl_gsm8k_multi_turn_sums_its_turn_rewards(chat_tok, scripted):
    def guesses(ctx):  # #### 5, then #### 7
        return f"#### {3 + 2 * ctx.count('<|im_start|>assistant')}<|im_end|>"

    row = {"reward_spec": {"ground_truth": "7"}, "max_turns": 3}
    _, (t,) = run(load_text_env("skyrl:gsm8k_multi_turn"), chat_tok, scripted, [P("Q?", row)], guesses)
    # turn 1: well formatted but wrong, 0.2 / max_turns; turn 2: right, 1.0 and done
    assert t.info["agent_reward"] == pytest.approx(0.2 / 3 + 1.0)
    user = [m["content"] for m in t.info["messages"] if m["role"] == "user"]
    assert user[0] == "Q?" and user[1].startswith("Please provide your step-by-step reasoning")


def test_bad_specs_and_a_malformed_step_are_one_line_errors(chat_tok, scripted, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"--agent.env skyrl:gsm9k: no such environment$"):
        load_text_env("skyrl:gsm9k")
    (tmp_path / "envs.py").write_text(ENV.replace("return BaseTextEnvStepOutput(", "return 0 or (")
                                      .replace("observations=obs, reward=1.0 if right else 0.25, done=right, "
                                               "metadata={})", "obs)"))
    with pytest.raises(RewardError, match=r"step\(\) must return a dict with observations, reward and done"):
        run(load_text_env(f"{tmp_path / 'envs.py'}:Countdown"), chat_tok, scripted, [P("Count.", {"target": 2})])
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"skyrl_gym is not installed: pip install 'rlhfkit\[skyrl\]'"):
        load_text_env("skyrl:gsm8k")


def test_a_close_that_raises_ends_its_episode_as_a_step_that_raises_does(chat_tok, scripted, tmp_path):
    (tmp_path / "envs.py").write_text(ENV.replace("        self.turns += 1\n", "        self.turns += 1\n"
                                                  "        assert self.target != 9, 'nine breaks me'\n")
                                      .replace("        CLOSED.append(self.target)\n",
                                               "        assert self.target != 9, 'still broken'\n"))
    factory = load_text_env(f"{tmp_path / 'envs.py'}:Countdown")
    ex, (fine, broken) = run(factory, chat_tok, scripted, [P("Count.", {"target": 1}), P("Count.", {"target": 9})])
    assert fine.info["agent_reward"] == 1.0 and broken.info["agent_reward"] == 0.0
    assert ex.env_errors.count == 1  # step() and then close() raised: one episode ended, counted once
    with pytest.raises(RewardError, match=r"failed in all 1 episodes .* step\(\) raised AssertionError: nine"):
        run(factory, chat_tok, scripted, [P("Count.", {"target": 9})])  # a batch of broken ones only
