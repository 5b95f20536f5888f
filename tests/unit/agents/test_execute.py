"""OpenRLHF's mid-2025 contract (`AgentExecutor(AgentExecutorBase)` with `execute`): the fixture
file's override on a scripted engine (tokens, masks, logprobs, reward, batching, seeds by hand),
on the tiny model (tokens are the engine's, logprobs equal the trainer's forward, a sample does
not depend on its batch), the base class's default episode, the engine adapter and the errors."""

from pathlib import Path

import pytest
import torch

from rlhfkit.agents import (
    ExecuteRunner,
    MultiTurnExecutor,
    TokenBudget,
    VLLMSamplingParams,
    agent_rewards,
    load_agent_file,
)
from rlhfkit.agents.engine_adapter import EngineAdapter, EpisodeRecord
from rlhfkit.agents.envs.guess import AgentInstance as Guess
from rlhfkit.data.batch import collate
from rlhfkit.errors import RewardError
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "openrlhf_2025_agent.py"

HEADER = """
import torch
from rlhfkit.agents import AgentExecutorBase, AgentInstanceBase

class AgentInstance(AgentInstanceBase):
    async def step(self, states, **kwargs):
        return {"rewards": 1.0, "environment_feedback": "", "done": True}
"""

INIT = """
class AgentExecutor(AgentExecutorBase):
    def __init__(self, max_steps, max_length, llm_engine, hf_tokenizer, result_queue):
        super().__init__(AgentInstance, max_steps, max_length, llm_engine, hf_tokenizer, result_queue)
"""


class P:  # a prompt as the trainer's PromptItem
    def __init__(self, tok, text, label=None):
        self.text, self.label = text, label
        self.ids = tok(text, add_special_tokens=False)["input_ids"]


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def agent_file(tmp_path, body, init=INIT):
    path = tmp_path / "agent.py"
    path.write_text(HEADER + init + body)
    return load_agent_file(path)


# ------------------------------------------------------------------ the fixture file's override
def test_override_two_engine_calls_with_its_own_feedback_and_reward(tok, scripted):
    engine = scripted(tok, lambda ctx: "77" if ctx.endswith("again:\n") else "7x")
    runner = load_agent_file(FIXTURE)
    assert isinstance(runner, ExecuteRunner) and runner.provides_rewards
    prompts = [P(tok, "a:", "7"), P(tok, "b:", "8")]
    trajs = runner.run(engine, tok, prompts, SamplingParams(max_new_tokens=4, n=2), TokenBudget(4, 40, 2),
                       seeds=[1, 2])
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    a1, fb, a2 = ids(tok, "7x"), ids(tok, "\n1 sevens; again:\n"), ids(tok, "77")
    for t, p in zip(trajs, [prompts[0]] * 2 + [prompts[1]] * 2):
        assert t.prompt_ids.tolist() == p.ids
        assert t.response_ids.tolist() == a1 + fb + a2  # the engine's ids, never re-tokenized text
        assert t.loss_mask.tolist() == [True] * 2 + [False] * len(fb) + [True] * 2
        assert t.logprobs.tolist() == [-0.5] * 2 + [0.0] * len(fb) + [-0.5] * 2
        assert t.finish_reason == "stop" and t.version == 3 and t.info["turns"] == 2
    out = agent_rewards(trajs)
    assert out.rewards.tolist() == pytest.approx([(2 + 0.5 * 1) / 6] * 4)  # its own reward
    assert out.extra_logs["first_sevens"].tolist() == [1.0] * 4
    assert out.extra_logs["second_sevens"].tolist() == [2.0] * 4
    # each of the two rounds was ONE batched engine call for the 4 episodes, each with its own seed
    assert [len(c[0]) for c in engine.calls] == [4, 4] and engine.calls[0][1].n == 1
    assert engine.calls[1][0][0] == prompts[0].ids + a1 + fb
    seeds = engine.seeds[0] + engine.seeds[1]
    assert len(set(seeds)) == 8
    # a sample's seeds depend on its prompt's seed only: prompt "b" alone with seed 2 gets the same
    alone = scripted(tok, lambda ctx: "77" if ctx.endswith("again:\n") else "7x")
    load_agent_file(FIXTURE).run(alone, tok, [prompts[1]], SamplingParams(max_new_tokens=4, n=2),
                                 TokenBudget(4, 40, 2), seeds=[2])
    assert alone.seeds == [engine.seeds[0][2:], engine.seeds[1][2:]]


