"""The experience stage: what one rollout batch becomes before the update.

trajectories + rewards ──► old logprobs (only when needed), reference logprobs (only when the
KL coefficient > 0), values (critic estimators only), per-token KL ──► advantages and returns
(rlhfkit.core). All per-token tensors are response-aligned [N, R] (see data.batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlhfkit.agents.executor import episode_rows
from rlhfkit.core.advantages import Whiten, compute_advantages
from rlhfkit.core.kl import approx_kl
from rlhfkit.data.batch import TokenBatch, collate, pad_response_values, select_rows
from rlhfkit.data.types import Trajectory
from rlhfkit.models import response_logprobs
from rlhfkit.models.moe import moe_top_k, note_unrecorded, replayed
from rlhfkit.models.precision import autocast_ctx, on_device, to_device
from rlhfkit.trainers.rl.batching import MicroBatcher

Layout = Callable[[TokenBatch, torch.Tensor], object]  # (batch, rows) -> a batch of any layout (data.packing)


@dataclass(frozen=True)
class MicroBatch:
    """The rows of an `Experience` that one forward/backward of the update trains on: `batch` in the
    update's layout (padded rows or a packed row), the per-token tensors [b, r] cut to its response
    width (r); None where the experience has none."""

    batch: object
    advantages: torch.Tensor
    returns: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    values: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None

    def to(self, device: torch.device) -> MicroBatch:
        """The per-token tensors on `device` (the batch stays where it is: the forward moves it)."""
        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else to_device(x, device)

        return dataclasses.replace(self, **{f: move(getattr(self, f)) for f in _PER_TOKEN})


_PER_TOKEN = tuple(f.name for f in dataclasses.fields(MicroBatch) if f.name != "batch")


@dataclass
class Experience:
    """One rollout batch ready for training. N samples, R = longest response.

    Tensors live on `device` (the CPU today: the trainer moves each micro-batch to the policy)."""

    batch: TokenBatch
    group_ids: torch.Tensor  # [N]
    rewards: torch.Tensor  # [N] scalar rewards after shaping/normalisation (before group baseline)
    advantages: torch.Tensor  # [N, R]
    returns: torch.Tensor  # [N, R]
    old_logp: torch.Tensor | None = None  # [N, R]; None = on-policy, use the current logp detached
    ref_logp: torch.Tensor | None = None  # [N, R]
    values: torch.Tensor | None = None  # [N, R]
    kl: torch.Tensor | None = None  # [N, R] per-token KL estimate (policy vs reference)
    rollout_logp: torch.Tensor | None = None  # [N, R] the engine's logprob of each token (0 off the mask)
    versions: torch.Tensor | None = None  # [N] the oldest policy version among each sample's tokens
    token_versions: torch.Tensor | None = None  # [N, R] the version that produced each token (-1 past the end)
    token_rewards: torch.Tensor | None = None  # [N, R] per-token (process) rewards that went into advantages
    episodes: torch.Tensor | None = None  # [N] episode of each row when agent episodes were split into segments

    def __len__(self) -> int:
        return self.batch.batch_size

    @property
    def device(self) -> torch.device:
        return self.batch.input_ids.device

    def select(self, rows: torch.Tensor, layout: Layout = select_rows) -> MicroBatch:
        """The micro-batch of `rows` in `layout` (padded rows by default), with the per-token tensors
        trimmed to its response width."""
        mb = layout(self.batch, rows)
        r = mb.response_ids.shape[1]

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[rows, :r]

        return MicroBatch(mb, **{k: cut(getattr(self, k)) for k in _PER_TOKEN})


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
    whiten: Whiten,
    reward_clip: tuple[float, float] | None,
    kl_coef: float,
    kl_estimator: str,
    kl_in_reward: bool,
    policy_logp: Callable[[TokenBatch], torch.Tensor] | None,
    ref_logp: Callable[[TokenBatch], torch.Tensor] | None,
    values: Callable[[TokenBatch], torch.Tensor] | None,
    chunks: Sequence[torch.Tensor],
    layout: Layout = select_rows,
    token_rewards: torch.Tensor | None = None,
    episode_ids: torch.Tensor | None = None,
) -> Experience:
    """Compute the experience of one rollout batch.

    `policy_logp` is None when the old-logprob forward is provably identical to the one the
    update will do (a single optimizer step per rollout batch and no KL in the reward); the
    loss then uses the current logprobs, detached, as the old ones. The three forwards share
    their micro-batches (`chunks` of row indices, laid out by `layout`). `token_rewards` [N, R]:
    per-token rewards added to the scalar's (core.compute_advantages' dense_rewards). `episode_ids` [N]:
    segments of one agent episode share its advantage (core.compute_advantages).
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
        dense_rewards=token_rewards,
        episode_ids=episode_ids,
    )
    return Experience(batch, group_ids, rewards, advantages, returns, old, ref, vals, kl, token_rewards=token_rewards,
                      episodes=episode_ids)


def episode_ids(trajs: list[Trajectory]) -> torch.Tensor | None:
    """[N] episode of each trajectory when some are segments of one agent episode (info["episode"],
    set by the endpoint's agent runner and by segmented tool episodes; rows without one are their own),
    else None (agents.executor.episode_rows)."""
    rows = episode_rows(trajs)
    return None if rows is None else torch.tensor(rows[1], dtype=torch.long)


