"""Loading never unpickles untrusted data: no pickle, no torch.load without weights_only=True."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlhfkit"
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "joblib", "shelve", "marshal"}


def _findings(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [f"{name}:{node.lineno} imports {m}" for m in mods if m.split(".")[0] in UNSAFE_MODULES]
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if called == "load" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "torch":
                safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                           for k in node.keywords)
                if not safe:
                    out.append(f"{name}:{node.lineno} torch.load without weights_only=True")
            if called in ("read_pickle", "from_pickle"):
                out.append(f"{name}:{node.lineno} calls {called}")
    return out


def test_scanner_catches_the_unsafe_forms():
    bad = "import pickle\nfrom joblib import load\nimport torch\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
    good = "import torch\ntorch.load('x', weights_only=True)\n"
    assert len(_findings(bad, "bad.py")) == 4 and _findings(good, "good.py") == []


def test_package_never_unpickles():
    findings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        findings += _findings(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert findings == [], "\n".join(findings)
