import torch

from rlhfkit.core import overlong_penalty


def test_overlong_penalty_example():
    out = overlong_penalty(torch.tensor([16, 18, 25, 3, 20]), max_new_tokens=20, buffer_len=4, factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.5, -1.0, 0.0, -1.0]), atol=1e-7, rtol=0)
    scaled = overlong_penalty(torch.tensor([17]), max_new_tokens=20, buffer_len=4, factor=2.0)
    torch.testing.assert_close(scaled, torch.tensor([-0.5]))

