"""Text environments as chat episodes: a gymnasium-style class and look-alikes of GEM's and
TextArena's interfaces (always run), the real libraries where installed; observations come back
as user turns of the chat template, rewards are summed, done ends the episode, seeds from the row."""

import importlib.util
import re

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import (
    TextArenaTextEnv,
    TextEnvFactory,
    gem_env,
    load_text_env,
    row_seed,
    text_env,
    textarena_env,
)
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rollout.base import SamplingParams


class Guess:
    """GEM-like: reset(seed) -> (observation, info); step -> (obs, reward, terminated, truncated, info)."""

    def reset(self, seed=None):
        self.target, self.turn = (seed or 0) % 10, 0
        return "Guess my digit, as [d].", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"\[(\d)\]", action)
        if m is None:
            return "Write [d].", -0.1, False, self.turn >= 4, {}
        g = int(m.group(1))
        if g == self.target:
            return "Right!", 1.0, True, False, {}
        return ("higher" if g < self.target else "lower"), 0.0, False, self.turn >= 4, {}


class P:
    def __init__(self, text, record=None):
        self.text, self.raw, self.label, self.ids, self.record = text, text, None, [], record


def binary_search(ctx):
    """Halves 0..9 by the hints so far (a scripted policy of the decoded context): 4 first."""
    low, high = 0, 9
    for part in ctx.split("<|im_start|>assistant\n")[1:-1]:  # each past action and the user turn after it
        guess = int(re.search(r"\[(\d)\]", part).group(1))
        hint = part.split("<|im_start|>user\n")[-1]
        if "higher" in hint:
            low = guess + 1
        elif "lower" in hint:
            high = guess - 1
    return f"[{(low + high) // 2}]<|im_end|>"


def run(executor, chat_tok, scripted, prompts, turns=4):
    return executor.run(scripted(chat_tok, binary_search), chat_tok, prompts, SamplingParams(max_new_tokens=20),
                        TokenBudget(20, 400, turns))


def test_a_gymnasium_style_env_plays_through_chat_turns(chat_tok, scripted):
    ex = ToolExecutor(environment_factory=text_env(Guess))
    assert ex.provides_rewards
    (t,) = run(ex, chat_tok, scripted, [P("Play.", {"seed": 7})])
    roles = [m["role"] for m in t.info["messages"]]
    assert roles[0] == "user" and t.info["messages"][0]["content"] == "Play.\n\nGuess my digit, as [d]."
    # 4 -> higher, 7 -> right: two actions, the hint between them a user turn of the template
    assert roles[1:] == ["assistant", "user", "assistant"] and t.info["messages"][2]["content"] == "higher"
    assert t.info["agent_reward"] == 1.0 and t.finish_reason == "stop"
    response = chat_tok.decode(t.response_ids.tolist())
    assert response == "[4]<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n[7]<|im_end|>"
    masked = chat_tok.decode([x for x, m in zip(t.response_ids.tolist(), t.loss_mask.tolist()) if not m])
    assert masked == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"  # the observation: no loss
    assert ex.pop_metrics()["tools/rerender"] == 0.0
    assert t.info["prompt_messages"] == 1  # what the sample viewer leaves out


def test_rewards_are_summed_and_running_out_of_turns_truncates(chat_tok, scripted):
    class Stubborn(Guess):
        def step(self, action):
            obs, reward, done, trunc, info = super().step("nothing")  # never a valid guess: -0.1 each
            return obs, reward, False, False, info

    (t,) = run(ToolExecutor(environment_factory=text_env(Stubborn)), chat_tok, scripted, [P("Play.")], turns=3)
    assert t.info["agent_reward"] == pytest.approx(-0.3) and t.info["turns"] == 3 and t.finish_reason == "length"


def test_an_action_that_breaks_the_environment_ends_its_episode_with_reward_0(chat_tok, scripted):
    class Fragile(Guess):  # 0.5 for each wrong guess, and the guess 7 breaks it
        def step(self, action):
            if "[7]" in action:
                raise KeyError("7")
            obs, reward, done, trunc, info = super().step(action)
            return obs, reward or 0.5, done, trunc, info

    ex = ToolExecutor(environment_factory=text_env(Fragile))
    broken, fine = run(ex, chat_tok, scripted, [P("Play.", {"seed": 7}), P("Play.", {"seed": 4})])
    assert broken.info["agent_reward"] == 0.0 and broken.finish_reason == "length"  # 4 (0.5), then 7: nothing
    assert fine.info["agent_reward"] == 1.0 and fine.finish_reason == "stop"  # 4 is right
    assert ex.pop_metrics()["agent/env_errors"] == 1.0
    with pytest.raises(RewardError, match=r"failed in all 1 episodes .* step\(\) raised KeyError: '7'"):
        run(ex, chat_tok, scripted, [P("Play.", {"seed": 7})])


def test_the_row_seeds_the_environment():
    assert row_seed({"seed": 3, "label": "9"}) == 3 and row_seed({"label": "12"}) == 12
    assert row_seed({"label": "twelve"}) is None and row_seed({"seed": True}) is None and row_seed(None) is None


