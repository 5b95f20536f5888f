"""Muon over FSDP2-sharded matrices (`--actor.optim muon` / `--critic.optim muon` with `--fsdp.enable`).

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; torch.optim.Muon) orthogonalises
each hidden matrix's momentum update with a Newton-Schulz iteration, which needs the WHOLE matrix:
FSDP2 holds each rank's rows of it (a DTensor sharded on dim 0). `ShardedMuon` steps such matrices so
that every rank computes exactly what one process computes:

1. the momentum buffer stays sharded: `B <- mu B + (1 - mu) G` and the Nesterov update `G + mu (B - G)`
   are elementwise, so each rank updates its own rows;
2. the update is all-gathered (`DTensor.full_tensor()`, one all-gather per matrix) and every rank runs
   torch's Newton-Schulz on the whole matrix (the same input on every rank, hence the same result: no
   broadcast; the work is repeated on each rank rather than split by matrix);
3. each rank takes its rows of the result (`distribute_tensor(..., src_data_rank=None)`: a local slice,
   no communication) and applies decoupled weight decay and the update, scaled by
   sqrt(max(1, rows / cols)) of the whole matrix's shape, to its shard.

torch.optim.Muon itself accepts DTensors (their ops run with global semantics), but then each
Newton-Schulz iteration's products and norm are computed from the shards' bfloat16 partial results,
with collectives inside the loop: on the same gradients over 2 gloo ranks its matrices after 3 steps
are up to 1.3e-3 away from one process's, where ShardedMuon's are equal bit for bit
(tests/integration/test_fsdp_muon.py). Plain (unsharded) tensors in a ShardedMuon step as
torch.optim.Muon steps them.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim._muon import (  # the math torch.optim.Muon runs
    _adjust_lr,
    _zeropower_via_newtonschulz,
)


def whole_matrix(update: torch.Tensor) -> torch.Tensor:
    """The full matrix of a sharded (DTensor) update, gathered on every rank; a plain tensor as it is."""
    return update.full_tensor() if isinstance(update, DTensor) else update


def own_rows(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full` laid out as `param` (a DTensor: its placements, sliced locally)."""
    if not isinstance(param, DTensor):
        return full
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)


class ShardedMuon(torch.optim.Muon):
    """torch.optim.Muon whose step orthogonalises each sharded matrix whole (module docstring)."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                ortho = _zeropower_via_newtonschulz(whole_matrix(update), group["ns_coefficients"],
                                                    group["ns_steps"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(own_rows(ortho, p), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


def is_sharded(params: list[torch.Tensor]) -> bool:
    """Whether any of `params` is an FSDP2 shard (a DTensor)."""
    return any(isinstance(p, DTensor) for p in params)
