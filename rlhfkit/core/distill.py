"""Distillation divergences between a student and a teacher over the vocabulary.

- ``forward_kl_from_logits``: ``KL(teacher || student)`` per row from both logits (the reference).
- ``linear_forward_kl``: the same value from the two models' last hidden states and LM-head
  weights, a chunk of rows at a time with a hand-written backward: peak memory grows with
  ``chunk_size x V``, not with ``rows x V`` (knowledge distillation, Hinton et al. 2015,
  arXiv:1503.02531; for LMs, Kim & Rush 2016, arXiv:1606.07947).
- ``topk_reverse_kl``: ``KL(student || teacher)`` over the student's top-k tokens plus one tail
  bucket (on-policy distillation's top-k loss, as OpenRLHF's ``train_opd``).
"""

import torch
import torch.nn.functional as F


def forward_kl_from_logits(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """``KL(p_t || p_s) = sum_v p_t(v) (log p_t(v) - log p_s(v))`` per row, in float32.

    Args:
      student_logits: ``[..., V]`` (differentiable).
      teacher_logits: ``[..., V]`` (treated as constants).
    Returns:
      ``[...]`` float32.
    """
    log_s = F.log_softmax(student_logits.float(), dim=-1)
    log_t = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(dim=-1)


def _chunk_probs(h_s, w_s, h_t, w_t):
    """(log p_s, log p_t) [n, V] float32 of one chunk of rows."""
    log_s = F.log_softmax(F.linear(h_s.to(w_s.dtype), w_s).float(), dim=-1)
    log_t = F.log_softmax(F.linear(h_t.to(w_t.dtype), w_t).float(), dim=-1)
    return log_s, log_t


class _LinearForwardKL(torch.autograd.Function):
    """Forward and recomputing backward of ``linear_forward_kl`` (see there)."""

    @staticmethod
    def forward(ctx, h_s, w_s, h_t, w_t, chunk_size):
        kl = torch.empty(h_s.shape[0], dtype=torch.float32, device=h_s.device)
        for start in range(0, h_s.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            log_s, log_t = _chunk_probs(h_s[rows], w_s, h_t[rows], w_t)
            kl[rows] = (log_t.exp() * (log_t - log_s)).sum(dim=-1)
        ctx.chunk_size = chunk_size
        ctx.save_for_backward(h_s, w_s, h_t, w_t)
        return kl

    @staticmethod
    def backward(ctx, grad_kl):
        h_s, w_s, h_t, w_t = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(h_s) if want_h else None
        grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device) if want_w else None
        for start in range(0, h_s.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            log_s, log_t = _chunk_probs(h_s[rows], w_s, h_t[rows], w_t)
            # d KL / d z_s = p_s - p_t, scaled by each row's incoming gradient
            grad_z = ((log_s.exp() - log_t.exp()) * grad_kl[rows].float().unsqueeze(-1)).to(w_s.dtype)
            if want_h:
                grad_h[rows] = (grad_z @ w_s).to(h_s.dtype)
            if want_w:
                grad_w += (grad_z.t() @ h_s[rows].to(w_s.dtype)).float()
        return grad_h, None if grad_w is None else grad_w.to(w_s.dtype), None, None, None


def linear_forward_kl(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``forward_kl_from_logits(student_hidden @ student_weight.T, teacher_hidden @ teacher_weight.T)``
    without keeping the ``[rows, V]`` logits of either model.

    The logits are made ``chunk_size`` rows at a time in the forward and made again in the
    backward, whose gradient with respect to the student's logits is ``p_s - p_t`` per row; the
    teacher gets no gradient. Each matmul runs in its weight's dtype, the softmax in float32.

    Args:
      student_hidden: ``[..., H]`` the student's last hidden states (differentiable).
      student_weight: ``[V, H]`` the student's LM-head weight, no bias (differentiable).
      teacher_hidden: ``[..., H_t]`` the teacher's last hidden states at the same positions.
      teacher_weight: ``[V, H_t]`` the teacher's LM-head weight (same vocabulary ``V``).
    Returns:
      ``[...]`` float32 ``KL(teacher || student)`` per position.
    """
    if student_weight.shape[0] != teacher_weight.shape[0]:
        raise ValueError(f"student and teacher vocabularies differ: {student_weight.shape[0]} vs "
                         f"{teacher_weight.shape[0]} rows of the LM head")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = student_hidden.shape[:-1]
    h_s = student_hidden.reshape(-1, student_hidden.shape[-1])
    h_t = teacher_hidden.detach().reshape(-1, teacher_hidden.shape[-1])
    kl = _LinearForwardKL.apply(h_s, student_weight, h_t, teacher_weight.detach(), chunk_size)
    return kl.reshape(shape)


def topk_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """``KL(student || teacher)`` restricted to the student's ``k`` most likely tokens, plus one
    bucket for the rest of the vocabulary (OpenRLHF's ``train_opd`` with ``--opd.topk k``):

        sum_{v in topk(q)} q(v) (log q(v) - log p(v)) + q_tail (log q_tail - log p_tail)

    with ``q`` the student's and ``p`` the teacher's softmax of ``logits / temperature``,
    ``q_tail = 1 - sum_topk q`` and ``p_tail = 1 - sum_topk p``, each clamped to ``[1e-7, 1]``
    (no tail bucket when ``k >= V``). Differentiable in the student's logits (through the top-k
    probabilities and the tail); the choice of the top-k is not.

    Args:
      student_logits: ``[..., V]``; teacher_logits: ``[..., V]`` (constants).
    Returns:
      ``[...]`` float32.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    vocab = student_logits.shape[-1]
    k = min(k, vocab)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    top = log_q.detach().topk(k, dim=-1).indices
    lq, lp = log_q.gather(-1, top), log_p.gather(-1, top)
    kl = (lq.exp() * (lq - lp)).sum(dim=-1)
    if k < vocab:
        q_tail = (1 - lq.exp().sum(dim=-1)).clamp(1e-7, 1.0)
        p_tail = (1 - lp.exp().sum(dim=-1)).clamp(1e-7, 1.0)
        kl = kl + q_tail * (q_tail.log() - p_tail.log())
    return kl
