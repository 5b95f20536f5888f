"""Experience: what one rollout batch becomes before the update (seed 002, section 2.3).

trajectories + rewards ──► old logprobs (only when needed), reference logprobs (only when the
KL coefficient > 0), values (gae only), per-token KL ──► advantages and returns (core).
All per-token tensors are response-aligned [N, R] (see data.batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.core.advantages import compute_advantages
from rlhfkit.core.kl import approx_kl
from rlhfkit.data.batch import TokenBatch, select_rows


@dataclass
class Experience:
    """One rollout batch ready for training. N samples, R = longest response."""

    batch: TokenBatch
    group_ids: torch.Tensor  # [N]
    rewards: torch.Tensor  # [N] scalar rewards after shaping/normalisation (before group baseline)
    advantages: torch.Tensor  # [N, R]
    returns: torch.Tensor  # [N, R]
    old_logp: torch.Tensor | None = None  # [N, R]; None = on-policy, use the current logp detached
    ref_logp: torch.Tensor | None = None  # [N, R]
    values: torch.Tensor | None = None  # [N, R]
    kl: torch.Tensor | None = None  # [N, R] per-token KL estimate (policy vs reference)

    def __len__(self) -> int:
        return self.batch.batch_size

    def select(self, rows: torch.Tensor) -> tuple[TokenBatch, dict[str, torch.Tensor | None]]:
        """Sub-batch of `rows`, with the per-token tensors trimmed to its response width."""
        mb = select_rows(self.batch, rows)
        r = mb.response_ids.shape[1]

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[rows, :r]

        return mb, {
            "advantages": cut(self.advantages),
            "returns": cut(self.returns),
            "old_logp": cut(self.old_logp),
            "ref_logp": cut(self.ref_logp),
            "values": cut(self.values),
        }


@torch.no_grad()
def batched_forward(
    fn: Callable[[TokenBatch], torch.Tensor], batch: TokenBatch, micro_batch_size: int
) -> torch.Tensor:
    """Run a response-aligned forward `fn` over `batch` in chunks; returns [N, R] float32."""
    n, r = batch.response_ids.shape
    out = torch.zeros(n, r, dtype=torch.float32)
    for start in range(0, n, micro_batch_size):
        rows = torch.arange(start, min(start + micro_batch_size, n))
        mb = select_rows(batch, rows)
        out[rows, : mb.response_ids.shape[1]] = fn(mb).float()
    return out


def make_experience(
    batch: TokenBatch,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    estimator: str,
    gamma: float,
    lam: float,
    whiten: bool | str,
    reward_clip: tuple[float, float] | None,
    kl_coef: float,
    kl_estimator: str,
    kl_in_reward: bool,
    policy_logp: Callable[[TokenBatch], torch.Tensor] | None,
    ref_logp: Callable[[TokenBatch], torch.Tensor] | None,
    values: Callable[[TokenBatch], torch.Tensor] | None,
    micro_batch_size: int,
) -> Experience:
    """Compute the experience of one rollout batch.

    `policy_logp` is None when the old-logprob forward is provably identical to the one the
    update will do (a single optimizer step per rollout batch and no KL in the reward); the
    loss then uses the current logprobs, detached, as the old ones.
    """
    old = batched_forward(policy_logp, batch, micro_batch_size) if policy_logp is not None else None
    ref = batched_forward(ref_logp, batch, micro_batch_size) if ref_logp is not None else None
    vals = batched_forward(values, batch, micro_batch_size) if values is not None else None
    kl = None
    if ref is not None and old is not None:
        kl = approx_kl(old, ref, kl_estimator) * batch.loss_mask
    advantages, returns = compute_advantages(
        estimator,
        rewards.float(),
        batch.loss_mask,
        group_ids,
        gamma=gamma,
        lam=lam,
        values=vals,
        kl=kl if kl_in_reward else None,
        kl_coef=kl_coef if kl_in_reward else 0.0,
        whiten=whiten,
        reward_clip=reward_clip,
    )
    return Experience(batch, group_ids, rewards, advantages, returns, old, ref, vals, kl)
