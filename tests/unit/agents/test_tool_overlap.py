"""Tool latency overlapping generation (ToolExecutor(overlap=True), agents/tools/overlap.py): while
one episode waits on a slow tool, the others' turns are generated; the samples are those of the
turn-by-turn schedule. Measured with the executor's counters, never with a wall-clock bound."""

import sys
import time

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.agents.tools.overlap import OverlapClock, QuietStdout
from rlhfkit.rollout.base import SamplingParams
from tests.unit.agents.test_tools import P, call, multiply


def nap(x: int) -> int:
    """Answer slowly.

    Args:
        x: a number
    """
    time.sleep(0.5)
    print("NOISE")
    return x


def policy(ctx):
    """The "slow" episode naps once then answers; the "fast" one multiplies three times then answers."""
    done = ctx.count("</tool_response>")
    if "slow" in ctx.split("<|im_start|>user\n", 1)[-1][:8]:
        return "ok<|im_end|>" if done else call("nap", x=1) + "<|im_end|>"
    return "ok<|im_end|>" if done >= 3 else call("multiply", a=2, b=done) + "<|im_end|>"


def run(scripted, chat_tok, overlap):
    engine = scripted(chat_tok, policy)
    generate = engine.generate

    def slow_generate(*args, **kwargs):  # generation takes time, as a real engine's does
        time.sleep(0.02)
        return generate(*args, **kwargs)

    engine.generate = slow_generate
    ex = ToolExecutor([multiply, nap], overlap=overlap)
    trajs = ex.run(engine, chat_tok, [P("slow"), P("fast")], SamplingParams(max_new_tokens=80),
                   TokenBudget(80, 800, 5), seeds=[11, 12])
    return trajs, ex.pop_metrics(), engine


def test_a_slow_tool_overlaps_the_other_episodes_generation(chat_tok, scripted):
    trajs, m, engine = run(scripted, chat_tok, overlap=True)
    # the fast episode's turns 2, 3 and 4 are generated while the slow one's nap runs, alone
    assert m["tools/generate_during_tools"] == 3.0
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 1, 1, 1, 1]
    assert 0 < m["tools/overlap_s"] <= m["tools/busy_s"]
    assert m["tools/nap/calls"] == 1.0 and m["tools/multiply/calls"] == 3.0 and m["tools/calls"] == 4.0
    assert [t.info["tool_calls"] for t in trajs] == [1, 3]


def test_turn_by_turn_never_overlaps_and_samples_the_same_episodes(chat_tok, scripted):
    # the switch-off: the turn-by-turn schedule waits for the nap before anyone's next turn
    seq, m, engine = run(scripted, chat_tok, overlap=False)
    assert m["tools/generate_during_tools"] == 0.0 and m["tools/overlap_s"] == 0.0 and m["tools/busy_s"] > 0
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 2, 1, 1]
    over, _, _ = run(scripted, chat_tok, overlap=True)
    for a, b in zip(seq, over):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.loss_mask.tolist() == b.loss_mask.tolist()


def test_tools_printing_in_overlapping_episodes_leave_stdout_as_it_was(chat_tok, scripted):
    before = sys.stdout
    run(scripted, chat_tok, overlap=True)
    assert sys.stdout is before


def test_quiet_stdout_restores_after_out_of_order_exits():
    before, quiet = sys.stdout, QuietStdout()
    quiet.__enter__()
    quiet.__enter__()  # a second coroutine enters before the first leaves
    quiet.__exit__(None, None, None)
    assert sys.stdout is not before  # still captured: one is inside
    quiet.__exit__(None, None, None)
    assert sys.stdout is before


def test_overlap_clock_counts_tool_time_with_and_without_generation(monkeypatch):
    now = iter([1.0, 3.0, 4.0, 6.0])  # one reading per transition
    monkeypatch.setattr("rlhfkit.agents.tools.overlap.time.perf_counter", lambda: next(now))
    c = OverlapClock(since=0.0)
    c.enter("tool")  # t=1: a tool starts
    c.enter("generate")  # t=3: a generation starts while it runs (2 s of tool alone so far)
    c.leave("generate")  # t=4: 1 s of both
    c.leave("tool")  # t=6: 2 s of tool alone
    assert c.metrics() == {"tools/busy_s": 5.0, "tools/overlap_s": 1.0, "tools/generate_during_tools": 1.0}
