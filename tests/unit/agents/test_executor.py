"""Executors on a scripted engine: token-in token-out, masks, budgets, truncation, the OpenRLHF file."""

from pathlib import Path

import pytest
import torch

from rlhfkit.agents import (
    AgentInstanceBase,
    MultiTurnExecutor,
    SingleTurnExecutor,
    TokenBudget,
    agent_rewards,
    drift_count,
    load_agent_file,
)
from rlhfkit.agents.envs.guess import AgentInstance as Guess
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import RewardError
from rlhfkit.rollout.base import SamplingParams

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "openrlhf_style_agent.py"


class P:  # a prompt as the trainer's PromptItem
    def __init__(self, tok, text, label):
        self.text, self.label = text, label
        self.ids = tok(text, add_special_tokens=False)["input_ids"]


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_guess_episode_appends_feedback_tokens_masked_out(tok, scripted):
    engine = scripted(tok, lambda ctx: "7" if ctx.endswith("higher\n") else "3")
    prompt = P(tok, "g:", "7")
    [t] = MultiTurnExecutor(Guess).run(engine, tok, [prompt], SamplingParams(max_new_tokens=4, n=1),
                                       TokenBudget(per_turn=4, total=40, max_turns=4))
    # turn 1: "3" -> "\nhigher\n"; turn 2: "7" -> "\ncorrect\n" and done
    assert t.response_ids.tolist() == ids(tok, "3\nhigher\n7\ncorrect\n")
    assert t.loss_mask.tolist() == [True] + [False] * 8 + [True] + [False] * 9
    assert t.logprobs.tolist() == [-0.5] + [0.0] * 8 + [-0.5] + [0.0] * 9
    assert t.prompt_ids.tolist() == prompt.ids and t.finish_reason == "stop" and t.version == 3
    assert t.info["agent_reward"] == pytest.approx(0.8) and t.info["agent_score"] == 1.0 and t.info["turns"] == 2
    # the second turn was generated from the exact token context (never re-tokenized text)
    assert engine.calls[1][0] == [prompt.ids + ids(tok, "3\nhigher\n")]


def test_per_turn_and_total_budgets_cut_and_flag_truncation(tok, scripted):
    engine = scripted(tok, lambda ctx: "12345")
    [t] = MultiTurnExecutor(Guess).run(engine, tok, [P(tok, "g:", "7")], SamplingParams(max_new_tokens=9),
                                       TokenBudget(per_turn=2, total=5, max_turns=4))
    # action cut to 2 tokens ("12"), feedback "\nlower\n" cut to the 3 tokens left
    assert engine.calls[0][1].max_new_tokens == 2
    assert t.response_ids.tolist() == ids(tok, "12\nlo")
    assert t.loss_mask.tolist() == [True, True, False, False, False]
    assert t.truncated and t.info["turns"] == 1


def test_out_of_turns_is_truncated(tok, scripted):
    engine = scripted(tok, lambda ctx: "1")
    [t] = MultiTurnExecutor(Guess).run(engine, tok, [P(tok, "g:", "7")], SamplingParams(max_new_tokens=3),
                                       TokenBudget(per_turn=3, total=100, max_turns=2))
    assert t.info["turns"] == 2 and t.truncated and t.info["agent_reward"] == 0.0


def test_openrlhf_style_file_runs_after_changing_only_imports(tok, scripted):
    executor = load_agent_file(FIXTURE)
    assert type(executor).__name__ == "AgentExecutor" and executor.provides_rewards
    engine = scripted(tok, lambda ctx: "7" if ctx.startswith("a") else "x")
    prompts = [P(tok, "a:", None), P(tok, "b:", None)]
    trajs = executor.run(engine, tok, prompts, SamplingParams(max_new_tokens=3, n=2), TokenBudget(3, 30, 4))
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    out = agent_rewards(trajs)
    assert out.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.extra_logs["tries"].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert out.extra_logs["turns"].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert trajs[2].response_ids.tolist() == ids(tok, "x\nno, again:\nx")
    assert trajs[2].loss_mask.tolist() == [True] + [False] * 12 + [True]
    # the first turn was one batched engine call for all 4 episodes
    assert len(engine.calls[0][0]) == 4 and engine.calls[0][1].n == 1


class _Shorter(AgentInstanceBase):
    async def step(self, states, **kwargs):
        return {"rewards": 0.0, "environment_feedback": ":", "done": False, "sampling_params": {"max_tokens": 1}}


def test_step_can_change_sampling_params(tok, scripted):
    engine = scripted(tok, lambda ctx: "abc")
    MultiTurnExecutor(_Shorter).run(engine, tok, [P(tok, "q", None)], SamplingParams(max_new_tokens=3),
                                    TokenBudget(3, 50, 3))
    assert [c[1].max_new_tokens for c in engine.calls] == [3, 1, 1]


