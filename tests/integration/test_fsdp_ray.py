"""FSDP2 on Ray (`--distributed.backend ray --fsdp.enable true --fsdp.num_ranks 2`) on a local Ray
cluster with the tiny model: 2 trainer actors (one gloo process group) and 2 rollout workers train
as one process does (the torchrun test's tolerances, tests/integration/test_fsdp.py), a run resumed
from its sharded checkpoint ends as the uninterrupted one, and async training trains within its
staleness bound."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")

from rlhfkit.cli.main import main  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.distributed.launch import ray_temp_dir  # noqa: E402 - likewise
from tests.integration.test_fsdp import (  # noqa: E402 - after the Ray settings and importorskip
    WITH_CRITIC_AND_EMA,
    assert_same_steps,
    assert_same_weights,
    flags,
    metrics,
    ws,  # noqa: F401 - the workspace fixture
)

RAY_FSDP = {"distributed.backend": "ray", "rollout.num_workers": 2, "fsdp.enable": "true", "fsdp.num_ranks": 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=4, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("ray")), include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def runs(ws, cluster, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """tmp/single: one process (the LM head through its module, as FSDP runs it); tmp/fsdp: the same run
    on 2 trainer actors + 2 rollout workers, a sharded checkpoint after each of its 2 steps."""
    root = tmp_path_factory.mktemp("fsdp_ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)
        assert main(["train", "rl", *flags(ws, root / "single", **WITH_CRITIC_AND_EMA)]) == 0
    assert main(["train", "rl", *flags(ws, root / "fsdp", **WITH_CRITIC_AND_EMA, **RAY_FSDP,
                                       **{"ckpt.save_steps": 1})]) == 0
    return root


def test_two_trainer_actors_and_two_rollout_workers_equal_one_process(ws, runs):  # noqa: F811
    """Each actor trains on its share of every optimizer step, rank 0 sends the gathered full weights
    to the workers after each step (the second step's rollouts are the single process's) and writes
    the final model and EMA; rank 1 logs in <output_dir>/rank1."""
    assert_same_weights(ws, runs, ("final", "ema"))
    steps = assert_same_steps(runs, ("actor/grad_norm", "critic/grad_norm"))
    assert len(steps) == 2 and all(b["policy_version"] == a["policy_version"] for a, b, _ in steps)
    assert not (runs / "fsdp" / "rank1" / "final").exists()


def test_a_run_resumed_from_its_sharded_checkpoint_ends_as_the_uninterrupted_one(ws, runs, tmp_path):  # noqa: F811
    """The checkpoint of step 1 (copied into a new output folder) resumes, here with one rollout worker: the
    loaded weights reach the worker before step 2 samples (the same samples: seeded per prompt), and the
    final weights equal the uninterrupted run's bit for bit."""
    ckpts = tmp_path / "resumed" / "checkpoints"
    shutil.copytree(runs / "fsdp" / "checkpoints" / "step_00000001", ckpts / "step_00000001")
    (ckpts / "latest").write_text("step_00000001\n")
    over = {**WITH_CRITIC_AND_EMA, **RAY_FSDP, "ckpt.load_enable": "true", "rollout.num_workers": 1}
    assert main(["train", "rl", *flags(ws, tmp_path / "resumed", **over)]) == 0
    a = load_file(runs / "fsdp" / "final" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    (step,) = metrics(tmp_path / "resumed")
    assert step["reward"] == metrics(runs / "fsdp")[1]["reward"]


def test_async_training_on_two_trainer_actors(ws, cluster, tmp_path):  # noqa: F811
    """--train.async_enable: rank 0 samples step k+1 on the workers while both ranks train on step k
    (staleness 1), and rank 1 draws the batch ahead with it (the ranks' streams stay equal: their
    global gradient norms agree every step)."""
    over = {**RAY_FSDP, "rollout.num_workers": 1, "train.async_enable": "true", "train.max_staleness": 1,
            "train.max_steps": 3}
    assert main(["train", "rl", *flags(ws, tmp_path / "async", **over)]) == 0
    rank0, rank1 = metrics(tmp_path / "async"), metrics(tmp_path / "async" / "rank1")
    assert len(rank0) == len(rank1) == 3
    assert [r["async/staleness_max"] for r in rank0] == [0.0, 1.0, 1.0]
    assert all(a["actor/grad_norm"] == b["actor/grad_norm"] > 0 for a, b in zip(rank0, rank1))
    init = load_file(ws / "tiny" / "model.safetensors")
    final = load_file(tmp_path / "async" / "final" / "model.safetensors")
    assert max(float((final[k] - init[k]).abs().max()) for k in init) > 1e-3
