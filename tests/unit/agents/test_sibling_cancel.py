"""When one of the concurrent tasks of a rollout fails past its own handling (a tool call, an episode's turn, an
endpoint episode), its siblings are cancelled and have finished before the error reaches the caller, which then
closes environments and sessions: none of them still runs a tool process or holds a session. `Abort` is a
BaseException, which the tool runner does not turn into a message the model reads."""

import asyncio
import json

from rlhfkit.agents.endpoint import EndpointExecutor, EndpointLimits, EndpointServer, Settings
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools import ToolCall, ToolSet
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.agents.tools.run import ToolLimits, ToolRunner
from rlhfkit.rollout.base import SamplingParams


class Abort(BaseException):
    pass


class Slow:
    """An async tool `slow` that waits for a long time, and one `boom` that raises Abort once `slow` runs."""

    def __init__(self):
        self.started, self.cancelled = asyncio.Event(), False

    def tools(self):
        async def slow() -> str:
            """Wait."""
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return "late"

        async def boom() -> str:
            """Fail."""
            await self.started.wait()
            raise Abort("the tool's process died")

        return [slow, boom]


def raises_abort_after_cancelling(coro, probe: Slow) -> None:
    """Runs `coro`, which must raise Abort; `probe`'s slow call must have seen its cancellation by then."""

    async def main():
        try:
            await coro
        except Abort:
            return probe.cancelled
        raise AssertionError("Abort was not raised")

    assert asyncio.run(main()) is True


def test_one_tool_call_failing_cancels_the_other_call_of_its_turn():
    probe = Slow()
    runner = ToolRunner(ToolSet(probe.tools()), ToolLimits(calls_per_episode=4, seconds_per_call=60))
    raises_abort_after_cancelling(runner.run([ToolCall("slow", {}, "a"), ToolCall("boom", {}, "b")], []), probe)


class P:
    def __init__(self, text):
        self.text, self.raw, self.label, self.ids = text, text, None, []


def test_one_episodes_tool_call_failing_cancels_the_other_episodes_call(chat_tok, scripted):
    """Two episodes of one turn, one call each: the turn's gather over the episodes cancels the other."""
    probe = Slow()

    def policy(ctx):
        name = "boom" if "fail" in ctx else "slow"
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": {}})}\n</tool_call><|im_end|>'

    ex = ToolExecutor(probe.tools(), limits=ToolLimits(seconds_per_call=60))
    run = ex._run(scripted(chat_tok, policy), chat_tok, [P("wait"), P("fail")], SamplingParams(max_new_tokens=80),
                  TokenBudget(80, 400, 2), None, None)
    raises_abort_after_cancelling(run, probe)


def test_one_endpoint_episode_failing_cancels_and_closes_the_others(chat_tok):
    probe = Slow()
    slow, boom = probe.tools()

    async def agent(client, prompt, label, **row):
        return await (boom() if prompt == "fail" else slow())

    ex = EndpointExecutor(agent, make_client=lambda url, key, _timeout: object())
    with EndpointServer(chat_tok, Settings(SamplingParams(max_new_tokens=4))) as server:
        episodes = [server.open_episode(i, i, EndpointLimits(per_call=4, total=8)) for i in range(2)]
        raises_abort_after_cancelling(ex._all(server, [P("wait"), P("fail")], episodes), probe)
        assert not any(e.open for e in episodes)  # both sessions ended
