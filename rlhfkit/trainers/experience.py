"""Experience: what one rollout batch becomes before the update (seed 002, section 2.3).

trajectories + rewards ──► old logprobs (only when needed), reference logprobs (only when the
KL coefficient > 0), values (gae only), per-token KL ──► advantages and returns (core).
All per-token tensors are response-aligned [N, R] (see data.batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlhfkit.core.advantages import compute_advantages
from rlhfkit.core.kl import approx_kl
from rlhfkit.data.batch import TokenBatch, select_rows

Layout = Callable[[TokenBatch, torch.Tensor], object]  # (batch, rows) -> a batch of any layout (data.packing)


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

    def select(self, rows: torch.Tensor, layout: Layout = select_rows):
        """Sub-batch of `rows` in `layout` (padded rows by default), with the per-token tensors
        trimmed to its response width."""
        mb = layout(self.batch, rows)
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
def forward_passes(
    fns: dict[str, Callable | None], batch: TokenBatch, chunks: Sequence[torch.Tensor], layout: Layout = select_rows
) -> dict[str, torch.Tensor | None]:
    """Run every response-aligned forward of `fns` (None = skipped) over `batch`, one micro-batch
    (`chunks`: row indices) at a time: each micro-batch is laid out once and fed to all of them
    (old policy, reference, critic). Returns {name: [N, R] float32 or None}."""
    live = {k: f for k, f in fns.items() if f is not None}
    n, r = batch.response_ids.shape
    out = {k: torch.zeros(n, r, dtype=torch.float32) for k in live}
    for rows in chunks if live else ():
        mb = layout(batch, rows)
        for k, f in live.items():
            out[k][rows, : mb.response_ids.shape[1]] = f(mb).float().cpu()
    return {k: out.get(k) for k in fns}


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
    chunks: Sequence[torch.Tensor],
    layout: Layout = select_rows,
) -> Experience:
    """Compute the experience of one rollout batch.

    `policy_logp` is None when the old-logprob forward is provably identical to the one the
    update will do (a single optimizer step per rollout batch and no KL in the reward); the
    loss then uses the current logprobs, detached, as the old ones. The three forwards share
    their micro-batches (`chunks` of row indices, laid out by `layout`).
    """
    passes = forward_passes({"old": policy_logp, "ref": ref_logp, "values": values}, batch, chunks, layout)
    old, ref, vals = passes["old"], passes["ref"], passes["values"]
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