def test_response_is_cut_at_the_budget_and_flagged(tok, scripted):
    engine = scripted(tok, lambda ctx: "7777")
    [t] = load_agent_file(FIXTURE).run(engine, tok, [P(tok, "a:")], SamplingParams(max_new_tokens=4),
                                       TokenBudget(per_turn=4, total=10, max_turns=2), seeds=[0])
    # 4 action tokens + "\n4 sevens; again:\n" (18) = 22 > 10: the second call had no room (max_length)
    assert t.response_ids.tolist() == ids(tok, "7777\n4 sev") and t.finish_reason == "length"
    assert t.loss_mask.tolist() == [True] * 4 + [False] * 6 and t.info["turns"] == 1
    assert len(engine.calls) == 1


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


class Spy:
    """An HFEngine that records what it was asked and what it returned."""

    def __init__(self, engine):
        self.engine, self.outputs = engine, []

    @property
    def version(self):
        return self.engine.version

    def generate(self, prompts, params, generator=None, group_ids=None, seeds=None):
        out = self.engine.generate(prompts, params, seeds=seeds)
        self.outputs += [(list(p), t.response_ids.tolist(), t.logprobs) for p, t in zip(prompts, out)]
        return out


def test_on_the_tiny_model_tokens_are_the_engines_and_logprobs_the_trainers(tiny):
    model, tk = tiny
    spy = Spy(HFEngine(model, tk))
    prompts = [P(tk, "x1y2:"), P(tk, "abc:"), P(tk, "7+7=")]
    params = SamplingParams(max_new_tokens=6, n=2, temperature=1.0)
    trajs = load_agent_file(FIXTURE).run(spy, tk, prompts, params, TokenBudget(6, 40, 2), seeds=[5, 6, 7])
    assert len(trajs) == 6 and len(spy.outputs) == 12
    for t in trajs:
        full = t.prompt_ids.tolist() + t.response_ids.tolist()
        m = t.loss_mask
        # every action is exactly an engine output, after exactly the context it was generated from
        starts = [i for i in range(len(m)) if m[i] and (i == 0 or not m[i - 1])]
        for s in starts:
            ctx = full[: t.prompt_ids.numel() + s]
            same = [(out, lp) for c, out, lp in spy.outputs
                    if c == ctx and t.response_ids[s : s + len(out)].tolist() == out]
            assert same  # (the n samples of a prompt share their first context)
            out, lp = same[0]
            assert m[s : s + len(out)].all() and torch.equal(t.logprobs[s : s + len(out)], lp)
        assert (t.logprobs[~m] == 0).all()
    batch = collate(trajs, pad_id=tk.pad_token_id)
    logp, _ = response_logprobs(model, batch, temperature=1.0)
    width = batch.response_ids.shape[1]
    rollout = torch.stack([torch.nn.functional.pad(t.logprobs, (0, width - t.response_length)) for t in trajs])
    torch.testing.assert_close(rollout[batch.loss_mask], logp[batch.loss_mask], atol=1e-4, rtol=0)
    # a prompt's samples do not depend on the other prompts of the batch
    again = load_agent_file(FIXTURE).run(HFEngine(model, tk), tk, [prompts[2]], params, TokenBudget(6, 40, 2),
                                         seeds=[7])
    for x, y in zip(again, trajs[4:]):
        assert torch.equal(x.response_ids, y.response_ids) and torch.equal(x.loss_mask, y.loss_mask)
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-6, rtol=1e-6)
        assert x.info == y.info


