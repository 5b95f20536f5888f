"""--agent.on_rerender segment on the published Qwen3 chat template (TRL's wheel ships it; skipped
where trl is not installed), over a character-level tokenizer with Qwen's special tokens: a
re-rendered history ends a segment, the next turn samples from the conversation as rendered afresh,
each segment trains exactly its sampled tokens, and all segments of an episode share its reward,
its one score by the reward function, its one place in the group baseline and its one eval sample."""

import re

import pytest
import torch

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import text_env
from rlhfkit.agents.tools import ToolTemplate
from rlhfkit.agents.tools.agent import ON_RERENDER, ToolExecutor
from rlhfkit.config import RLConfig
from rlhfkit.config.rl_checks import ON_RERENDER as CONFIG_ON_RERENDER
from rlhfkit.core.advantages import episode_baseline
from rlhfkit.errors import ConfigError
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.evaluate import Evaluator
from rlhfkit.trainers.rl.experience import episode_ids
from rlhfkit.trainers.rl.scoring import Scorer

from .conftest import char_tokenizer
from .test_tool_templates import QWEN, TEMPLATES, multiply

pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="trl (which ships the published chat templates) "
                                                          "is not installed")
THINK = "<think>\nfive is central\n</think>\n\n[4]<|im_end|>"


@pytest.fixture(scope="module")
def qwen3():
    return char_tokenizer((TEMPLATES / "qwen3.jinja").read_text(), QWEN)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


class P:
    def __init__(self, text, record=None):
        self.text, self.raw, self.label, self.ids, self.record = text, text, None, [], record


def guess_env(targets):
    """A digit game whose episodes get `targets` in turn; right at turn k gives reward 1/k."""

    class Guess:
        order = iter(targets)

        def reset(self, seed=None):
            self.target, self.turn = next(Guess.order), 0
            return "Guess my digit, as [d]."

        def step(self, action):
            self.turn += 1
            right = int(re.search(r"\[(\d)\]", action).group(1)) == self.target
            return ("right" if right else "higher"), (1.0 / self.turn if right else 0.0), right, False, {}

    return text_env(Guess)


def thinks_then_guesses(ctx):
    """Thinks before its first guess (4); answers 7 after a hint."""
    return THINK if ctx.count("<|im_start|>assistant") == 1 else "[7]<|im_end|>"


def play(tok, scripted, mode, targets=(7,), n=1):
    ex = ToolExecutor(environment_factory=guess_env(targets), on_rerender=mode)
    engine = scripted(tok, thinks_then_guesses)
    trajs = ex.run(engine, tok, [P("Play.")], SamplingParams(max_new_tokens=40, n=n), TokenBudget(40, 400, 3))
    return ex, engine, trajs


def test_keep_trains_one_trajectory_and_counts_the_rerender(qwen3, scripted):
    ex, _, trajs = play(qwen3, scripted, "keep")
    (t,) = trajs
    assert "episode" not in t.info and t.info["agent_reward"] == 0.5  # right at turn 2
    assert qwen3.decode(t.response_ids.tolist()).startswith(THINK)  # the sampled <think> stays
    m = ex.pop_metrics()
    assert m["tools/rerender"] == 1.0 and m["tools/segments"] == 0.0


