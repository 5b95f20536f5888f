import pytest
import torch

from rlhfkit.core import overlong_penalty, stop_properly_penalty


def test_overlong_penalty_example():
    out = overlong_penalty(torch.tensor([16, 18, 25, 3, 20]), max_new_tokens=20, buffer_len=4, factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.5, -1.0, 0.0, -1.0]), atol=1e-7, rtol=0)
    scaled = overlong_penalty(torch.tensor([17]), max_new_tokens=20, buffer_len=4, factor=2.0)
    torch.testing.assert_close(scaled, torch.tensor([-0.5]))



def test_stop_properly_penalty_by_hand():
    """Truncated samples: reward x coef for coef in [0, 1], the reward coef itself below 0; the others kept."""
    rewards = torch.tensor([1.0, 1.0, -0.4, 0.3])
    truncated = torch.tensor([False, True, True, False])
    torch.testing.assert_close(stop_properly_penalty(rewards, truncated, 0.5), torch.tensor([1.0, 0.5, -0.2, 0.3]))
    torch.testing.assert_close(stop_properly_penalty(rewards, truncated, 0.0), torch.tensor([1.0, 0.0, 0.0, 0.3]))
    torch.testing.assert_close(stop_properly_penalty(rewards, truncated, -0.5), torch.tensor([1.0, -0.5, -0.5, 0.3]))
    assert stop_properly_penalty(rewards, truncated, 1.0).tolist() == rewards.tolist()  # 1: no penalty
    assert stop_properly_penalty(rewards, torch.zeros(4, dtype=torch.bool), -1.0).tolist() == rewards.tolist()


def test_stop_properly_penalty_refuses_a_coefficient_above_one():
    with pytest.raises(ValueError, match="need coef <= 1"):
        stop_properly_penalty(torch.tensor([1.0]), torch.tensor([True]), 1.5)
