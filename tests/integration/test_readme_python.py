"""The README's "Use it from Python" code block runs as written (on the tiny model instead of
SmolLM2, in a temporary folder)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block() -> str:
    text = README.read_text()
    section = text.split("## Use it from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_example_runs(tiny_ws, tmp_path, monkeypatch, capsys):
    ws = tiny_ws("readme")
    code = python_block()
    assert '"smollm2"' in code and "runs/notebook" in code  # what the substitutions below replace
    code = code.replace('"smollm2"', repr(str(ws / "tiny")))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    assert "reward " in capsys.readouterr().out
    assert (tmp_path / "runs/notebook/metrics.jsonl").exists()
    assert (tmp_path / "runs/notebook/my_model/model.safetensors").exists()
