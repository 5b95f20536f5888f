"""The LM head fused with the log-softmax and entropy, with a hand-written backward.

``linear_logprobs_and_entropy(hidden, weight, labels)`` equals
``logprobs_and_entropy(hidden @ weight.T, labels)`` (``core/losses.py``) without keeping the
``[rows, V]`` logits. Response logprobs use it in place of the LM head module when the head
is a plain bias-free linear map; docs/performance.md measures what it saves.
"""

import torch
import torch.nn.functional as F

# Bytes of float32 softmax the forward keeps for the backward (about 512 MiB): chunks past it are
# recomputed in the backward (one more [rows, H] x [H, V] matmul each) instead of kept, so a long
# micro-batch's head does not hold rows x V x 4 bytes (8,192 response tokens x 49,152: 1.6 GB).
KEEP_PROBS_BYTES = 1 << 29


class _HeadLogprobs(torch.autograd.Function):
    """Forward and hand-written backward of ``linear_logprobs_and_entropy`` (see there)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, with_entropy, keep_rows):
        logp, entropy, probs, h, dtype, amp = _head_chunks(hidden, weight, labels, temperature, chunk_size,
                                                           with_entropy, keep_rows=keep_rows)
        ctx.temperature, ctx.chunk_size, ctx.dtype, ctx.amp = temperature, chunk_size, dtype, amp
        ctx.save_for_backward(h, weight, labels, *probs)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        h, weight, labels, *probs = ctx.saved_tensors
        if grad_logp is None:
            return None, None, None, None, None, None, None
        want_h, want_w = ctx.needs_input_grad[:2]
        acc = torch.promote_types(ctx.dtype, torch.float32)
        grad_h = torch.empty(h.shape, dtype=acc, device=h.device) if want_h else None
        grad_w = None
        starts = range(0, h.shape[0], ctx.chunk_size)
        # The two matmuls in the forward's compute dtype; under autocast the weight's cast comes
        # from autocast's cache (shared by the threads of the process).
        with _AutocastState(h.device.type, ctx.amp, ctx.dtype):
            for c, start in enumerate(starts):
                rows = slice(start, start + ctx.chunk_size)
                label = labels[rows].unsqueeze(-1)
                # a chunk past the kept ones: its softmax again, by the forward's own ops (the same numbers)
                p = probs[c] if c < len(probs) else _chunk(h[rows], weight, labels[rows], ctx.temperature,
                                                           False, acc)[2]
                # d logp / d z = coef * (p - onehot(label)) with coef = -grad / T per row: p cast once
                # to the compute dtype, the label's entry from (p - 1) in float32 (its precision kept);
                # the row scale goes on the [n, H] side of each matmul, not over [n, V].
                coef = (grad_logp[rows].to(acc) / -ctx.temperature).unsqueeze(-1)
                grad_z = p.to(h.dtype, copy=True)
                grad_z.scatter_(-1, label, (p.gather(-1, label) - 1).to(h.dtype))
                del p
                if want_h:
                    grad_h[rows] = torch.matmul(grad_z, weight).to(acc) * coef
                if want_w:
                    part = torch.matmul(grad_z.t(), (h[rows] * coef).to(h.dtype))
                    if len(starts) == 1:
                        grad_w = part
                    else:  # several chunks: the sum in float32
                        grad_w = part.to(acc) if grad_w is None else grad_w.add_(part)
        return grad_h, grad_w, None, None, None, None, None


class _AutocastState:
    """Autocast on `device` on or off (to `dtype`) inside the block, without entering or leaving an
    autocast region. Leaving the outermost `torch.autocast` clears autocast's cache of weight casts,
    for every thread; on CUDA the backward runs on autograd's device thread, outside the forward's
    region, so a `torch.autocast` block there cleared the casts the update keeps across its
    micro-batches (each micro-batch then cast every weight again). Only this thread's enabled flag
    and dtype are set here, then restored."""

    def __init__(self, device: str, enabled: bool, dtype: torch.dtype | None = None):
        self.device, self.enabled, self.dtype = device, enabled, dtype

    def __enter__(self):
        self.was = torch.is_autocast_enabled(self.device), torch.get_autocast_dtype(self.device)
        torch.set_autocast_enabled(self.device, self.enabled)
        if self.dtype is not None:
            torch.set_autocast_dtype(self.device, self.dtype)

    def __exit__(self, *exc):
        torch.set_autocast_dtype(self.device, self.was[1])
        torch.set_autocast_enabled(self.device, self.was[0])
        return False


def _chunk(h, weight, labels, temperature, with_entropy, acc, want_probs=True):
    """(logp [n], entropy [n] or None, softmax [n, V] or None) of one chunk of rows ``h`` [n, H] (compute
    dtype)."""
    z = F.linear(h, weight).to(acc)  # autocast: the weight's bf16 copy from its cache
    with _AutocastState(h.device.type, False):  # the vocabulary work in float32 (bmm is autocast)
        if temperature != 1.0:
            z.div_(temperature)
        m = z.amax(dim=-1, keepdim=True)
        e = torch.sub(z, m).exp_()
        s = e.sum(dim=-1, keepdim=True)
        lse = (m + s.log()).squeeze(-1)
        logp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
        entropy = None
        if with_entropy:
            # sum e * z as a batched dot product (vecdot and (e * z).sum make the [n, V] product)
            entropy = lse - torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).reshape(-1) / s.squeeze(-1)
        return logp, entropy, e.div_(s) if want_probs else None


def _head_chunks(hidden, weight, labels, temperature, chunk_size, with_entropy, keep_rows):
    """Logprobs (and entropy) of ``labels`` under ``softmax(hidden @ weight.T / temperature)``, a chunk
    of rows at a time; also the softmax of the chunks within the first ``keep_rows`` rows, for the
    backward."""
    device = hidden.device.type
    amp = torch.is_autocast_enabled(device) and weight.dtype != torch.get_autocast_dtype(device)
    dtype = torch.get_autocast_dtype(device) if amp else weight.dtype
    acc = torch.promote_types(dtype, torch.float32)  # float32 (float64 stays float64)
    h = hidden.to(dtype)
    n = h.shape[0]
    logp = torch.empty(n, dtype=acc, device=h.device)
    entropy = torch.empty(n, dtype=acc, device=h.device) if with_entropy else None
    probs = []
    for start in range(0, n, chunk_size):
        rows = slice(start, start + chunk_size)
        keep = min(start + chunk_size, n) <= keep_rows
        logp[rows], ent, p = _chunk(h[rows], weight, labels[rows], temperature, with_entropy, acc, keep)
        if with_entropy:
            entropy[rows] = ent
        if keep:
            probs.append(p)
    return logp, entropy, probs, h, dtype, amp


def linear_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    keep_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logprobs_and_entropy(hidden @ weight.T, labels, ...)`` fused with the LM head.

    The logits are made a chunk of rows at a time and reduced once for the logprob, the
    log-sum-exp and the entropy; the backward is written by hand: ``dlogp/dz = onehot - p``
    from the softmax kept in float32, cast to the compute dtype in one pass, then the head's
    two matmuls with the per-row scale ``-grad / T`` applied on their ``[rows, H]`` side.
    Autograd through ``logprobs_and_entropy`` instead keeps the
    float32 logits and runs about six more passes over ``[rows, V]`` (the gather's zeros, the
    log-sum-exp's exp, the sum of the two gradients, the temperature, the cast).

    Under autocast the matmuls run in its dtype (the weight's cast from autocast's cache), the
    vocabulary work in float32. The entropy is returned without a gradient (a metric);
    use ``logprobs_and_entropy`` on the logits when it must be differentiated.

    The forward keeps the float32 softmax of its first chunks, up to ``keep_bytes`` (None:
    ``KEEP_PROBS_BYTES``), for the
    backward; the backward recomputes the other chunks' softmax (the same ops on the same inputs:
    the same gradients), so memory stays bounded however many rows there are.

    Args:
      hidden: ``[..., H]`` last hidden states at the positions that predict ``labels``.
      weight: ``[V, H]`` LM head weight (no bias).
      labels: ``[...]`` long token ids.
    Returns:
      ``([...], [...] or None)`` float32 logprobs (differentiable in ``hidden`` and ``weight``)
      and entropies.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        keep_rows = (KEEP_PROBS_BYTES if keep_bytes is None else keep_bytes) // (4 * weight.shape[0])
        logp, entropy = _HeadLogprobs.apply(flat_hidden, weight, flat_labels, temperature, chunk_size, with_entropy,
                                            keep_rows)
    else:
        logp, entropy = _head_chunks(flat_hidden, weight, flat_labels, temperature, chunk_size, with_entropy,
                                     keep_rows=0)[:2]
    return logp.reshape(labels.shape), None if entropy is None else entropy.reshape(labels.shape)