def test_segment_splits_where_the_template_rerenders_the_history(qwen3, scripted):
    ex, engine, trajs = play(qwen3, scripted, "segment")
    first, second = trajs
    tt = ToolTemplate(qwen3)
    user = {"role": "user", "content": "Play.\n\nGuess my digit, as [d]."}
    a1, a2 = ids(qwen3, THINK), ids(qwen3, "[7]<|im_end|>")
    assert first.prompt_ids.tolist() == tt.prompt_ids([user]) and first.response_ids.tolist() == a1
    # Qwen3 drops the first turn's <think> once a user turn follows: the second segment's prompt is the
    # conversation rendered afresh, and the second turn was sampled after exactly those tokens
    rendered = ids(qwen3, "<|im_start|>user\nPlay.\n\nGuess my digit, as [d].<|im_end|>\n<|im_start|>assistant\n[4]"
                          "<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")
    assert second.prompt_ids.tolist() == rendered == tt.prompt_ids(first.info["messages"][:3])
    assert engine.calls[1][0] == [rendered]
    assert second.response_ids.tolist() == a2
    for t, sampled in ((first, a1), (second, a2)):  # only the sampled tokens train, with the engine's logprobs
        assert t.loss_mask.all() and t.logprobs.tolist() == [-0.5] * len(sampled) and t.finish_reason == "stop"
    assert [t.info["agent_reward"] for t in trajs] == [0.5, 0.5] and first.group_id == second.group_id == 0
    assert first.info["episode"] == second.info["episode"] and len(first.info["messages"]) == 4
    assert episode_ids(trajs).tolist() == [0, 0]
    m = ex.pop_metrics()
    assert m["tools/segments"] == 1.0 and m["tools/rerender"] == 1.0


def test_the_group_baseline_counts_each_episode_once(qwen3, scripted):
    # episode A (target 7): right at turn 2, two segments, reward 0.5; episode B (target 4): right at once, 1.0
    _, _, trajs = play(qwen3, scripted, "segment", targets=(7, 4), n=2)
    assert len(trajs) == 3 and trajs[0].info["episode"] != trajs[2].info["episode"]
    rewards = torch.tensor([t.info["agent_reward"] for t in trajs])
    groups = torch.tensor([t.group_id for t in trajs])
    shaped = episode_baseline(rewards, groups, episode_ids(trajs), "mean")
    assert shaped.tolist() == [-0.25, -0.25, 0.25]  # mean over the 2 episodes (0.75), not the 3 rows (2/3)


def test_an_episode_that_runs_out_of_turns_after_a_split_leaves_no_empty_segment(qwen3, scripted):
    ex = ToolExecutor(environment_factory=guess_env((9,)), on_rerender="segment")
    trajs = ex.run(scripted(qwen3, thinks_then_guesses), qwen3, [P("Play.")], SamplingParams(max_new_tokens=40),
                   TokenBudget(40, 400, 1))
    # 4 -> higher: the history re-renders (a split), and no turn is left to sample in the new segment
    (t,) = trajs
    assert t.response_ids.tolist() == ids(qwen3, THINK) and t.finish_reason == "length"
    assert t.info["agent_reward"] == 0.0 and "episode" in t.info
    m = ex.pop_metrics()
    assert m["tools/segments"] == 0.0 and m["tools/rerender"] == 1.0  # segments beyond the first: none trains


