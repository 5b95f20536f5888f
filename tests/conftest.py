"""Test-wide settings: tiny models gain nothing from several threads, and on a busy 2-core machine
torch's spinning threads slow each other down many times over; one thread keeps tests steady."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
