"""Every policy loss of core.POLICY_LOSSES trains a tiny model through `rlhfkit train rl`: the reward of
the toy task rises, and with two passes over each rollout batch (so the ratios leave 1 and the losses
differ) the weights end elsewhere than PPO's from the same start and seed."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli import train_rl
from rlhfkit.core import POLICY_LOSSES

LOSS_FLAGS = {
    "cispo": {"actor.eps_clip_low_high": "1.0 0.5"},
    "sapo": {},
    "clip_cov": {"actor.clip_cov_ratio": "0.05", "actor.clip_cov_bounds": "-10 10"},
    "kl_cov": {"actor.kl_cov_ratio": "0.05"},
    "gmpo": {"actor.eps_clip_low_high": "0.4 0.4", "actor.loss_agg_mode": "seq_mean_token_mean"},
    "vespo": {},
}


@pytest.fixture(scope="module")
def workspace(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(64)]
    return tiny_ws("losses", rows, sevens=True)


def run(ws, out, loss, **over):
    flags = {"actor.model_name_or_path": str(ws / "tiny"), "data.prompt_dataset": str(ws / "prompts.jsonl"),
             "data.input_key": "q", "data.label_key": "a", "reward.remote_url": str(ws / "reward.py"),
             "rollout.batch_size": "8", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "8",
             "train.batch_size": "16", "train.micro_batch_size": "16", "train.max_epochs": "2",
             "train.max_steps": "14", "train.num_episodes": "3", "actor.adam.lr": "1e-2",
             "actor.lr_scheduler": "constant", "actor.autocast": "none", "logger.progress_bar": "false",
             "ckpt.output_dir": str(out),
             "algo.advantage.estimator": "group_norm", "actor.policy_loss_type": loss, **over}
    argv = [a for k, v in flags.items() for a in (f"--{k}", *v.split())]
    assert train_rl.run(argv) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m["reward"] for m in metrics if "reward" in m], load_file(str(out / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def ppo_weights(workspace, tmp_path_factory):
    return run(workspace, tmp_path_factory.mktemp("ppo"), "ppo")[1]


def test_every_new_loss_has_a_run_here():
    assert set(LOSS_FLAGS) == set(POLICY_LOSSES) - {"ppo", "gspo"}


@pytest.mark.parametrize("loss", list(LOSS_FLAGS))
def test_reward_rises_and_the_weights_differ_from_ppos(workspace, tmp_path, ppo_weights, loss):
    flags = {k: v for k, v in LOSS_FLAGS[loss].items()}
    rewards, weights = run(workspace, tmp_path / loss, loss, **flags)
    assert len(rewards) == 14
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.15, f"{loss}: reward {first:.3f} -> {last:.3f}"
    start = load_file(str(workspace / "tiny" / "model.safetensors"))
    assert any(not torch.equal(start[k], weights[k]) for k in start)
    assert any((weights[k] - ppo_weights[k]).abs().max() > 1e-4 for k in weights), f"{loss} trained as ppo did"