# ------------------------------------------------------------------ the base class's default episode
def test_default_execute_runs_the_episode_as_the_multi_turn_executor_does(tmp_path, tok, scripted):
    path = tmp_path / "guess_2025.py"
    path.write_text("from rlhfkit.agents import AgentExecutorBase\n"
                    "from rlhfkit.agents.envs.guess import AgentInstance\n" + INIT)

    def policy(ctx):
        return "7" if ctx.endswith("higher\n") else "3"

    prompts = [P(tok, "g:", "7"), P(tok, "h:", "3")]
    params, budget = SamplingParams(max_new_tokens=4, n=2), TokenBudget(per_turn=4, total=40, max_turns=4)
    old = MultiTurnExecutor(Guess).run(scripted(tok, policy), tok, prompts, params, budget, seeds=[1, 2])
    new = load_agent_file(path).run(scripted(tok, policy), tok, prompts, params, budget, seeds=[1, 2])
    # "g:" -> "3" "\nhigher\n" "7" "\ncorrect\n" (reward 0.8); "h:" -> "3" "\ncorrect\n" (reward 1)
    assert new[0].response_ids.tolist() == ids(tok, "3\nhigher\n7\ncorrect\n")
    for a, b in zip(old, new):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()
        assert a.logprobs.tolist() == b.logprobs.tolist() and a.finish_reason == b.finish_reason
        assert a.info == b.info and a.group_id == b.group_id
    assert [t.info["agent_reward"] for t in new] == pytest.approx([0.8, 0.8, 1.0, 1.0])
    # out of steps before done: truncated, as the multi-turn executor says
    [t] = load_agent_file(path).run(scripted(tok, lambda ctx: "1"), tok, [P(tok, "g:", "7")],
                                    SamplingParams(max_new_tokens=3), TokenBudget(3, 100, 2), seeds=[0])
    assert t.info["turns"] == 2 and t.truncated


RAY_STYLE = """
    async def execute(self, prompt, label, sampling_params):
        # written as for OpenRLHF's Ray actors: instance.method.remote(...)
        env = self.agent_instance_cls.remote()
        obs = (await env.reset.remote({"observation": prompt, "label": label}))["observation"]
        tokens = self.hf_tokenizer(obs, add_special_tokens=False)["input_ids"]
        sampling_params.max_tokens = self.max_length - len(tokens)
        out = await self.generate(tokens, sampling_params)
        action = list(out.outputs[0].token_ids)
        step = await env.step.remote({"action_text": out.outputs[0].text})
        await self.result_queue.put({"observation_tokens": tokens + action, "reward": step["rewards"],
                                     "action_ranges": [(len(tokens), len(tokens) + len(action))],
                                     "extra_logs": {"room": self.max_length - len(tokens),
                                                    "steps": self.max_steps}})
"""


def test_ray_style_instance_calls_and_the_episodes_max_length(tmp_path, tok, scripted):
    runner = agent_file(tmp_path, RAY_STYLE)
    prompts = [P(tok, "ab:"), P(tok, "abcdef:")]
    trajs = runner.run(scripted(tok, lambda ctx: "zz"), tok, prompts, SamplingParams(max_new_tokens=5),
                       TokenBudget(5, 12, 3), seeds=[0, 1])
    assert [t.info["extra_logs"]["room"] for t in trajs] == [12.0, 12.0]  # prompt + the response budget
    assert [t.info["extra_logs"]["steps"] for t in trajs] == [3.0, 3.0]
    assert [t.info["agent_reward"] for t in trajs] == [1.0, 1.0]
    assert trajs[1].response_ids.tolist() == ids(tok, "zz")


# ------------------------------------------------------------------ the engine adapter
def _call(adapter, prompt, sp, per_turn=4, max_length=100):
    import asyncio

    async def go():
        adapter.episode.set(EpisodeRecord(0, 1, max_length))
        return await adapter.generate(prompt, sp)

    return asyncio.run(go())


