"""Every text environment a rollout made is closed however the rollout ends: a later episode's reset() raising,
the engine failing, the rollout cancelled (in both schedules); a close() raising then is logged and the error
that stopped the rollout is the one raised. A fake SkyRL-style class counts its close() calls."""

import asyncio
import logging

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import skyrl_class_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.errors import RewardError
from rlhfkit.rollout.base import SamplingParams


class Counted:
    """A BaseTextEnv look-alike: init fails for the row {"bad": True}, close fails for {"close_fails": True},
    step waits forever for {"hang": True}; `closed` lists each closed environment's row id."""

    closed: list[int] = []
    stepping = 0

    def __init__(self, env_config=None, extras={}):
        self.row = extras

    def init(self, prompt):
        if self.row.get("bad"):
            raise ValueError("no such board")
        return prompt, {}

    async def step(self, action):
        if self.row.get("hang"):
            Counted.stepping += 1
            await asyncio.Event().wait()
        return {"observations": [{"role": "user", "content": "again"}], "reward": 0.0, "done": False}

    def close(self):
        Counted.closed.append(self.row["id"])
        if self.row.get("close_fails"):
            raise OSError("session already gone")


class P:
    def __init__(self, record):
        self.text, self.raw, self.label, self.ids, self.record = "Play.", "Play.", None, [], record


class Broken:
    version = 0

    def generate(self, *args, **kwargs):
        raise RuntimeError("CUDA error: device lost")


@pytest.fixture(autouse=True)
def fresh():
    Counted.closed, Counted.stepping = [], 0


def executor(overlap=False):
    return ToolExecutor(environment_factory=skyrl_class_env(Counted, "counted"), overlap=overlap)


def args(engine, tok, rows, turns=3):
    return engine, tok, [P(r) for r in rows], SamplingParams(max_new_tokens=8), TokenBudget(8, 200, turns)


def test_a_later_reset_raising_closes_the_environments_made_before_it_and_its_own(chat_tok, scripted, caplog):
    rows = [{"id": 0}, {"id": 1, "close_fails": True}, {"id": 2, "bad": True}, {"id": 3}]
    with caplog.at_level(logging.WARNING, logger="rlhfkit"), pytest.raises(
            RewardError, match=r"environment counted: init\(\) raised ValueError: no such board"):
        executor().run(*args(scripted(chat_tok, lambda ctx: "hi<|im_end|>"), chat_tok, rows))
    assert Counted.closed == [0, 1, 2]  # the 4th was never made
    assert "after the rollout stopped: environment counted: close() raised OSError: session already gone" in caplog.text


@pytest.mark.parametrize("overlap", [False, True])
def test_an_engine_failure_closes_every_environment_and_is_the_error_raised(chat_tok, overlap):
    rows = [{"id": 0}, {"id": 1, "close_fails": True}, {"id": 2}]
    with pytest.raises(RuntimeError, match="CUDA error: device lost"):
        executor(overlap).run(*args(Broken(), chat_tok, rows))
    assert sorted(Counted.closed) == [0, 1, 2]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_cancelled_rollout_closes_every_environment(chat_tok, scripted, overlap):
    engine = scripted(chat_tok, lambda ctx: "hi<|im_end|>")
    rows = [{"id": 0, "hang": True}, {"id": 1, "hang": True}]

    async def main():
        task = asyncio.ensure_future(executor(overlap)._run(*args(engine, chat_tok, rows), None, None))
        while Counted.stepping < 2:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(Counted.closed) == [0, 1]


def test_a_finished_rollout_closes_each_environment_once(chat_tok, scripted):
    executor().run(*args(scripted(chat_tok, lambda ctx: "hi<|im_end|>"), chat_tok, [{"id": 0}, {"id": 1}], turns=2))
    assert Counted.closed == [0, 1]
