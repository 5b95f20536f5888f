"""resolve_reward: callables and files in OpenRLHF's and TRL's contracts, lists with weights."""

from __future__ import annotations

import asyncio
import textwrap

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import (
    BUILTIN_REWARDS,
    CallableRewardFn,
    RewardOutput,
    RewardSum,
    batched,
    resolve_reward,
)
from rlhfkit.rewards.guard import TimeLimitedReward
from rlhfkit.rewards.remote import RemoteRewardFn

# Two prompts, two samples each, as the trainer passes them.
RAW = ["What is 2+3?", "What is 2+3?", "Name a prime.", "Name a prime."]
PROMPTS = [f"Q: {r}\nA:" for r in RAW]
RESPONSES = [" 5", " 6", " 7", " 9"]
QUERIES = [p + r for p, r in zip(PROMPTS, RESPONSES)]
LABELS = ["5", "5", "7", "7"]
RECORDS = [{"prompt": r, "solution": s, "difficulty": d, "labels": "column"}
           for r, s, d in zip(RAW, ["5", "5", "7", "7"], [1, 1, 3, 3])]
KWARGS = dict(responses=RESPONSES, response_lengths=torch.tensor([1.0, 1.0, 1.0, 1.0]),
              group_ids=torch.tensor([0, 0, 1, 1]), completion_ids=[[20], [21], [22], [24]],
              raw_prompts=RAW, records=RECORDS)


def call(fn):
    return fn(QUERIES, PROMPTS, LABELS, **KWARGS)


def test_openrlhf_file_gets_named_columns_but_not_over_standard_arguments(tmp_path):
    path = tmp_path / "rm.py"
    path.write_text(textwrap.dedent("""
        def reward_func(queries, prompts, labels, solution, responses=None):
            assert labels == ["5", "5", "7", "7"]  # the "labels" column does not replace them
            return [float(r.strip() == s) for r, s in zip(responses, solution)]
    """))
    fn = resolve_reward(str(path))
    assert isinstance(fn, CallableRewardFn) and fn.name == "rm" and fn.contract == "openrlhf"
    out = call(fn)
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_openrlhf_callable_with_kwargs_gets_every_argument_and_column():
    seen = {}

    def reward_func(queries, prompts, labels, **kwargs):
        seen.update(kwargs)
        return {"rewards": [0.5, 1.0, 0.0, 2.0], "extra_logs": {"n": 4.0}}

    out = call(resolve_reward(reward_func))
    assert out.rewards.tolist() == [0.5, 1.0, 0.0, 2.0]
    assert out.scores.tolist() == [0.5, 1.0, 0.0, 2.0]
    assert out.extra_logs["n"].tolist() == [4.0] * 4
    assert set(seen) == set(KWARGS) | {"prompt", "solution", "difficulty"}  # no "labels" column
    assert seen["prompt"] == RAW and seen["difficulty"] == [1, 1, 3, 3]
    assert seen["records"] == RECORDS


def test_trl_callable_gets_prompts_completions_ids_and_columns():
    seen = {}

    def accuracy(completions, solution, **kwargs):
        seen.update(kwargs, completions=completions)
        return [float(c.strip() == s) for c, s in zip(completions, solution)]

    fn = resolve_reward(accuracy)
    assert fn.contract == "trl"
    out = call(fn)
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert seen["completions"] == RESPONSES and seen["prompts"] == RAW
    assert seen["completion_ids"] == [[20], [21], [22], [24]]
    assert seen["difficulty"] == [1, 1, 3, 3] and seen["labels"] == ["column"] * 4
    assert "prompt" not in seen and "responses" not in seen and "records" not in seen