def test_adapter_caps_tokens_cuts_at_stop_strings_and_reads_any_prompt_form(tok, scripted):
    engine = scripted(tok, lambda ctx: "ab</t>cd")
    adapter = EngineAdapter(tok, per_turn=20, source="f.py")
    adapter.engine = engine
    sp = VLLMSamplingParams(max_tokens=50, stop=["</t>"], logprobs=1)
    out = _call(adapter, {"prompt_token_ids": ids(tok, "q")}, sp).outputs[0]
    assert out.token_ids == ids(tok, "ab</t>") and out.text == "ab" and out.finish_reason == "stop"
    assert out.stop_reason == "</t>" and [list(d) for d in out.logprobs] == [[t] for t in out.token_ids]
    assert engine.calls[-1][1].max_new_tokens == 20  # per_turn caps max_tokens
    sp = VLLMSamplingParams(max_tokens=3, stop="</t>", include_stop_str_in_output=True)
    out = _call(adapter, ids(tok, "q"), sp, max_length=3).outputs[0]  # room: 3 - 1 prompt token
    assert out.token_ids == ids(tok, "ab") and out.finish_reason == "length" and out.logprobs is None
    sp = VLLMSamplingParams(max_tokens=10, stop="</t>", include_stop_str_in_output=True)
    assert _call(adapter, "q", sp).outputs[0].text == "ab</t>"
    assert engine.calls[-1][0] == [tok("q")["input_ids"]]  # a string prompt is encoded as vLLM does
    none_left = _call(adapter, ids(tok, "qq"), VLLMSamplingParams(max_tokens=5), max_length=2)
    assert none_left.outputs[0].token_ids == [] and len(engine.calls) == 3  # no room: no engine call
    with pytest.raises(RewardError, match="min_tokens=2 is not supported"):
        _call(adapter, ids(tok, "q"), VLLMSamplingParams(min_tokens=2))


# ------------------------------------------------------------------ errors, in one line
RETOKENIZED = """
    async def execute(self, prompt, label, sampling_params):
        tokens = self.hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = await self.generate(tokens, sampling_params)
        action = self.hf_tokenizer(out.outputs[0].text.upper(), add_special_tokens=False)["input_ids"]
        await self.result_queue.put({"observation_tokens": tokens + action, "reward": 1.0,
                                     "action_ranges": [(len(tokens), len(tokens) + len(action))]})
"""
TWICE = """
    async def execute(self, prompt, label, sampling_params):
        tokens = self.hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = await self.generate(tokens, sampling_params)
        r = {"observation_tokens": tokens + list(out.outputs[0].token_ids), "reward": 1.0,
             "action_ranges": [(len(tokens), len(tokens) + 1)]}
        await self.result_queue.put(r)
        await self.result_queue.put(r)
"""
RETURNS = TWICE.replace("        await self.result_queue.put(r)\n        await self.result_queue.put(r)\n",
                        "        return r\n")
NOTHING = "\n    async def execute(self, prompt, label, sampling_params):\n        return None\n"
RAISES = "\n    async def execute(self, prompt, label, sampling_params):\n        raise KeyError('tool')\n"
NO_ACTION = """
    async def execute(self, prompt, label, sampling_params):
        await self.result_queue.put({"observation_tokens": [1, 2], "reward": 0.0, "action_ranges": []})
"""
OUT_OF_ORDER = NO_ACTION.replace('"action_ranges": []', '"action_ranges": [(1, 2), (0, 1)]')
NAN = RETURNS.replace('"reward": 1.0', '"reward": float("nan")')


@pytest.mark.parametrize("body,needle", [
    (RETOKENIZED, r"action range \(\d+, \d+\) holds tokens the engine did not generate"),
    (TWICE, "put 2 results on result_queue for one call"),
    (NOTHING, "put no result on result_queue and returned NoneType"),
    (RAISES, "execute\\(\\) raised KeyError: 'tool'"),
    (NO_ACTION, "has no action tokens"),
    (OUT_OF_ORDER, "are not in order"),
    (NAN, "execute\\(\\) result has reward=nan"),
])
def test_bad_execute_results_are_one_line_errors_naming_the_file(tmp_path, tok, scripted, body, needle):
    runner = agent_file(tmp_path, body)
    with pytest.raises(RewardError, match=needle) as e:
        runner.run(scripted(tok, lambda ctx: "ab"), tok, [P(tok, "q:")], SamplingParams(max_new_tokens=3),
                   seeds=[0])
    assert str(tmp_path / "agent.py") in str(e.value) and "\n" not in str(e.value)


