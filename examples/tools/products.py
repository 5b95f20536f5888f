"""Products of 3-digit numbers with a calculator tool: data, reward and a held-out check.

    python examples/tools/products.py data runs/products          # train.jsonl, heldout.jsonl
    rlhfkit train rl ... --agent.tools builtin:calculator --reward.remote_url examples/tools/products.py
    python examples/tools/products.py eval smollm2 runs/products/heldout.jsonl

The model rarely knows 347*912 by heart; with the calculator it can copy the exact product. The
reward (`reward_func`, OpenRLHF's contract) reads the text after the last tool result: 1 when it
holds the product; 0.1 for an episode that got a tool result but answered wrong.
"""

import json
import random
import re
import sys
from pathlib import Path

QUESTION = "What is {a} * {b}? Use the calculator tool, then give the product."


def rows(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = r.randint(100, 999), r.randint(100, 999)
        out.append({"messages": [{"role": "user", "content": QUESTION.format(a=a, b=b)}], "label": str(a * b)})
    return out


def correct(tail: str, label: str) -> bool:
    return label in re.sub(r"(?<=\d)[,\s](?=\d)", "", tail)


def reward_func(queries, prompts, labels, **kwargs):
    out = []
    for q, p, label in zip(queries, prompts, labels):
        response = q[len(p):]
        used = "</tool_response>" in response and "error:" not in response.split("</tool_response>")[-2]
        tail = response.split("</tool_response>")[-1]
        out.append(1.0 if correct(tail, str(label)) else (0.1 if used else 0.0))
    return out


def held_out(model: str, path: str, n_turns: int = 3) -> dict:
    """Greedy episodes on `path`: accuracy and the share of tool calls that parsed."""
    import torch

    from rlhfkit.agents.executor import TokenBudget
    from rlhfkit.agents.tools.agent import ToolExecutor
    from rlhfkit.agents.tools.builtin import calculator
    from rlhfkit.data.types import PromptItem
    from rlhfkit.models.loading import load_policy
    from rlhfkit.rollout.base import SamplingParams
    from rlhfkit.rollout.hf import HFEngine

    policy, tok = load_policy(model, "float32")
    data = [json.loads(line) for line in Path(path).read_text().splitlines()]
    prompts = [PromptItem(text="", ids=[], label=d["label"], raw=d["messages"]) for d in data]
    ex = ToolExecutor([calculator])
    engine = HFEngine(policy.eval(), tok, max_batch_size=16)
    with torch.no_grad():
        trajs = ex.run(engine, tok, prompts, SamplingParams(max_new_tokens=64, temperature=0.0),
                       TokenBudget(64, 64 * n_turns + 256, n_turns), generator=torch.Generator().manual_seed(0))
    m = ex.pop_metrics()
    good = 0
    for t, d in zip(trajs, data):
        final = t.info["messages"][-1]
        good += final["role"] == "assistant" and "tool_calls" not in final and correct(final["content"], d["label"])
    return {"accuracy": good / len(data), "valid_call_rate": m["tools/valid_call_rate"],
            "episodes_with_a_call": sum(t.info["tool_calls"] > 0 for t in trajs) / len(trajs)}


if __name__ == "__main__":
    if sys.argv[1] == "data":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(512, 0)))
        (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(32, 1)))
    else:
        print(json.dumps(held_out(sys.argv[2], sys.argv[3])))
