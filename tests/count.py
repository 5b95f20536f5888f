"""Count the test suite two ways: test functions, and collected tests (each parametrization one).

    python -m tests.count [PYTEST ARGS]      e.g. `python -m tests.count -m ""` for every marker

A parametrized function counts once as a function and once per parameter set as a collected test;
the functions with the most parametrizations are listed, since they inflate the collected count."""

from __future__ import annotations

import collections
import subprocess
import sys


def count(args: list[str]) -> tuple[int, int, list[tuple[str, int]]]:
    """(functions, collected tests, the 5 most parametrized functions with their counts)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], capture_output=True,
                         text=True, check=False).stdout
    ids = [line for line in out.splitlines() if "::" in line and not line.startswith(" ")]
    functions = collections.Counter(i.split("[", 1)[0] for i in ids)
    return len(functions), len(ids), functions.most_common(5)


def main(argv: list[str]) -> int:
    functions, collected, top = count(argv)
    print(f"test functions: {functions}")
    print(f"collected tests (parametrizations counted): {collected}")
    print(f"parametrizations beyond one per function: {collected - functions}")
    for name, n in top:
        print(f"  {n:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
