"""Programs per second of the code reward against the plain subprocess runner, on this CPU.

Each sample is a right `add` with 3 asserts. Rows:
  * plain: `python -I -S -c "<code + asserts>"` in a subprocess, no containment, exit status
    judged (what is gamed with `raise SystemExit(0)`);
  * for each backend, `none` (rlimits only) and `bwrap` (the default boundary):
    - one script: the same source through CodeSandbox.run, one program at a time;
    - code_reward: each assert judged from outside in its own child (3 children a sample), one
      sample at a time (1 worker), then 4 at once (--reward.code.workers 4).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/code_reward_bench.py [--samples N] [--backends bwrap,none]

Prints samples per second and programs (children) per second for each row.
"""

from __future__ import annotations

import argparse
import subprocess
import time

from rlhfkit.rewards.code import CodeSandbox, code_reward

CODE = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def backend_rows(backend: str, n: int) -> list[tuple[str, float, int]]:
    """(name, seconds, programs run) for one backend."""
    box = CodeSandbox(backend)

    def scripts():
        for _ in range(n):
            assert box.run(CODE + TESTS).passed

    def judged(workers: int):
        assert code_reward([CODE] * n, [TESTS] * n, box, workers=workers).rewards.sum().item() == n

    return [(f"{backend}: one script", timed(scripts), n),
            (f"{backend}: code_reward, 1 worker", timed(lambda: judged(1)), 3 * n),
            (f"{backend}: code_reward, 4 workers", timed(lambda: judged(4)), 3 * n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--backends", default="none,bwrap")
    args = parser.parse_args()
    n = args.samples
    python = CodeSandbox("none").python

    def plain():
        for _ in range(n):
            assert subprocess.run([python, "-I", "-S", "-c", CODE + TESTS]).returncode == 0

    rows = [("plain subprocess (exit status)", timed(plain), n)]
    for backend in args.backends.split(","):
        rows += backend_rows(backend, n)
    print(f"{n} samples of 3 asserts, interpreter {python}")
    for name, seconds, programs in rows:
        print(f"  {name:34s} {n / seconds:7.1f} samples/s  {programs / seconds:7.1f} programs/s")


if __name__ == "__main__":
    main()
