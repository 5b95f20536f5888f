"""The lint configured in pyproject.toml: ruff over the repository's Python (rlhfkit, tests, bench, examples)
and mypy over rlhfkit/core, each run as `python -m TOOL` from the repository root. A test fails with the
tool's own report; it is skipped only when the tool is not installed (both come with the `dev` extra)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF_PATHS = ["rlhfkit", "tests", "bench", "examples"]


def run_tool(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this environment (pip install -e '.[dev]' brings it)")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff_finds_nothing():
    # --no-cache: nothing written into the tree (ruff takes well under a second uncached)
    proc = run_tool("ruff", "check", "--no-cache", "--output-format", "concise", *RUFF_PATHS, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"ruff check {' '.join(RUFF_PATHS)}:\n{proc.stdout}{proc.stderr}", pytrace=False)


def test_mypy_finds_nothing_in_core(tmp_path):
    # the files and settings come from [tool.mypy]; its cache goes to the test's temporary folder, so
    # each run is a cold one (~15 s on a 2-core machine, most of it reading torch's annotations)
    proc = run_tool("mypy", "--cache-dir", str(tmp_path / "mypy_cache"), timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"mypy (rlhfkit/core):\n{proc.stdout}{proc.stderr}", pytrace=False)
    core = len(list((ROOT / "rlhfkit" / "core").rglob("*.py")))
    assert f"in {core} source files" in proc.stdout, f"mypy did not check all of rlhfkit/core:\n{proc.stdout}"
