"""The user's path on a tiny model: train with periodic pass@k evaluation, plots and offline wandb,
then `rlhfkit eval` on the saved model and `rlhfkit view` on the run folder."""

import glob
import json
import os

import pytest

from rlhfkit.cli.main import main
from tests.integration.conftest import rl_flags

# Training reward: share of "7" characters (dense). Verifier: the response is exactly the label
# (a task the tiny model does not learn): the two are kept apart, as reward hacking would show.
REWARD_FILE = '''
import torch

def reward_func(queries, prompts, labels, **kwargs):
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    r = torch.tensor([sum(c == "7" for c in s) / 8.0 for s in responses])
    return {"rewards": r, "scores": r.clamp(0, 1), "extra_logs": {}}
'''
VERIFIER_FILE = '''
def reward_func(queries, prompts, labels, responses=None, **kwargs):
    return [float(r.strip() == str(l)) for r, l in zip(responses, labels)]
'''


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": "7" if i % 3 else "77"} for i in range(32)]
    root = tiny_ws("evalrun", rows)
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    (root / "reward.py").write_text(REWARD_FILE)
    (root / "verifier.py").write_text(VERIFIER_FILE)
    return root


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "rollout.batch_size": "8", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "4",
        "train.batch_size": "32", "train.micro_batch_size": "16", "train.max_steps": "4",
        "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant",
        "eval.dataset": ws / "test.jsonl", "eval.steps": "2", "eval.n_samples": "4",
        "eval.temperature": "1.0", "eval.k": "1,2,4", "eval.verifier": ws / "verifier.py", **over})


def test_train_eval_plots_wandb_view(ws, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    assert main(["train", "rl", *flags(ws, out, **{"logger.wandb.project": "t", "logger.wandb.mode": "offline"})]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/pass@1" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]  # before, every --eval.steps 2, after
    for r in evals:
        assert 0 <= r["eval/pass@1"] <= r["eval/pass@2"] <= r["eval/pass@4"] <= 1
        assert {"eval/maj@4", "eval/reward", "eval/accuracy"} <= set(r)
    # the training reward rose (the "7" task) while the verifier is a different metric
    train = [r["reward"] for r in rows if "reward" in r]
    assert train[-1] > train[0]
    for png in ("reward", "kl", "entropy", "length", "accuracy"):
        if png != "kl":  # no KL term in this run
            assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {"step", "prompt", "response", "reward", "advantage", "length"} <= set(samples[0])
    assert main(["view", str(out)]) == 0
    assert "samples.html" in os.listdir(out)

    ev = tmp_path / "ev"
    argv = flags(ws, ev, **{"actor.model_name_or_path": str(out / "final")})
    assert main(["eval", *argv]) == 0
    result = json.loads((ev / "eval.json").read_text())
    assert result["prompts"] == 6 and {"eval/pass@4", "eval/maj@2", "eval/reward"} <= set(result["metrics"])
    lines = (ev / "eval_samples.jsonl").read_text().splitlines()
    assert len(lines) == 6 * 4 and "correct" in json.loads(lines[0])