class ArenaLike:
    """TextArena-like: reset(num_players, seed); get_observation -> (player, [(from, text, kind)]);
    step -> (done, info); close -> (rewards by player, game info)."""

    def reset(self, num_players, seed=None):
        assert num_players == 1
        self.target, self.pending = (seed or 0) % 10, [(-1, "Guess my digit, as [d].", 1)]

    def get_observation(self):
        out, self.pending = self.pending, []
        return 0, out

    def step(self, action):
        g = int(re.search(r"\[(\d)\]", action).group(1))
        self.pending = [(0, action, 2)]  # the player's own echo, then the game's message
        if g == self.target:
            return True, {}
        self.pending.append((-1, "higher" if g < self.target else "lower", 4))
        return False, {}

    def close(self):
        return {0: 1.0}, {}


def test_textarena_style_games_give_new_messages_per_turn_and_the_reward_at_close(chat_tok, scripted):
    factory = TextEnvFactory(ArenaLike, "arena-like", TextArenaTextEnv)
    (t,) = run(ToolExecutor(environment_factory=factory), chat_tok, scripted, [P("Play.", {"seed": 1})])
    msgs = t.info["messages"]
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["Play.\n\nGuess my digit, as [d].", "lower"]
    assert t.info["agent_reward"] == 1.0  # 4 -> lower, 1 -> right


def test_environment_errors_are_one_line_and_bad_specs_are_refused(chat_tok, scripted, tmp_path):
    class Broken(Guess):
        def step(self, action):
            raise ValueError("no board\nmore")

    with pytest.raises(RewardError, match=r"environment .*Broken: step\(\) raised ValueError: no board$"):
        run(ToolExecutor(environment_factory=text_env(Broken)), chat_tok, scripted, [P("Play.")])
    with pytest.raises(ConfigError, match="LIBRARY:ENV_ID"):
        load_text_env("nothing")

    def needs_data():  # as GEM's Wordle without NLTK's word list: the message opens with a blank line
        raise LookupError("\n*****\n  Resource words not found.\n  nltk.download('words')\n")

    with pytest.raises(ConfigError, match=r"cannot create it \(LookupError: \*+ Resource words not found\. nltk"):
        text_env(needs_data, "wordle")()
    with pytest.raises(ConfigError, match="no class or function 'Nope'"):
        (tmp_path / "envs.py").write_text("class Guess:\n    pass\n")
        load_text_env(f"{tmp_path / 'envs.py'}:Nope")
    assert load_text_env(f"{tmp_path / 'envs.py'}:Guess").name.endswith("envs.py:Guess")


@pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="gem-llm is not installed (rlhfkit[gem])")
def test_gem_guess_the_number_through_the_adapter(chat_tok, scripted):
    factory = load_text_env("gem:game:GuessTheNumber-v0-easy")
    env = factory()
    first = env.env.reset(seed=11)[0]
    ex = ToolExecutor(environment_factory=factory)

    def boxed(ctx):
        return "\\boxed{3}<|im_end|>"

    (t,) = ex.run(scripted(chat_tok, boxed), chat_tok, [P("Play.", {"seed": 11})], SamplingParams(max_new_tokens=20),
                  TokenBudget(20, 2000, 2))
    assert t.info["messages"][0]["content"] == "Play.\n\n" + first  # the seed gives the same game
    assert t.info["messages"][2]["role"] == "user" and "you guessed 3" in t.info["messages"][2]["content"]
    with pytest.raises(ConfigError, match="no such environment"):
        gem_env("game:NoSuchGame-v0")


@pytest.mark.skipif(importlib.util.find_spec("textarena") is None, reason="textarena is not installed")
def test_textarena_guess_the_number_through_the_adapter(chat_tok, scripted):
    ex = ToolExecutor(environment_factory=textarena_env("GuessTheNumber-v0"))

    def sweep(ctx):  # 1, 2, 3, ... one guess per turn
        return f"[{ctx.count('<|im_start|>assistant')}]<|im_end|>"

    (t,) = ex.run(scripted(chat_tok, sweep), chat_tok, [P("Play.", {"seed": 5})], SamplingParams(max_new_tokens=20),
                  TokenBudget(20, 4000, 20))
    users = [m["content"] for m in t.info["messages"] if m["role"] == "user"]
    assert "Guess The Number" in users[0] and all("[" not in u for u in users[1:])  # no echo of the guesses
    # the game ended itself (a right guess, or its turn limit with partial credit): the reward of close()
    assert t.finish_reason == "stop" and 0 < t.info["agent_reward"] <= 1
    with pytest.raises(ConfigError, match="no such environment"):
        textarena_env("NoSuchGame-v0")


def test_an_error_message_opening_with_a_blank_line_is_named_by_its_first_words(chat_tok, scripted):
    class Blank(Guess):  # as nltk's LookupError: the message opens with a newline
        def step(self, action):
            raise LookupError("\n  Resource words not found.\n")

    with pytest.raises(RewardError, match=r"step\(\) raised LookupError: Resource words not found\.$"):
        run(ToolExecutor(environment_factory=text_env(Blank)), chat_tok, scripted, [P("Play.")])