def test_tool_episodes_in_non_thinking_mode_split_too(qwen3, scripted):
    """enable_thinking=False puts an empty <think></think> before each turn, which the template leaves out
    of earlier turns: every tool result re-renders the history."""
    call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call><|im_end|>'

    def policy(ctx):
        return "408<|im_end|>" if "</tool_response>" in ctx else call

    ex = ToolExecutor([multiply], on_rerender="segment", enable_thinking=False)
    first, second = ex.run(scripted(qwen3, policy), qwen3, [P("12*34?")], SamplingParams(max_new_tokens=80),
                           TokenBudget(80, 400, 3))
    assert qwen3.decode(first.prompt_ids.tolist()).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert first.response_ids.tolist() == ids(qwen3, call)
    prompt = qwen3.decode(second.prompt_ids.tolist())
    assert prompt.endswith("<|im_start|>assistant\n" + call + "\n<|im_start|>user\n<tool_response>\n408\n"
                           "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert second.response_ids.tolist() == ids(qwen3, "408<|im_end|>") and second.loss_mask.all()
    assert first.info["episode"] == second.info["episode"] and second.info["tool_calls"] == 1


class Counter:
    """TRL's environment_factory contract: a counter whose reward is whether it reached 10."""

    def reset(self, **row):
        self.n = 7

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: how much to add
        """
        self.n += by
        return self.n

    def get_reward(self) -> float:
        return float(self.n == 10)


def test_environment_factory_episodes_split_and_every_segment_gets_the_environments_reward(qwen3, scripted):
    call = '<tool_call>\n{"name": "increment", "arguments": {"by": 3}}\n</tool_call><|im_end|>'

    def policy(ctx):
        return "done<|im_end|>" if "</tool_response>" in ctx else call

    ex = ToolExecutor(environment_factory=Counter, on_rerender="segment", enable_thinking=False)
    trajs = ex.run(scripted(qwen3, policy), qwen3, [P("count")], SamplingParams(max_new_tokens=80, n=2),
                   TokenBudget(80, 400, 3))
    assert [qwen3.decode(t.response_ids.tolist()) for t in trajs] == [call, "done<|im_end|>"] * 2
    assert [t.info["agent_reward"] for t in trajs] == [1.0] * 4  # 7 + 3 == 10, on both segments
    assert episode_ids(trajs).tolist() == [0, 0, 1, 1] and ex.pop_metrics()["tools/segments"] == 2.0


class CountingReward:
    """A reward function that scores 1 when the response holds a 7, and records its batch sizes."""

    def __init__(self):
        self.sizes = []

    def __call__(self, queries, prompts, labels, **kwargs):
        self.sizes.append(len(queries))
        r = torch.tensor([float("[7]" in x) for x in kwargs["responses"]])
        return RewardOutput(r, r, {"seen": torch.arange(len(queries), dtype=torch.float32)})


def test_a_reward_function_scores_an_episode_once_and_every_segment_gets_it(qwen3, scripted):
    _, _, trajs = play(qwen3, scripted, "segment", targets=(7, 4), n=2)
    fn = CountingReward()
    scored = Scorer(fn, qwen3, max_len=400)([P("Play.")], trajs)
    assert fn.sizes == [2]  # two episodes, three segments: scored on each episode's last segment
    assert scored.rewards.tolist() == [1.0, 1.0, 0.0]
    # the metrics count each episode once: seen 0 and 1 (per row it would be 0, 0, 1), reward 1 and 0
    assert scored.metrics["reward_extra/seen"] == pytest.approx(0.5) and scored.metrics["reward"] == 0.5


def test_eval_counts_an_episode_in_segments_as_one_sample(qwen3, scripted):
    ex = ToolExecutor(environment_factory=guess_env((7, 4)), on_rerender="segment")
    evaluator = Evaluator([P("Play.")], 40, 0, None, n_samples=2, executor=ex, budget=TokenBudget(40, 400, 3))
    metrics, rows = evaluator.evaluate(scripted(qwen3, thinks_then_guesses), qwen3)
    assert len(rows) == 2 and metrics["eval/reward"] == pytest.approx(0.75) and metrics["eval/tools/segments"] == 1.0
    assert rows[0]["response"] == "[7]"  # episode A's last segment


def test_the_mode_is_checked_and_refused_where_it_does_nothing():
    assert ON_RERENDER == CONFIG_ON_RERENDER
    with pytest.raises(ConfigError, match="--agent.on_rerender: unknown value 'drop'; valid: keep, segment"):
        ToolExecutor([multiply], on_rerender="drop")
    with pytest.raises(ConfigError, match="--agent.on_rerender: unknown value 'drop'"):
        RLConfig.from_args(["--agent.on_rerender", "drop", "--agent.tools", "builtin:calculator"])
    from rlhfkit.api.builder import build_executor

    cfg = RLConfig.from_args(["--agent.on_rerender", "segment"])
    with pytest.raises(ConfigError, match="--agent.on_rerender segment applies to tool-calling"):
        build_executor(cfg)
    assert build_executor(cfg, tools=[multiply]).on_rerender == "segment"
