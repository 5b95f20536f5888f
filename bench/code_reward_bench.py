"""Programs per second of the code reward against the plain subprocess runner, on this CPU.

Each sample is a right `add` with 3 asserts. Three ways, sequentially (one program at a time):
  * plain: `python -I -S -c "<code + asserts>"` in a subprocess, no containment, exit status
    judged (what the reward used to be, and what is gamed with `raise SystemExit(0)`);
  * sandbox script: the same source through CodeSandbox.run (uid drop, namespaces, rlimits);
  * code_reward: each assert judged from outside in its own sandboxed child (3 children a sample),
    one sample at a time, then 4 at once (--reward.code.workers 4).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/code_reward_bench.py [--samples N]

Prints samples per second and tests per second for each.
"""

from __future__ import annotations

import argparse
import subprocess
import time

from rlhfkit.rewards.code import CodeSandbox, code_reward

CODE = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    n = parser.parse_args().samples
    box = CodeSandbox()
    rows = []
    start = time.perf_counter()
    for _ in range(n):
        assert subprocess.run([box.python, "-I", "-S", "-c", CODE + TESTS]).returncode == 0
    rows.append(("plain subprocess (exit status)", time.perf_counter() - start))
    start = time.perf_counter()
    for _ in range(n):
        assert box.run(CODE + TESTS).passed
    rows.append(("sandbox, one script", time.perf_counter() - start))
    start = time.perf_counter()
    out = code_reward([CODE] * n, [TESTS] * n, box)
    assert out.rewards.sum().item() == n
    rows.append(("code_reward, per-test children", time.perf_counter() - start))
    start = time.perf_counter()
    out = code_reward([CODE] * n, [TESTS] * n, box, workers=4)
    assert out.rewards.sum().item() == n
    rows.append(("code_reward, 4 workers", time.perf_counter() - start))
    print(f"{n} samples of 3 asserts, interpreter {box.python}, uid drop {box.uid is not None}")
    for name, seconds in rows:
        print(f"  {name:32s} {n / seconds:7.1f} samples/s  {3 * n / seconds:7.1f} tests/s")


if __name__ == "__main__":
    main()
