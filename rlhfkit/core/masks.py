"""Masked reductions over token tensors.

All functions take ``mask`` as a bool tensor broadcastable to ``x`` where True means the
entry counts (the project's one-mask convention, see docs/architecture.md). Entries where the mask is
False are *selected away* with ``torch.where`` rather than multiplied by zero, so NaN or inf
junk in padding cannot leak into a result or its gradient.
"""

import torch


def _select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over the entries where ``mask`` is True.

    Args:
        x: ``[B, T]`` (any shape) values.
        mask: bool, broadcastable to ``x``; True = counts.
        dim: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``x`` summed over ``dim`` (scalar when ``dim is None``, e.g. ``[B]`` for ``dim=-1``).
    """
    return _select(x, mask).sum() if dim is None else _select(x, mask).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is True.

    Args:
        x: ``[B, T]`` (any shape) values.
        mask: bool, broadcastable to ``x``; True = counts.
        dim: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        The masked mean over ``dim``. A slice with no counted entry gives 0 (OpenRLHF's
        ``masked_mean`` divides by zero there and returns NaN).
    """
    mask = mask.expand_as(x) if mask.shape != x.shape else mask
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``x`` with the mean and variance of its masked entries.

    ``mean`` and the *biased* variance ``var = mean((x - mean)^2)`` are taken over the
    entries where ``mask`` is True; the result is ``(x - mean) * rsqrt(max(var, eps))``.
    With ``shift_mean=False`` the mean is added back, so ``x`` is only rescaled:
    ``(x - mean) * rsqrt(max(var, eps)) + mean``.

    This is the batch advantage normalisation of PPO implementations (OpenRLHF's
    experience maker; Schulman et al. 2017's reference code normalises advantages the same
    way). Every entry, counted or not, is transformed with the same statistics; callers that
    need zeros outside the mask select them afterwards.

    Args:
        x: ``[B, T]`` (any shape) values.
        mask: bool, same shape as ``x``; True = counts.
        shift_mean: False keeps the mean (scale only).
        eps: floor on the variance.

    Returns:
        Tensor with the shape and dtype of ``x``.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    whitened = (x - mean) * var.clamp(min=eps).rsqrt()
    return whitened if shift_mean else whitened + mean
