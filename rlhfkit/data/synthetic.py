"""Synthetic arithmetic problems from a fixed seed (the demo's task).

Train and held-out splits never share a problem. Each record is
{"input": "What is 23 + 17?", "label": "40"}; the prompt wording around it (the answer format)
is added by the caller so that the base and the trained model are scored with the same prompt.
"""

from __future__ import annotations

import random


def arithmetic_problems(
    n_train: int, n_test: int, seed: int = 0, max_operand: int = 50, ops: tuple[str, ...] = ("+",)
) -> tuple[list[dict], list[dict]]:
    """Return disjoint (train, test) lists of addition/subtraction problems on 1..max_operand."""
    rng = random.Random(seed)
    pool = [(a, op, b) for a in range(1, max_operand + 1) for b in range(1, max_operand + 1) for op in ops]
    if n_train + n_test > len(pool):
        raise ValueError(f"only {len(pool)} distinct problems with max_operand={max_operand}")
    rng.shuffle(pool)
    records = [{"input": f"What is {a} {op} {b}?", "label": str(a + b if op == "+" else a - b)} for a, op, b in pool]
    return records[:n_train], records[n_train : n_train + n_test]
