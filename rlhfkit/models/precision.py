"""The compute-dtype context of forward passes (torch.autocast on the model's device type)."""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def autocast_ctx(dtype_name: str | None, device_type: str = "cpu"):
    """torch.autocast(device_type, bfloat16) for "bfloat16"; a no-op for None or "float32"."""
    if dtype_name == "bfloat16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
