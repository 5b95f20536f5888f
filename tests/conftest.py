"""Test-wide settings: tiny models gain nothing from several threads, and on a busy 2-core machine
torch's spinning threads slow each other down many times over; one thread keeps tests steady."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip (not fail) without CUDA, even when asked for with `-m gpu`."""
    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
