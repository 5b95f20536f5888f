"""The device tests run each check with device="cpu" in the default suite (the code paths are the
CUDA ones with a CPU device) and with device="cuda" under `-m gpu` (skipped without CUDA)."""

import pytest
import torch

from tests.integration.conftest import tiny_ws  # noqa: F401  (the tiny model's folder)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 matmuls in full float32 on CUDA too (no TF32), so CUDA and the CPU agree to ~1e-6."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)
