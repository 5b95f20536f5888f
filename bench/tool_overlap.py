"""Wall time of tool-calling episodes, turn by turn vs overlapping (ToolExecutor(overlap=True), what
--train.async_enable runs): half of the episodes call a slow tool once, the other half call a fast
tool three times in a row. The engine is scripted (each call sleeps --generate_s, a stand-in for a
batched decode of that length), so the numbers measure the schedule, not a model.

    PYTHONPATH=. .venv/bin/python bench/tool_overlap.py [--episodes 8 --tool_s 0.5 --generate_s 0.1]
"""

from __future__ import annotations

import argparse
import json
import time

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.rollout.base import SamplingParams
from tests.unit.agents.conftest import (  # the tests' scripted engine
    ScriptedEngine,
    char_tokenizer,
)


class Prompt:
    def __init__(self, text):
        self.text, self.raw, self.label, self.ids = text, text, None, []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--tool_s", type=float, default=0.5)
    ap.add_argument("--generate_s", type=float, default=0.1)
    args = ap.parse_args()

    def slow(x: int) -> int:
        """Answer slowly.

        Args:
            x: a number
        """
        time.sleep(args.tool_s)
        return x

    def fast(x: int) -> int:
        """Answer at once.

        Args:
            x: a number
        """
        return x

    def policy(ctx: str) -> str:
        done = ctx.count("</tool_response>")
        name, turns = ("slow", 1) if "slow" in ctx.split("<|im_start|>user\n", 1)[-1][:8] else ("fast", 3)
        if done >= turns:
            return "ok<|im_end|>"
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"x": done}})}\n</tool_call><|im_end|>'

    tok = char_tokenizer()
    prompts = [Prompt("slow" if i % 2 else "fast") for i in range(args.episodes)]
    for overlap in (False, True):
        engine = ScriptedEngine(tok, policy)
        scripted = engine.generate

        def generate(*a, _scripted=scripted, **k):
            time.sleep(args.generate_s)
            return _scripted(*a, **k)

        engine.generate = generate
        ex = ToolExecutor([slow, fast], overlap=overlap)
        t0 = time.perf_counter()
        ex.run(engine, tok, prompts, SamplingParams(max_new_tokens=80), TokenBudget(80, 800, 5),
               seeds=list(range(len(prompts))))
        wall, m = time.perf_counter() - t0, ex.pop_metrics()
        print(f"overlap={overlap!s:5} wall {wall:.2f}s  engine calls {len(engine.calls)}  "
              f"tools/busy_s {m['tools/busy_s']:.2f}  tools/overlap_s {m['tools/overlap_s']:.2f}  "
              f"tools/generate_during_tools {m['tools/generate_during_tools']:.0f}")


if __name__ == "__main__":
    main()
