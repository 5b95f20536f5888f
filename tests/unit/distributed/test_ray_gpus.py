"""Ray shows an actor only the GPUs it asks for: unset GPU counts default to the GPUs present, shared
by the trainer actor and the rollout workers (they defaulted to 0, so on a GPU machine the trainer's
`--actor.device auto` trained on the CPU)."""

import os

import pytest
import torch

from rlhfkit.config import RLConfig, parse_config
from rlhfkit.distributed.launch import cluster_gpus, gpu_shares


def test_unset_counts_are_left_to_the_gpus_present():
    d = parse_config(RLConfig, ["--distributed.backend", "ray"]).distributed
    assert d.num_gpus_trainer is None and d.num_gpus_per_worker is None


def test_a_local_cluster_counts_this_machines_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert cluster_gpus(None) == 8
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert cluster_gpus(None) == 0


@pytest.mark.parametrize("gpus,workers,want", [
    (0, 2, (0.0, 0.0)),      # CPU machine: nothing asked
    (8, 2, (1.0, 1.0)),      # enough GPUs: one each
    (3, 2, (1.0, 1.0)),
    (1, 1, (0.5, 0.5)),      # one GPU shared by the trainer and one worker
    (1, 6, (0.1428, 0.1428)),  # 1/7 rounded down: seven shares fit on the GPU
    (2, 2, (0.6666, 0.6666)),
])
def test_unset_shares_split_the_gpus_present(gpus, workers, want):
    assert gpu_shares(None, None, workers, gpus) == want


def test_given_values_are_kept(monkeypatch):
    assert gpu_shares(0.0, 2.0, 2, 8) == (0.0, 2.0)
    assert gpu_shares(None, 0.25, 1, 1) == (0.5, 0.25)


def test_a_gpu_machine_with_defaults_requests_gpus_for_its_actors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    d = parse_config(RLConfig, ["--distributed.backend", "ray", "--rollout.num_workers", "1"]).distributed
    trainer, worker = gpu_shares(d.num_gpus_trainer, d.num_gpus_per_worker, 1, cluster_gpus(d.address))
    assert trainer > 0 and worker > 0


def test_ray_files_go_to_a_short_folder_when_the_run_folder_is_too_long_for_its_sockets(tmp_path, caplog):
    from rlhfkit.distributed.launch import MAX_RAY_TEMP_CHARS, ray_temp_dir

    short = tmp_path.parent / "r"
    if len(str(short.resolve())) <= MAX_RAY_TEMP_CHARS:
        assert ray_temp_dir(short) == str(short.resolve()) and short.is_dir()
    deep = tmp_path / ("x" * 60) / "ray"
    with caplog.at_level("WARNING", logger="rlhfkit"):
        got = ray_temp_dir(deep)
    # Ray's longest socket path under it (64 characters more) fits the 107-byte Unix limit
    assert len(got) + 64 <= 107 and os.path.isdir(got) and not deep.exists()
    assert "too long a path for Ray's sockets" in caplog.text


@pytest.mark.parametrize("gpus,workers,tp,want", [
    (0, 2, 2, (0.0, 0.0)),    # CPU machine: nothing asked
    (8, 2, 2, (1.0, 2.0)),    # 2 engines x 2 GPUs + the trainer's 1 fit: whole GPUs
    (8, 4, 1, (1.0, 1.0)),    # OpenRLHF's one GPU per vLLM engine
    (1, 1, 1, (0.5, 0.5)),    # one GPU shared by the trainer and one engine
])
def test_a_vllm_engine_worker_asks_for_its_tensor_parallel_gpus(gpus, workers, tp, want):
    assert gpu_shares(None, None, workers, gpus, per_worker=tp) == want


def test_a_tensor_parallel_engine_without_whole_gpus_is_refused_in_one_line():
    from rlhfkit.errors import ConfigError

    # 4 GPUs for 2 engines of 2 and the trainer: 4/5 of a GPU per unit, 1.6 GPUs per engine
    with pytest.raises(ConfigError, match="--vllm.tensor_parallel_size 2 needs 2 whole GPUs") as e:
        gpu_shares(None, None, 2, 4, per_worker=2)
    assert "\n" not in str(e.value)
    assert gpu_shares(0.0, 2.0, 2, 4, per_worker=2) == (0.0, 2.0)  # given counts are kept


@pytest.mark.parametrize("gpus,workers,trainers,want", [
    (0, 2, 2, (0.0, 0.0)),    # CPU machine: gloo, nothing asked
    (8, 4, 4, (1.0, 1.0)),    # OpenRLHF's layout: 4 actor GPUs (FSDP ranks) + 4 engines
    (6, 2, 4, (1.0, 1.0)),
])
def test_fsdp_trainer_actors_each_get_a_share_of_the_gpus(gpus, workers, trainers, want):
    assert gpu_shares(None, None, workers, gpus, trainers=trainers) == want


def test_fsdp_trainer_actors_sharing_gpus_are_refused_in_one_line():
    from rlhfkit.errors import ConfigError

    # 4 GPUs for 2 trainer actors and 4 workers: 2/3 of a GPU each, and nccl takes one GPU per rank
    with pytest.raises(ConfigError, match="--fsdp.num_ranks 2 trainer actors need a whole GPU each") as e:
        gpu_shares(None, None, 4, 4, trainers=2)
    assert "\n" not in str(e.value)
    assert gpu_shares(1.0, 0.5, 4, 4, trainers=2) == (1.0, 0.5)  # given counts are kept
