"""Run the switch-off table (tests/switchoff/table.py): first every listed test as it is (all must
pass), then, for each switch-off, its tests in a pytest subprocess with the feature switched off
through tests/switchoff/plugin.py (all must fail). Prints the table: feature | patched target |
tests that failed; a switch-off whose tests do not all fail "survives".

    python -m tests.switchoff.harness [--out FILE] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.switchoff.table import BY_NAME, SWITCH_OFFS, SwitchOff

ROOT = Path(__file__).resolve().parents[2]


def run_pytest(tests: tuple[str, ...], switch: str | None, workdir: Path) -> dict[str, str]:
    """Outcome per node id of `tests` in a fresh pytest process, with `switch` applied (None: as is)."""
    report = workdir / f"{'control' if switch is None else abs(hash(switch))}.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.switchoff.plugin", "--switch-off-report", str(report),
           "-o", "addopts=", "-p", "no:cacheprovider", "--import-mode=importlib", "-W", "ignore", *tests]
    if switch is not None:
        cmd += ["--switch-off", switch]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if not report.exists():
        raise RuntimeError(f"pytest wrote no report for {switch or 'the control run'}:\n{proc.stdout[-2000:]}"
                           f"{proc.stderr[-2000:]}")
    return json.loads(report.read_text())


def matching(outcomes: dict[str, str], test: str) -> dict[str, str]:
    """The outcomes of `test`: a node id, its parametrizations, or every test of a file."""
    return {k: v for k, v in outcomes.items() if k == test or k.startswith((test + "[", test + "::"))}


def check(switches: tuple[SwitchOff, ...], workdir: Path, jobs: int = 2) -> list[dict]:
    """One row per switch-off: name, target, failed (node ids that failed), survived (those that did not)."""
    tests = tuple(dict.fromkeys(t for s in switches for t in s.tests))
    control = run_pytest(tests, None, workdir)
    with ThreadPoolExecutor(jobs) as pool:
        patched = list(pool.map(lambda s: run_pytest(s.tests, s.name, workdir) if s.tests else {}, switches))
    rows = []
    for switch, outcomes in zip(switches, patched, strict=True):
        row = {"name": switch.name, "target": switch.target, "how": switch.how, "failed": [], "survived": []}
        for test in switch.tests:
            base, got = matching(control, test), matching(outcomes, test)
            if not base or any(v != "passed" for v in base.values()):
                row["survived"].append(f"{test} (does not pass as it is: {sorted(set(base.values())) or 'absent'})")
            elif got.keys() != base.keys() or any(v != "failed" for v in got.values()):
                row["survived"].append(f"{test} ({sum(v != 'failed' for v in got.values())} of {len(base)} not failed)")
            else:
                row["failed"].append(test)
        if not switch.tests:
            row["survived"].append("(no test listed)")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| feature switched off | patched target (replacement) | tests that failed |", "|---|---|---|"]
    for row in rows:
        failed = "<br>".join(f"`{t.split('/')[-1]}`" for t in row["failed"]) or "NONE"
        survived = "".join(f"<br>SURVIVED: `{t.split('/')[-1]}`" for t in row["survived"])
        lines.append(f"| {row['name']} | `{row['target']}` ({row['how']}) | {failed}{survived} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="switch-offs to run (default: all)")
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    switches = tuple(BY_NAME[n] for n in args.names) if args.names else SWITCH_OFFS
    with tempfile.TemporaryDirectory() as tmp:
        rows = check(switches, Path(tmp))
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if any(row["survived"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
