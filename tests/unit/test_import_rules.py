"""The import rules of DESIGN.md, checked on every module's source (AST, no import needed)."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "rlhfkit"

# package -> internal packages it may import (DESIGN.md). `errors` is importable by all;
# every package above core may also use core (it is the shared math).
ALLOWED = {
    "core": set(),
    "config": set(),
    "data": {"core"},
    "models": {"core"},
    "rollout": {"core", "models", "data"},
    "rewards": {"core", "data", "models"},
    "agents": {"core", "rollout", "rewards", "data"},
    "trainers": {"core", "config", "data", "models", "rollout", "rewards", "agents"},
    "distributed": {"core", "trainers", "rollout", "models", "data"},
    "tracking": set(),
    "api": {"core", "config", "data", "models", "rollout", "rewards", "agents", "trainers", "distributed", "tracking"},
    "cli": {"core", "config", "data", "models", "rollout", "rewards", "agents", "trainers", "distributed", "tracking",
            "api"},
}
CORE_EXTERNAL = {"torch", "__future__", "math", "typing", "collections", "dataclasses", "enum", "functools"}


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.append("<relative>")
    return names


def modules():
    for pkg in ALLOWED:
        for path in sorted((PKG / pkg).rglob("*.py")):
            yield pkg, path


@pytest.mark.parametrize("pkg,path", list(modules()), ids=lambda x: str(x).split("rlhfkit/")[-1])
def test_internal_imports_follow_design(pkg, path):
    for name in imports_of(path):
        assert name != "<relative>", f"{path}: use absolute imports (rlhfkit.x.y)"
        parts = name.split(".")
        if parts[0] != "rlhfkit" or len(parts) < 2:
            continue
        target = parts[1]
        if target in (pkg, "errors"):
            continue
        assert target in ALLOWED[pkg], f"{path} imports rlhfkit.{target}; {pkg}/ may import {sorted(ALLOWED[pkg])}"


@pytest.mark.parametrize("path", sorted((PKG / "core").rglob("*.py")), ids=lambda p: p.name)
def test_core_imports_torch_only(path):
    for name in imports_of(path):
        root = name.split(".")[0]
        if root == "rlhfkit":
            assert name.startswith("rlhfkit.core"), f"{path}: core imports only core ({name})"
        else:
            assert root in CORE_EXTERNAL, f"{path}: core may import torch only, found {name}"


def test_nothing_imports_cli():
    for pkg, path in modules():
        if pkg == "cli":
            continue
        assert not any(n.startswith("rlhfkit.cli") for n in imports_of(path)), f"{path} imports rlhfkit.cli"


# The RL loop's stages take plain arguments: only rlhfkit.api maps a config to them.
STAGES = sorted(str(p.relative_to(PKG)) for p in (PKG / "trainers" / "rl").rglob("*.py"))


@pytest.mark.parametrize("rel", STAGES)
def test_rl_stages_import_no_config(rel):
    names = imports_of(PKG / rel)
    assert not any(n.startswith("rlhfkit.config") for n in names), f"{rel} imports a config module"