class ExperienceMaker:
    """Trajectories and their rewards -> `Experience`, with the forwards it needs in one autocast
    region (`autocast`: "bfloat16" or None; the policy's bf16 weight casts are reused across
    micro-batches).

    policy, ref, critic: the modules (ref None: no KL; critic None: no values). `estimator`, `gamma`,
    `lam`, `whiten`, `reward_clip`: core.compute_advantages' arguments. `kl_estimator`; `kl_in_reward`:
    the KL is a per-token reward penalty (PPO style) rather than a loss term. `multi_step`: more than
    one optimizer step per rollout batch, so the old logprobs must be computed before the first one.
    `temperature`: the sampling temperature the logprobs are computed under. `proximal`: the old
    logprobs are computed even for a single step, as decoupled PPO's proximal policy (the trainer's
    weights before the update, apart from the engine's behaviour logprobs). `ref` may be the policy
    itself (a peft LoRA model): its reference pass runs with the adapters disabled (the base weights,
    no second copy). `ref_device`: with --ref.offload the reference waits on the CPU and moves to this
    device for the experience stage (None: it stays where it is). `routing_replay`: a mixture-of-experts
    policy's old-logprob pass (and the reference's when it is the policy itself) routes each token to the
    experts the engine recorded for it (models.moe.replay_routing); the batch keeps them for the update.
    Experience tensors stay on the CPU; the forwards run on the models' device."""

    def __init__(self, policy: torch.nn.Module, ref: torch.nn.Module | None, critic: torch.nn.Module | None,
                 batcher: MicroBatcher, *, estimator: str, gamma: float, lam: float, whiten: Whiten,
                 reward_clip: tuple[float, float] | None, kl_estimator: str, kl_in_reward: bool, multi_step: bool,
                 temperature: float, autocast: str | None, proximal: bool = False,
                 ref_device: torch.device | None = None, mask_truncated: bool = False, routing_replay: bool = False):
        self.policy, self.ref, self.critic, self.batcher = policy, ref, critic, batcher
        self.ref_device = ref_device
        self.estimator, self.gamma, self.lam, self.whiten, self.reward_clip = estimator, gamma, lam, whiten, reward_clip
        self.kl_estimator, self.kl_in_reward, self.multi_step = kl_estimator, kl_in_reward, multi_step
        self.temperature, self.autocast, self.proximal = temperature, autocast, proximal
        self.mask_truncated = mask_truncated
        self.routing_replay = routing_replay and moe_top_k(policy) is not None  # a dense policy: nothing to replay

    def __call__(self, trajs: list[Trajectory], rewards: torch.Tensor, kl_coef: float,
                 token_rewards: torch.Tensor | None = None) -> Experience:
        """`trajs` [N] with `rewards` [N] (and `token_rewards` [N, R'] or None); `kl_coef` of this step."""
        batch = collate(trajs, self.batcher.pad_id)
        if self.routing_replay:
            note_unrecorded(batch.experts)
        elif batch.experts is not None:
            batch = dataclasses.replace(batch, experts=None)
        group_ids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
        r = batch.response_ids.shape[1]
        if token_rewards is not None:
            token_rewards = torch.nn.functional.pad(token_rewards.float(), (0, r - token_rewards.shape[1]))[:, :r]
        kl_in_reward = kl_coef > 0 and self.kl_in_reward
        device_type = next(self.policy.parameters()).device.type
        offloaded = self.ref if self.ref is not self.policy and kl_coef > 0 else None
        with autocast_ctx(self.autocast, device_type), on_device(offloaded, self.ref_device):
            exp = make_experience(
                batch, rewards, group_ids, estimator=self.estimator, gamma=self.gamma, lam=self.lam,
                whiten=self.whiten, reward_clip=self.reward_clip, kl_coef=kl_coef, kl_estimator=self.kl_estimator,
                kl_in_reward=kl_in_reward,
                policy_logp=self.logp_of(self.policy) if self.multi_step or kl_in_reward or self.proximal else None,
                ref_logp=self.ref_logp if self.ref is not None and kl_coef > 0 else None,
                values=self.values if self.critic is not None else None,
                chunks=self.batcher.cut(batch, group_ids, torch.arange(len(trajs))), layout=self.batcher.layout(batch),
                token_rewards=token_rewards, episode_ids=episode_ids(trajs),
            )
        per_token = [t.versions if t.versions is not None else torch.full((t.response_length,), t.version)
                     for t in trajs]
        exp = dataclasses.replace(exp, rollout_logp=pad_response_values([t.logprobs for t in trajs], r),
                                  versions=torch.tensor([t.version for t in trajs], dtype=torch.long),
                                  token_versions=pad_response_values(per_token, r, fill=-1.0).long())
        if self.mask_truncated:  # after the advantages: a truncated sample still counts in its group's baseline
            cut = torch.tensor([t.truncated for t in trajs], dtype=torch.bool)
            exp = dataclasses.replace(exp, batch=dataclasses.replace(
                exp.batch, loss_mask=exp.batch.loss_mask & ~cut.unsqueeze(1)))
        return exp

    def logp_of(self, model: torch.nn.Module, replay: bool = True) -> Callable[[TokenBatch], torch.Tensor]:
        """The logprob pass of `model`; with `replay` and --actor.routing_replay, under the recorded routing."""
        def fn(mb: TokenBatch) -> torch.Tensor:
            with replayed(model, mb, replay and self.routing_replay) as (run, _):
                return response_logprobs(model, run, temperature=self.temperature)[0].to(mb.input_ids.device)
        return fn

    def ref_logp(self, mb: TokenBatch) -> torch.Tensor:
        """The reference's logprobs [B, R]; the policy itself as reference: with its adapters disabled."""
        base = self.policy.disable_adapter() if self.ref is self.policy else contextlib.nullcontext()
        with base:
            return self.logp_of(self.ref, replay=self.ref is self.policy)(mb)

    def values(self, mb: TokenBatch) -> torch.Tensor:
        return self.critic.response_values(mb).to(mb.input_ids.device)
