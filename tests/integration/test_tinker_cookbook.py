"""tinker-cookbook's minimal recipes (`sl_loop`, `rl_loop`), unchanged, against serve-training's app
over a tiny random model, through examples/tinker_cookbook/run_recipe.py (their hub datasets read
from local files). Skipped unless `tinker_cookbook` is importable: its own dependencies are not
part of rlhfkit's (see docs/tinker.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker")
if importlib.util.find_spec("tinker_cookbook") is None:
    pytest.skip("tinker-cookbook is not installed", allow_module_level=True)

from rlhfkit.models.tiny import tiny_model_and_tokenizer
from tests.integration.test_tinker_sdk import KEY, Server

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "examples" / "tinker_cookbook" / "run_recipe.py"
NAME = "Qwen/Qwen3-8B-Base"  # a name the cookbook knows (role_colon renderer); here a tiny model's tokenizer


@pytest.fixture
def cookbook_env(tmp_path, monkeypatch, hub_repo):
    tok = tiny_model_and_tokenizer(seed=0)[1]
    folder = tmp_path / "tok"
    tok.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    hub_repo(tmp_path / "hf" / "hub", "model", NAME, folder)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    srv = Server(tmp_path / "ckpt", name=NAME)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": KEY,
           "TINKER_TELEMETRY": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    subprocess.run([sys.executable, str(RUNNER), "--write-data", str(tmp_path / "data")], check=True, env=env)
    yield srv, env, tmp_path
    srv.stop()


def run(recipe, data, srv, env, log_path, *args):
    cmd = [sys.executable, str(RUNNER), f"tinker_cookbook.recipes.{recipe}", "--data", data,
           f"base_url={srv.url}", f"model_name={NAME}", f"log_path={log_path}", "save_every=0", "lora_rank=4", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in open(Path(log_path) / "metrics.jsonl")]


def test_sl_loop_recipe_trains(cookbook_env):
    srv, env, tmp = cookbook_env
    rows = run("sl_loop", f"HuggingFaceH4/no_robots={tmp / 'data' / 'chat.jsonl'}", srv, env, tmp / "sl",
               "batch_size=8", "max_steps=6", "learning_rate=1e-2", "max_length=256")
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    assert len(nll) == 6 and nll[-1] < 0.8 * nll[0], nll


def test_rl_loop_recipe_runs_with_stop_strings(cookbook_env):
    srv, env, tmp = cookbook_env
    rows = run("rl_loop", f"openai/gsm8k={tmp / 'data' / 'arithmetic.jsonl'}", srv, env, tmp / "rl",
               "batch_size=2", "group_size=2", "max_tokens=8", "max_steps=2", "loss_fn=importance_sampling")
    assert [r["progress/batch"] for r in rows if "progress/batch" in r] == [0, 1]
    assert all(0.0 <= r["reward/total"] <= 1.0 for r in rows if "reward/total" in r)
