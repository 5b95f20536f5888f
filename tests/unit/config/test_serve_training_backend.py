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
