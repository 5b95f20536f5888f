"""vLLM runs in the trainer's process, on the GPU that holds the policy: by default it takes half the
GPU and sleeps during the update (where there is CUDA); a share above the free memory is refused in
one line (vLLM's 0.9 used to either refuse to start or leave the update a tenth of the GPU)."""

import pytest

from rlhfkit.config import RLConfig, parse_config, validate
from rlhfkit.errors import ConfigError
from rlhfkit.rollout.vllm import COLOCATED_MEMORY_SHARE, colocated_memory


def test_defaults_are_left_to_the_colocation_decision():
    cfg = parse_config(RLConfig, ["--rollout.engine", "vllm"])
    validate(cfg)
    assert cfg.vllm.gpu_memory_utilization is None and cfg.vllm.enable_sleep is None


def test_on_a_gpu_the_default_is_half_the_gpu_and_sleep_on():
    assert colocated_memory(None, None, cuda=True, free_share=0.97) == (COLOCATED_MEMORY_SHARE, True)
    assert COLOCATED_MEMORY_SHARE == 0.5


def test_without_cuda_sleep_stays_off():
    assert colocated_memory(None, None, cuda=False, free_share=None) == (0.5, False)


def test_explicit_values_are_kept():
    assert colocated_memory(0.3, False, cuda=True, free_share=0.9) == (0.3, False)


def test_a_share_above_the_free_memory_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"--vllm.gpu_memory_utilization 0.9: .* only 0.70 of the GPU is free") as e:
        colocated_memory(0.9, True, cuda=True, free_share=0.7)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="below 0.40"):
        colocated_memory(None, None, cuda=True, free_share=0.4)  # the trainer already holds over half
