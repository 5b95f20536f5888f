import math

import pytest
import torch

from rlhfkit.core.passk import pass_at_k


def test_pass_at_k_by_hand():
    c = torch.tensor([0, 1, 2, 4, 5])
    # n = 5: k=1 -> c/5; k=2 -> 1 - C(5-c, 2)/C(5, 2) = 1 - C(5-c, 2)/10
    assert pass_at_k(c, 5, 1).tolist() == pytest.approx([0.0, 0.2, 0.4, 0.8, 1.0], abs=1e-12)
    assert pass_at_k(c, 5, 2).tolist() == pytest.approx([0.0, 1 - 6 / 10, 1 - 3 / 10, 1.0, 1.0], abs=1e-12)
    assert pass_at_k(c, 5, 5).tolist() == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0], abs=1e-12)


def test_pass_at_k_matches_binomials_for_large_n():
    n, k = 200, 10
    c = torch.tensor([3, 50, 190])
    exact = [1 - math.comb(n - ci, k) / math.comb(n, k) for ci in c.tolist()]
    assert pass_at_k(c, n, k).tolist() == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_rejects_bad_k_and_counts():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(torch.tensor([1]), 4, 5)
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(torch.tensor([5]), 4, 1)
