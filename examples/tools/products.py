"""Products of 3-digit numbers with a calculator tool: RL prompts, held-out prompts, SFT traces, reward.

    python examples/tools/products.py runs/products/data
        # train.jsonl (RL prompts), heldout.jsonl (other problems), sft.jsonl (tool-call traces)
    rlhfkit train sft ... --data.dataset runs/products/data/sft.jsonl       # a short warm start
    rlhfkit train rl ... --agent.tools builtin:calculator --reward.remote_url examples/tools/products.py
    rlhfkit eval ... --agent.tools builtin:calculator --eval.dataset runs/products/data/heldout.jsonl

(the full commands are in docs/agents.md). A 135M model does not know 347*912 by heart; with the
calculator it can copy the exact product. The reward (`reward_func`, OpenRLHF's contract) reads
the text after the last tool result: 1 when it holds the product; 0.1 for an episode that got a
tool result but answered wrong; 0 otherwise.

The SFT traces are whole conversations (question, the call, its result, the answer) written in
rlhfkit's default tool format (`default_tools_messages`: the schemas in the system turn,
Hermes-style `<tool_call>` blocks), the form the RL episodes are rendered in for chat templates
that ignore `tools=` (SmolLM2's). Their problems are drawn apart from the RL and held-out ones.
"""

import json
import random
import re
import sys
from pathlib import Path

QUESTION = "What is {a} * {b}? Use the calculator tool, then give the product."


def problems(n: int, seed: int) -> list[tuple[int, int]]:
    r = random.Random(seed)
    return [(r.randint(100, 999), r.randint(100, 999)) for _ in range(n)]


def prompt_rows(n: int, seed: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": QUESTION.format(a=a, b=b)}], "label": str(a * b)}
            for a, b in problems(n, seed)]


def trace(a: int, b: int) -> list[dict]:
    """One conversation that uses the tool: the question, the call, its result, the answer."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}}
    return [{"role": "user", "content": QUESTION.format(a=a, b=b)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": str(a * b)},
            {"role": "assistant", "content": f"{a} * {b} = {a * b}"}]


def sft_rows(n: int, seed: int) -> list[dict]:
    from rlhfkit.agents.tools import ToolSet, default_tools_messages
    from rlhfkit.agents.tools.builtin import calculator

    schemas = ToolSet([calculator]).schemas
    return [{"messages": default_tools_messages(trace(a, b), schemas)} for a, b in problems(n, seed)]


def correct(tail: str, label: str) -> bool:
    return label in re.sub(r"(?<=\d)[,\s](?=\d)", "", tail)


def reward_func(queries, prompts, labels, **kwargs):
    out = []
    for q, p, label in zip(queries, prompts, labels):
        response = q[len(p):]
        used = "</tool_response>" in response and "error:" not in response.split("</tool_response>")[-2]
        tail = response.split("</tool_response>")[-1]
        out.append(1.0 if correct(tail, str(label)) else (0.1 if used else 0.0))
    # scores: right or not (eval/accuracy is their mean); rewards: with the 0.1 for a tool result
    return {"rewards": out, "scores": [float(r == 1.0) for r in out]}


def main(out: str) -> None:
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    files = {"train.jsonl": prompt_rows(512, 0), "heldout.jsonl": prompt_rows(64, 1), "sft.jsonl": sft_rows(64, 2)}
    for name, rows in files.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {', '.join(f'{len(r)} {n}' for n, r in files.items())} to {root}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/products/data")