class _Broken(AgentInstanceBase):
    async def step(self, states, **kwargs):
        return {"rewards": float("nan"), "environment_feedback": "", "done": True}


class _NoDone(AgentInstanceBase):
    async def step(self, states, **kwargs):
        return {"rewards": 1.0, "environment_feedback": ""}


@pytest.mark.parametrize("cls,needle", [(_Broken, "rewards=nan"), (_NoDone, "lacks 'done'")])
def test_bad_step_results_are_clear_errors(tok, scripted, cls, needle):
    engine = scripted(tok, lambda ctx: "a")
    with pytest.raises(RewardError, match=needle) as e:
        MultiTurnExecutor(cls).run(engine, tok, [P(tok, "q", None)], SamplingParams(max_new_tokens=2))
    assert cls.__qualname__ in str(e.value)


def test_agent_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "agent.py"
    bad.write_text("x = 1\n")
    with pytest.raises(RewardError, match=f"agent file {bad} defines no AgentInstance"):
        load_agent_file(bad)
    with pytest.raises(RewardError, match="does not exist"):
        load_agent_file(tmp_path / "missing.py")


def test_drift_count_finds_text_that_would_retokenize_differently(tok):
    def traj(resp):
        r = torch.tensor(resp)
        return Trajectory(torch.tensor(ids(tok, "q")), r, torch.ones(len(resp), dtype=torch.bool),
                          torch.zeros(len(resp)), "stop", 0)

    fine = traj(ids(tok, "ab") + [tok.eos_token_id])
    spelled = traj(ids(tok, "<") + ids(tok, "eos") + ids(tok, ">"))  # re-encodes as the single EOS id
    assert drift_count([fine], tok) == 0 and drift_count([fine, spelled, spelled], tok) == 2


def test_single_turn_executor_gives_the_engines_trajectories():
    from rlhfkit.models import tiny_model_and_tokenizer
    from rlhfkit.rollout.hf import HFEngine

    model, tk = tiny_model_and_tokenizer(seed=0)
    engine = HFEngine(model, tk)
    prompts = [P(tk, "x1y2:", None), P(tk, "abc:", None)]
    params = SamplingParams(max_new_tokens=6, n=3)
    direct = engine.generate([p.ids for p in prompts], params, generator=torch.Generator().manual_seed(5))
    via = SingleTurnExecutor().run(engine, tk, prompts, params, generator=torch.Generator().manual_seed(5))
    assert len(via) == len(direct) == 6
    for a, b in zip(direct, via):
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
        assert torch.equal(a.loss_mask, b.loss_mask) and a.group_id == b.group_id
        assert a.finish_reason == b.finish_reason


class _Fragile(AgentInstanceBase):
    """Rewards 0.5 per action, and raises on the action "9" (the one a hostile policy finds)."""

    async def step(self, states, **kwargs):
        if states["action_text"].strip() == "9":
            raise ValueError("no such move")
        return {"rewards": 0.5, "environment_feedback": "\nagain\n", "done": False}


def test_an_action_that_breaks_the_environment_ends_its_episode_with_reward_0(tok, scripted, caplog):
    """A step() that raises ends that episode (reward 0, what it earned before included; truncated),
    counted and logged once; the other episodes go on. When every episode breaks, the run stops."""
    engine = scripted(tok, lambda ctx: "9" if ctx.startswith("bad") and ctx.count("again") == 1 else "1")
    executor = MultiTurnExecutor(_Fragile)
    prompts = [P(tok, "bad:", None), P(tok, "good:", None), P(tok, "bad2:", None)]
    with caplog.at_level("WARNING", logger="rlhfkit"):
        bad, good, bad2 = executor.run(engine, tok, prompts, SamplingParams(max_new_tokens=2),
                                       TokenBudget(per_turn=2, total=40, max_turns=3))
    assert good.info["agent_reward"] == pytest.approx(1.5) and good.info["turns"] == 3
    for t in (bad, bad2):  # "1" (0.5), then "9": the episode ends there with nothing
        assert t.info["agent_reward"] == 0.0 and t.info["agent_score"] == 0.0 and t.truncated
        assert t.info["turns"] == 2 and t.response_ids.tolist() == ids(tok, "1\nagain\n9")
    assert executor.pop_metrics() == {"agent/env_errors": 2.0} and executor.pop_metrics() == {}
    assert [r.getMessage().count("step() raised ValueError: no such move") for r in caplog.records] == [1]
    engine = scripted(tok, lambda ctx: "9")
    with pytest.raises(RewardError, match=r"failed in all 2 episodes of the batch, so nothing would train; the "
                                          r"first: agent .*_Fragile: step\(\) raised ValueError: no such move"):
        executor.run(engine, tok, prompts[:2], SamplingParams(max_new_tokens=2))