def test_trl_conversational_completions_are_assistant_messages():
    chats = [[{"role": "user", "content": r}] for r in RAW]

    def short(completions, prompts):
        assert prompts == chats
        return [float(len(c[0]["content"]) < 3) for c in completions]

    seen = []
    resolve_reward(lambda completions, **kw: seen.extend(completions) or [0.0] * 4)(
        QUERIES, PROMPTS, LABELS, **{**KWARGS, "raw_prompts": chats})
    assert seen == [[{"role": "assistant", "content": r}] for r in RESPONSES]
    out = resolve_reward(short)(QUERIES, PROMPTS, LABELS, **{**KWARGS, "raw_prompts": chats})
    assert out.rewards.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_trl_without_trainer_extras_uses_templated_prompts_and_query_tails():
    def echo(prompts, completions):
        return [float(c == " 5" and p.startswith("Q:")) for p, c in zip(prompts, completions)]

    assert resolve_reward(echo)(QUERIES, PROMPTS, LABELS).rewards.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_list_with_weights_sums_rewards_and_scores_and_logs_each_function():
    def acc(completions, solution, **kwargs):
        return [float(c.strip() == s) for c, s in zip(completions, solution)]

    def length(queries, prompts, labels, **kwargs):
        return {"rewards": [1.0, 2.0, 3.0, 4.0], "scores": [0.0, 0.0, 1.0, 1.0],
                "extra_logs": {"k": [9.0, 9.0, 9.0, 9.0]}}

    fn = resolve_reward([acc, length], weights=[2.0, 0.5])
    assert isinstance(fn, RewardSum)
    out = call(fn)
    # acc = [1, 0, 1, 0]; length = [1, 2, 3, 4], its scores [0, 0, 1, 1]
    assert out.rewards.tolist() == [2.5, 1.0, 3.5, 2.0]
    assert out.scores.tolist() == [2.0, 0.0, 2.5, 0.5]
    assert sorted(out.extra_logs) == ["acc", "length", "length/k"]
    assert out.extra_logs["acc"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.extra_logs["length"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert call(resolve_reward([acc, acc])).extra_logs.keys() == {"acc", "acc_2"}


def test_none_is_skipped_in_the_sum():
    def math_only(completions, difficulty, **kwargs):
        return [float(c.strip() == "5") if d == 1 else None
                for c, d in zip(completions, difficulty)]

    def prime_only(completions, difficulty, **kwargs):
        return [None if d == 1 else float(c.strip() in "2357")
                for c, d in zip(completions, difficulty)]

    out = call(resolve_reward([math_only, prime_only], weights=[1.0, 3.0]))
    assert out.rewards.tolist() == [1.0, 0.0, 3.0, 0.0]
    logs = out.extra_logs
    assert logs["math_only"][:2].tolist() == [1.0, 0.0] and logs["math_only"][2:].isnan().all()
    assert logs["prime_only"][:2].isnan().all() and logs["prime_only"][2:].tolist() == [1.0, 0.0]


def test_a_sample_every_function_skips_is_refused_naming_them():
    def never(completions, **kwargs):
        return [None] * len(completions)

    def first_only(completions, **kwargs):
        return [1.0] + [None] * (len(completions) - 1)

    with pytest.raises(RewardError, match=r"every reward function \(never, first_only\) returned "
                                          r"None for sample 1 of 4"):
        call(resolve_reward([never, first_only]))
    with pytest.raises(RewardError, match=r"first_only returned None for sample 1 of 4; a reward "
                                          "function used alone must score every sample"):
        call(resolve_reward(first_only))


def test_async_callable_alone_batched_and_inside_a_running_loop():
    @batched(3)
    async def slow(completions, **kwargs):
        await asyncio.sleep(0)
        return [float(len(completions))] * len(completions)

    fn = resolve_reward(slow)
    assert call(fn).rewards.tolist() == [3.0, 3.0, 3.0, 1.0]

    async def from_a_notebook():
        return call(fn)

    assert asyncio.run(from_a_notebook()).rewards.tolist() == [3.0, 3.0, 3.0, 1.0]


def test_refusals_name_both_contracts():
    def wrong(texts, answers):
        return [0.0] * len(texts)

    both = (r"OpenRLHF's `reward_func\(queries, prompts, labels, \*\*kwargs\)`.*"
            r"TRL's `reward\(completions")
    with pytest.raises(RewardError, match=r"reward function wrong with parameters "
                                          r"\(texts, answers\) fits neither contract.*" + both):
        resolve_reward(wrong)
    with pytest.raises(RewardError, match=r"type int is not a reward function.*" + both) as info:
        resolve_reward(3)
    assert "\n" not in str(info.value)
    with pytest.raises(RewardError, match=r"reward_fn of type dict .*" + both):
        resolve_reward([{"a": 1}])


def test_a_raising_function_names_itself():
    def picky(completions, **kwargs):
        raise KeyError("solution")

    with pytest.raises(RewardError, match=r"function picky raised KeyError: 'solution'") as info:
        call(resolve_reward([picky]))
    assert isinstance(info.value.__cause__, KeyError)


def test_weights_of_the_wrong_length_name_both_lengths():
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match="reward_weights has 3 entries for 2 reward functions"):
        resolve_reward([one, one], weights=[1.0, 2.0, 3.0])
    with pytest.raises(RewardError, match="reward_weights has 2 entries for 1 reward functions"):
        resolve_reward(one, weights=[1.0, 2.0])
    with pytest.raises(RewardError, match="finite numbers"):
        resolve_reward([one], weights=[float("nan")])
    assert call(resolve_reward(one, weights=[-2.0])).rewards.tolist() == [-2.0] * 4


def test_builtins_urls_reward_fns_and_timeouts():
    assert set(BUILTIN_REWARDS) == {"builtin:math", "builtin:code", "builtin:reasoning_gym"}
    fn = resolve_reward("builtin:math")
    assert fn.name == "builtin_math_reward"
    assert call(fn).rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(RewardError, match="unknown reward 'builtin:nope'; the built-in rewards are "
                                          "builtin:code, builtin:math, builtin:reasoning_gym"):
        resolve_reward("builtin:nope")
    remote = resolve_reward("http://a:1/get_reward,http://b:2/get_reward",
                            remote_options={"max_retries": 0}, timeout=5.0)
    assert isinstance(remote, RemoteRewardFn) and remote.urls[1] == "http://b:2/get_reward"
    assert remote.max_retries == 0
    assert resolve_reward(remote) is remote
    limited = resolve_reward("builtin:math", timeout=5.0)
    assert isinstance(limited, TimeLimitedReward) and limited.timeout == 5.0
    with pytest.raises(RewardError, match="empty list"):
        resolve_reward([])
    with pytest.raises(RewardError, match="cannot hold another list"):
        resolve_reward([["builtin:math"]])


def test_an_object_returning_reward_output_is_kept():
    class Constant:
        def __call__(self, queries, prompts, labels, **kwargs) -> RewardOutput:
            return RewardOutput(torch.ones(len(queries)), torch.zeros(len(queries)))

    kept = Constant()
    assert resolve_reward(kept) is kept
    out = call(resolve_reward([kept, kept], weights=[1.0, 2.0]))
    assert out.rewards.tolist() == [3.0] * 4 and out.scores.tolist() == [0.0] * 4
    assert sorted(out.extra_logs) == ["Constant", "Constant_2"]


def test_trl_reward_file_and_grouped_calls_get_their_rows_columns(tmp_path):
    path = tmp_path / "trl_rm.py"
    path.write_text(textwrap.dedent("""
        from rlhfkit.rewards.loader import grouped

        @grouped
        def reward_func(completions, difficulty, **kwargs):
            assert len(set(difficulty)) == 1 and len(kwargs["prompts"]) == 2  # one group
            return [float(difficulty[0]) * (i + 1) for i in range(len(completions))]
    """))
    fn = resolve_reward(path)
    assert fn.contract == "trl" and fn.name == "trl_rm"
    assert call(fn).rewards.tolist() == [1.0, 2.0, 3.0, 6.0]
