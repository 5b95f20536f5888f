"""Async rollouts log each batch's own executor counters: the batch drawn ahead runs on the
background thread while the step that trains on the current one logs its metrics. Tools given as
Python objects on Ray are refused with the flags that load them in the trainer actor."""

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from rlhfkit.distributed.async_loop import Prefetch, merge_counters  # noqa: E402 - after ray is found
from rlhfkit.rollout.base import SamplingParams  # noqa: E402 - likewise
from rlhfkit.trainers.rl.stream import PromptBatch  # noqa: E402 - likewise


class CountingExecutor:
    """One tool call per prompt; `pop_metrics` as ToolExecutor's (counters since the last call)."""

    def __init__(self):
        self.calls = 0

    def run(self, engine, tokenizer, prompts, params, budget=None, generator=None, seeds=None):
        self.calls += len(prompts)
        return [SimpleNamespace(version=engine.version, group_id=i) for i in range(len(prompts))]

    def pop_metrics(self):
        calls, self.calls = self.calls, 0
        return {"tools/calls": float(calls)}


def test_the_batch_ahead_does_not_leak_into_the_current_steps_counters():
    p = Prefetch(CountingExecutor(), SimpleNamespace(version=0), None, SamplingParams(), None, max_staleness=1)
    now, ahead = PromptBatch([object()] * 2, [1, 2]), PromptBatch([object()] * 3, [3, 4, 5])
    p.generate(now, upcoming=lambda: ahead)
    p.ahead[1].result()  # the batch ahead has run (and counted its 3 calls) before the step logs
    assert p.pop_metrics() == {"stale_dropped": 0.0, "tools/calls": 2.0}
    p.generate(ahead)
    assert p.pop_metrics() == {"stale_dropped": 0.0, "tools/calls": 3.0}
    p.thread.shutdown()


def test_merge_counters_sums_counts_and_averages_rates_and_means():
    runs = [{"tools/calls": 2.0, "tools/valid_call_rate": 1.0, "tools/f/mean_latency_s": 0.25},
            {"tools/calls": 3.0, "tools/valid_call_rate": 0.5, "tools/f/mean_latency_s": 0.75, "tools/busy_s": 1.5}]
    assert merge_counters(runs) == {"tools/calls": 5.0, "tools/valid_call_rate": 0.75,
                                    "tools/f/mean_latency_s": 0.5, "tools/busy_s": 1.5}
    assert merge_counters([]) == {}
