"""`rlhfkit serve-training --distributed.*`: the backend's name and a cluster address without Ray are
refused in one line before any model loads."""

import pytest

from rlhfkit.config.parse import parse_config
from rlhfkit.config.serve_training import ServeTrainingConfig, validate_serve_training
from rlhfkit.errors import ConfigError


def check(*argv):
    validate_serve_training(parse_config(ServeTrainingConfig, list(argv)))


def test_the_backend_and_address_flags():
    check("--distributed.backend", "ray", "--distributed.address", "10.0.0.1:6379", "--distributed.num_gpus", "1")
    with pytest.raises(ConfigError, match="--distributed.backend mpi: use local or ray"):
        check("--distributed.backend", "mpi")
    with pytest.raises(ConfigError, match="--distributed.address joins a Ray cluster: add --distributed.backend ray"):
        check("--distributed.address", "10.0.0.1:6379")
    with pytest.raises(ConfigError, match="distributed.num_gpus"):
        check("--distributed.backend", "ray", "--distributed.num_gpus", "-1")
    with pytest.raises(ConfigError, match="--distributed.num_gpus 1.5: Ray gives an actor more than one GPU only in "
                                          "whole GPUs; ask for 1 or 2"):
        check("--distributed.backend", "ray", "--distributed.num_gpus", "1.5")
    check("--distributed.backend", "ray", "--distributed.num_gpus", "2")


def test_a_local_cluster_without_the_asked_gpus_is_refused_before_the_host_starts(monkeypatch, tmp_path):
    from rlhfkit.cli import serve_training
    from rlhfkit.distributed import launch

    monkeypatch.setattr(launch, "start_ray", lambda *a, **k: False)
    monkeypatch.setattr(launch, "cluster_gpus", lambda address: 0)
    cfg = parse_config(ServeTrainingConfig, ["--distributed.backend", "ray", "--distributed.num_gpus", "1",
                                             "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match=r"1 model host \(--distributed.num_gpus\) asking 1 GPU each need 1 GPU\(s\), "
                                          "and this machine has 0"):
        with serve_training.model_host(cfg):
            pass
