import torch

from rlhfkit.core import masked_mean, masked_sum, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
M = torch.tensor([[True, True, False], [True, False, True]])


def test_masked_sum_and_mean_ignore_junk():
    assert masked_sum(X, M).item() == 13.0
    assert torch.equal(masked_sum(X, M, dim=-1), torch.tensor([3.0, 10.0]))
    assert masked_mean(X, M).item() == 13.0 / 4
    assert torch.equal(masked_mean(X, M, dim=-1), torch.tensor([1.5, 5.0]))


def test_masked_mean_of_nothing_is_zero():
    empty = torch.zeros_like(M)
    assert masked_mean(X, empty).item() == 0.0
    assert torch.equal(masked_mean(X, empty, dim=-1), torch.zeros(2))


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[True, True, False]])
    # mean 2, biased var 1 -> (x - 2) / 1
    out = masked_whiten(x, m)
    torch.testing.assert_close(out[0, :2], torch.tensor([-1.0, 1.0]), atol=1e-6, rtol=0)
    # shift_mean=False: scale only, mean added back
    torch.testing.assert_close(masked_whiten(x, m, shift_mean=False)[0, :2], torch.tensor([1.0, 3.0]))
    x2 = torch.tensor([[2.0, 6.0]])
    m2 = torch.tensor([[True, True]])  # mean 4, var 4, std 2
    torch.testing.assert_close(masked_whiten(x2, m2), torch.tensor([[-1.0, 1.0]]))
    torch.testing.assert_close(masked_whiten(x2, m2, shift_mean=False), torch.tensor([[3.0, 5.0]]))


def test_masked_whiten_constant_uses_eps_floor():
    x = torch.full((1, 3), 5.0)
    out = masked_whiten(x, torch.ones(1, 3, dtype=torch.bool))
    assert torch.equal(out, torch.zeros(1, 3))
