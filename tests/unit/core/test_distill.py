"""core.distill: forward KL (direct and chunked over rows with a hand-written backward) and the
top-k reverse KL of on-policy distillation, on values worked out by hand."""

import math

import pytest
import torch

from rlhfkit.core.distill import forward_kl_from_logits, linear_forward_kl, topk_reverse_kl

LN4 = math.log(4.0)
# teacher (0.5, 0.5), student (0.8, 0.2): KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.5 ln 1.5625
KL_HALF_VS_80_20 = 0.5 * math.log(1.5625)


def test_forward_kl_by_hand():
    kl = forward_kl_from_logits(torch.tensor([[LN4, 0.0]]), torch.tensor([[0.0, 0.0]]))
    assert kl.item() == pytest.approx(KL_HALF_VS_80_20, abs=1e-7)
    same = forward_kl_from_logits(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0]]))
    assert same.item() == pytest.approx(0.0, abs=1e-7)


def test_linear_forward_kl_value_and_gradient_by_hand():
    # H = 1: the logits are the weight's column, student (ln 4, 0), teacher (0, 0)
    h_s = torch.tensor([[1.0]], requires_grad=True)
    w_s = torch.tensor([[LN4], [0.0]], requires_grad=True)
    kl = linear_forward_kl(h_s, w_s, torch.tensor([[1.0]]), torch.zeros(2, 1), chunk_size=1)
    assert kl.item() == pytest.approx(KL_HALF_VS_80_20, abs=1e-7)
    kl.sum().backward()
    # d KL / d z_s = p_s - p_t = (0.3, -0.3); d / d w_s = that times h = 1; d / d h_s = 0.3 ln 4
    assert w_s.grad.flatten().tolist() == pytest.approx([0.3, -0.3], abs=1e-6)
    assert h_s.grad.item() == pytest.approx(0.3 * LN4, abs=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 64])
def test_linear_forward_kl_chunked_equals_direct(chunk_size):
    g = torch.Generator().manual_seed(0)
    h_s = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    w_s = torch.randn(7, 4, generator=g, requires_grad=True)
    h_t, w_t = torch.randn(2, 3, 5, generator=g), torch.randn(7, 5, generator=g)
    weights = torch.rand(2, 3, generator=g)
    chunked = linear_forward_kl(h_s, w_s, h_t, w_t, chunk_size=chunk_size)
    (chunked * weights).sum().backward()
    grads = h_s.grad.clone(), w_s.grad.clone()
    h_s.grad = w_s.grad = None
    direct = forward_kl_from_logits(h_s @ w_s.T, h_t @ w_t.T)
    (direct * weights).sum().backward()
    torch.testing.assert_close(chunked, direct, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads[0], h_s.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[1], w_s.grad, rtol=1e-5, atol=1e-6)


def test_linear_forward_kl_refuses_different_vocabularies():
    with pytest.raises(ValueError, match="vocabularies differ"):
        linear_forward_kl(torch.ones(1, 2), torch.ones(3, 2), torch.ones(1, 2), torch.ones(4, 2))


def test_topk_reverse_kl_by_hand():
    q = torch.tensor([[0.5, 0.3, 0.2]]).log()  # the student
    p = torch.tensor([[0.25, 0.25, 0.5]]).log()  # the teacher
    # k = 1: token 0 (q .5, p .25) and the tail (q .5, p .75): .5 ln 2 + .5 ln(.5/.75)
    assert topk_reverse_kl(q, p, 1).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75), abs=1e-6)
    # k = V: the full reverse KL, no tail bucket
    full = 0.5 * math.log(2) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert topk_reverse_kl(q, p, 3).item() == pytest.approx(full, abs=1e-6)
    assert topk_reverse_kl(q, p, 10).item() == pytest.approx(full, abs=1e-6)


def test_topk_reverse_kl_gradient_lowers_it():
    student = torch.tensor([[2.0, 0.0, -1.0, 0.5]], requires_grad=True)
    teacher = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    before = topk_reverse_kl(student, teacher, 2)
    before.sum().backward()
    with torch.no_grad():
        after = topk_reverse_kl(student - 0.1 * student.grad, teacher, 2)
    assert after.item() < before.item()