def test_a_returned_result_dict_is_taken(tmp_path, tok, scripted):
    [t] = agent_file(tmp_path, RETURNS).run(scripted(tok, lambda ctx: "ab"), tok, [P(tok, "q:")],
                                            SamplingParams(max_new_tokens=3), seeds=[0])
    assert t.response_ids.tolist() == ids(tok, "ab") and t.loss_mask.tolist() == [True, False]


def test_engine_failures_reach_the_trainer_unchanged(tok):
    class Broken:
        version = 0

        def generate(self, *args, **kwargs):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    with pytest.raises(RuntimeError, match="inf"):
        load_agent_file(FIXTURE).run(Broken(), tok, [P(tok, "q:"), P(tok, "r:")], SamplingParams(max_new_tokens=2),
                                     seeds=[0, 1])


def test_executor_init_signatures_are_checked_at_load(tmp_path):
    path = tmp_path / "agent.py"
    path.write_text(HEADER + "\nclass AgentExecutor(AgentExecutorBase):\n    def __init__(self, llm_engine):\n"
                    "        pass\n")
    with pytest.raises(RewardError, match=r"cannot be built as AgentExecutor\(max_steps, max_length, llm_engine"):
        load_agent_file(path)
    path.write_text(HEADER + "\nclass AgentExecutor:\n    pass\n")
    with pytest.raises(RewardError, match="must subclass rlhfkit.agents.MultiTurnAgentExecutor or "
                                          "rlhfkit.agents.AgentExecutorBase"):
        load_agent_file(path)


# ------------------------------------------------------------------ OpenRLHF 2026: an execute override
OVERRIDE_2026 = """
from copy import deepcopy
from rlhfkit.agents import AgentExecutorBase, MultiTurnAgentExecutor
from rlhfkit.agents.envs.guess import AgentInstance


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(AgentInstance)

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        result = await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
        result["reward"] = 2 * result["reward"]
        result["extra_logs"] = {"room": max_length}
        return result


class Direct(AgentExecutorBase):  # 2026's abstract base: no-argument __init__, execute returns the result
    def __init__(self):
        pass

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = await llm_engine.generate(ids, deepcopy(sampling_params))
        action = list(out.outputs[0].token_ids)
        return {"observation_tokens": ids + action, "action_ranges": [(len(ids), len(ids) + len(action))],
                "reward": float(len(action))}
"""


def test_2026_execute_overrides_are_called_not_ignored(tmp_path, tok, scripted):
    path = tmp_path / "agent_2026.py"
    path.write_text(OVERRIDE_2026)

    def policy(ctx):
        return "7" if ctx.endswith("higher\n") else "3"

    prompts, params, budget = [P(tok, "g:", "7")], SamplingParams(max_new_tokens=4, n=2), TokenBudget(4, 40, 4)
    runner = load_agent_file(path)
    assert isinstance(runner, ExecuteRunner) and runner.instance is not None
    new = runner.run(scripted(tok, policy), tok, prompts, params, budget, seeds=[3])
    old = MultiTurnExecutor(Guess).run(scripted(tok, policy), tok, prompts, params, budget, seeds=[3])
    for a, b in zip(old, new):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()
        assert b.info["agent_reward"] == pytest.approx(2 * a.info["agent_reward"]) == pytest.approx(1.6)
        assert b.info["extra_logs"] == {"room": float(len(prompts[0].ids) + 40)}
    path.write_text(OVERRIDE_2026 + "\nAgentExecutor = Direct\n")
    [t] = load_agent_file(path).run(scripted(tok, lambda ctx: "abc"), tok, prompts, SamplingParams(max_new_tokens=2),
                                    seeds=[0])
    assert t.response_ids.tolist() == ids(tok, "ab") and t.info["agent_reward"] == 2.0 and t.loss_mask.all()
