"""The fused LM head (core/lm_head.py): values by hand, gradcheck, equal to the logits path."""

import math

import pytest
import torch

from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import logprobs_and_entropy

ATOL = dict(atol=1e-6, rtol=0)


def _by_hand_head():
    # logits = h @ W.T = [0, ln 2, 0]: softmax [1/4, 1/2, 1/4]
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[0.0, 0.0], [math.log(2.0), 0.0], [0.0, 1.0]], requires_grad=True)
    return h, w


def test_linear_logprobs_by_hand():
    h, w = _by_hand_head()
    logp, ent = linear_logprobs_and_entropy(h, w, torch.tensor([1]))
    torch.testing.assert_close(logp, torch.tensor([math.log(0.5)]), **ATOL)
    torch.testing.assert_close(ent, torch.tensor([1.5 * math.log(2.0)]), **ATOL)  # -(2/4 ln 1/4 + 1/2 ln 1/2)
    assert not ent.requires_grad
    logp.sum().backward()
    # d logp / d z = onehot(1) - p = [-1/4, 1/2, -1/4]; dh = that @ W, dW = that (outer) h
    torch.testing.assert_close(h.grad, torch.tensor([[0.5 * math.log(2.0), -0.25]]), **ATOL)
    torch.testing.assert_close(w.grad, torch.tensor([[-0.25, 0.0], [0.5, 0.0], [-0.25, 0.0]]), **ATOL)
    # temperature 2: logits [0, ln2 / 2, 0] -> p(1) = sqrt2 / (2 + sqrt2)
    logp, _ = linear_logprobs_and_entropy(h, w, torch.tensor([1]), temperature=2.0)
    torch.testing.assert_close(logp, torch.tensor([math.log(math.sqrt(2) / (2 + math.sqrt(2)))]), **ATOL)
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs_and_entropy(h, w, torch.tensor([1]), temperature=0.0)


@pytest.mark.parametrize("chunk_size", [1024, 3])
def test_linear_logprobs_gradcheck_and_equal_to_the_unfused_path(chunk_size):
    torch.manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    assert torch.autograd.gradcheck(lambda h, w: linear_logprobs_and_entropy(h, w, labels, 0.7, chunk_size)[0], (h, w))
    # float32, [B, R] shapes: values equal the logits path, and so do both gradients
    h32, w32 = h.detach().float().reshape(1, 7, 5).requires_grad_(), w.detach().float().requires_grad_()
    logp, ent = linear_logprobs_and_entropy(h32, w32, labels.reshape(1, 7), 0.7, chunk_size)
    ref, ref_ent = logprobs_and_entropy(h32 @ w32.T, labels.reshape(1, 7), 0.7)
    assert logp.shape == ent.shape == (1, 7)
    torch.testing.assert_close(logp, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)  # lse - sum p z: float32 cancellation
    weights = torch.arange(7.0).reshape(1, 7)
    got = torch.autograd.grad((logp * weights).sum(), (h32, w32))
    want = torch.autograd.grad((ref * weights).sum(), (h32, w32))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_linear_logprobs_under_bf16_autocast_as_accurate_as_autograd():
    """bf16 matmuls, float32 vocabulary work: the logprobs equal autograd's through F.linear, and the
    gradients are as close as autograd's to the float64 gradient at the same bf16-rounded inputs
    (both ~1%: the bf16 logits); the weight's gradient is float32 like its parameter; backward twice
    (retain_graph) gives the same."""
    torch.manual_seed(1)
    h = torch.randn(2, 9, 64, requires_grad=True)
    w = torch.randn(500, 64, requires_grad=True)
    labels = torch.randint(0, 500, (2, 9))
    weights = torch.rand(2, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = linear_logprobs_and_entropy(h, w, labels, 0.7)
        ref, ref_ent = logprobs_and_entropy(torch.nn.functional.linear(h, w), labels, 0.7)
        got = torch.autograd.grad((logp * weights).sum(), (h, w), retain_graph=True)
        again = torch.autograd.grad((logp * weights).sum(), (h, w))
        autograd = torch.autograd.grad((ref * weights).sum(), (h, w))
    assert logp.dtype == ent.dtype == torch.float32 and got[1].dtype == torch.float32
    torch.testing.assert_close(logp, ref, atol=0, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-5)
    h64, w64 = (x.detach().to(torch.bfloat16).double().requires_grad_() for x in (h, w))
    exact = torch.log_softmax(h64 @ w64.T / 0.7, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    want = torch.autograd.grad((exact * weights.double()).sum(), (h64, w64))
    for g, a, c, x in zip(got, autograd, again, want):
        err, autograd_err = ((y.double() - x).norm() / x.norm() for y in (g, a))
        assert err <= 1.05 * autograd_err and err < 0.03
        torch.testing.assert_close(c, g, atol=0, rtol=0)


def test_linear_logprobs_frozen_head_and_no_grad():
    h, w = _by_hand_head()
    w.requires_grad_(False)
    logp, _ = linear_logprobs_and_entropy(h, w, torch.tensor([1]), with_entropy=False)
    logp.sum().backward()
    assert w.grad is None and h.grad is not None
    with torch.no_grad():
        logp, ent = linear_logprobs_and_entropy(h, w, torch.tensor([1]))
    assert logp.grad_fn is None and ent is not None


@pytest.mark.parametrize("autocast", [False, True])
def test_recomputed_softmax_in_the_backward_gives_the_kept_softmax_gradients(autocast):
    """keep_bytes bounds the softmax kept for the backward; chunks past it are recomputed there by
    the same ops, so the gradients are bit for bit those of keeping every chunk (none, some, all)."""
    torch.manual_seed(2)
    h = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    labels = torch.randint(0, 40, (10,))
    weights = torch.rand(10)

    def grads(keep_bytes):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, ent = linear_logprobs_and_entropy(h, w, labels, 0.7, chunk_size=3, keep_bytes=keep_bytes)
            return logp, ent, torch.autograd.grad((logp * weights).sum(), (h, w))

    row = 4 * 40  # float32 softmax bytes per row
    kept = grads(10 * row)
    for keep_bytes in (0, 3 * row, 7 * row):  # none kept; the first chunk; two chunks (a partial third not)
        got = grads(keep_bytes)
        assert torch.equal(got[0], kept[0]) and torch.equal(got[1], kept[1])
        for a, b in zip(got[2], kept[2], strict=True):
            assert torch.equal(a, b)
