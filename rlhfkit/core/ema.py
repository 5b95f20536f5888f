"""Exponential moving average of model parameters."""

import torch


def ema_update(ema_params, params, beta: float) -> None:
    """In-place ``ema <- beta * ema + (1 - beta) * theta`` under ``no_grad``.

    Polyak averaging (Polyak & Juditsky 1992) as used for EMA models in OpenRLHF
    (``--enable_ema``). Tensors may be on different dtypes; theta is cast to the EMA dtype.

    Args:
        ema_params: iterable of tensors updated in place (any shapes).
        params: iterable of tensors with the same shapes, in the same order.
        beta: decay in ``[0, 1]``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"ema_update: beta must be in [0, 1], got {beta}")
    with torch.no_grad():
        for ema, theta in zip(ema_params, params, strict=True):
            ema.mul_(beta).add_(theta.detach().to(device=ema.device, dtype=ema.dtype), alpha=1.0 - beta)
