"""The update stage: max_epochs passes over a rollout batch's experience, in micro-batches, with an
optimizer step every `batch_size` samples (seed of OpenRLHF's PPO actor/critic training loop).

The losses are divided by the counts of the whole optimizer step (core.aggregate), so gradients do
not depend on the micro-batch size or on how many FSDP ranks share the step (or on how many
micro-batches each rank cuts from its share: the ranks run the same number of passes, padding
with `idle_pass`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.kl import approx_kl
from rlhfkit.core.losses import POLICY_LOSSES, decoupled_policy_loss, value_loss
from rlhfkit.errors import TrainingError
from rlhfkit.models import response_logprobs
from rlhfkit.models.moe import moe_top_k, record_routing, replayed, routing_loss
from rlhfkit.models.precision import autocast_ctx, to_device
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import Experience

# summed over the micro-batches of one optimizer step (the moe/ ones weighted by each micro-batch's share of it)
_PER_STEP = ("policy_loss", "value_loss", "moe/aux_loss", "moe/load_max", "moe/load_min", "moe/replay_tokens",
             "moe/routing_mismatch")


@dataclass(frozen=True)
class LossSettings:
    """The policy and value losses' settings (core.losses): the policy loss (`policy_loss`, a key of
    core.POLICY_LOSSES), clip range [1 - eps_low, 1 + eps_high], aggregation mode, entropy bonus, the
    KL loss term (`kl_estimator`, on when `kl_loss`), the critic's value clip, the sampling `temperature`
    logprobs are computed under and `max_len` (the response budget, for seq_mean_token_sum_norm).
    The losses' own options (`dual_clip` of ppo / gspo, `sapo_temperatures`, `clip_cov_*`, `kl_cov_*`,
    `vespo_*`) are fields named as the loss functions' keywords; a loss reads those its spec lists.

    Off-policy corrections (core.losses.decoupled_policy_loss, docs/algorithms.md): `is_kind` (a key
    of core.IS_KINDS, None = off) weighs each token's loss by pi_old / pi_rollout truncated to
    [`is_low`, `is_high`]; `decoupled` (AReaL's decoupled PPO) does so with the old logprobs as the
    proximal policy, untruncated unless `is_kind` is set. Both need the experience's rollout logprobs."""

    policy_loss: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    clip_cov_ratio: float = 2e-4
    clip_cov_bounds: tuple[float, float] = (1.0, 5.0)
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0
    vespo_k: tuple[float, float] = (2.0, 3.0)
    vespo_lambda: tuple[float, float] = (3.0, 2.0)
    agg: str = "token_mean"
    entropy_coef: float = 0.0
    kl_loss: bool = False
    kl_estimator: str = "k1"
    value_clip: float | None = None
    temperature: float = 1.0
    max_len: int = 1
    is_kind: str | None = None
    is_low: float = 0.5
    is_high: float = 5.0
    decoupled: bool = False
    aux_loss_coef: float = 0.0  # mixture-of-experts: x the routers' load-balancing loss (models.moe)

    @property
    def corrected(self) -> bool:
        return self.is_kind is not None or self.decoupled

    def policy_loss_call(self, generator: torch.Generator | None) -> tuple[Callable, dict]:
        """The policy loss function and its keyword arguments beyond the tensors and the counts
        (`generator`: the random draws of the losses that make them, e.g. clip_cov)."""
        spec = POLICY_LOSSES[self.policy_loss]
        values = {f.name: getattr(self, f.name) for f in fields(self)} | {"generator": generator}
        return spec.loss, dict(eps_low=self.eps_low, eps_high=self.eps_high, agg=self.agg,
                               **spec.options_from(values))


class PolicyUpdate:
    """Trains `policy` (and `critic`) on experience. `batch_size`: samples per optimizer step;
    `max_epochs`: passes per rollout batch, each in an order drawn from `shuffle_gen`; `dp`:
    (rank, world size) under FSDP, with `rank_max(n)`: the largest `n` over the ranks (a collective;
    distributed.fsdp.max_over_ranks); `compiled`: models.compile.CompiledLayers swapped in for the update;
    `routing_replay`: a mixture-of-experts policy's forward and backward route each token to the experts the
    engine recorded for it (models.moe.replay_routing; moe/replay_tokens and moe/routing_mismatch logged)."""

    def __init__(self, policy: torch.nn.Module, learner: Learner, batcher: MicroBatcher, losses: LossSettings, *,
                 batch_size: int, max_epochs: int, shuffle_gen: torch.Generator, autocast: str | None,
                 critic: torch.nn.Module | None = None, critic_learner: Learner | None = None,
                 dp: tuple[int, int] = (0, 1), rank_max: Callable[[int], int] | None = None, compiled=None,
                 routing_replay: bool = False):
        if dp[1] > 1 and rank_max is None:
            raise TrainingError(f"{dp[1]} ranks share the update: PolicyUpdate needs rank_max "
                                "(distributed.fsdp.max_over_ranks) to agree on the micro-batch count")
        self.policy, self.learner, self.batcher, self.losses = policy, learner, batcher, losses
        self.batch_size, self.max_epochs = batch_size, max_epochs
        self.shuffle_gen, self.autocast = shuffle_gen, autocast
        self.critic, self.critic_learner, self.dp, self.compiled = critic, critic_learner, dp, compiled
        self.rank_max = rank_max
        self.device_type = next(policy.parameters()).device.type
        self.moe = moe_top_k(policy) is not None  # record its routers: load metrics and the aux loss
        self.routing_replay = routing_replay and self.moe
        # The policy loss's own random draws (clip_cov), apart from the shuffle so ranks keep one order.
        self.loss_gen = torch.Generator().manual_seed(shuffle_gen.initial_seed())

    def __call__(self, exp: Experience, kl_coef: float, train_actor: bool = True) -> dict[str, float]:
        """The update's metrics: per-step quantities averaged over optimizer steps, per-token ones
        over all tokens seen. Without `train_actor` (the critic's warm-up) only the critic is trained:
        the policy runs no pass and its Learner does not step."""
        if not train_actor and self.critic is None:
            raise TrainingError("the actor is frozen for the critic's warm-up, and this run has no critic to train")
        sums: dict[str, float] = {}
        self.policy.train()
        layout = self.batcher.layout(exp.batch)
        with self.compiled.active() if self.compiled is not None else contextlib.nullcontext():
            n_opt = self.optimizer_steps(exp, layout, kl_coef, sums, train_actor)
        sums = read_once(sums)
        total_tokens = max(int(exp.batch.loss_mask.sum()) * self.max_epochs, 1)
        computed = sums.pop("train_tokens", 0.0)
        idle = sums.pop("idle_passes", None)
        out = {k: v / (n_opt if k in _PER_STEP or k.startswith(("actor/", "critic/")) else total_tokens)
               for k, v in sums.items() if k not in _MAXIMA}
        out.update({k: sums[k] for k in _MAXIMA if k in sums})
        out["optimizer_steps"] = float(n_opt)
        out["train_tokens"] = computed  # tokens the forward/backward ran on (no padding; shared prompts once)
        if idle is not None:  # under FSDP: the passes this rank ran to match another rank's micro-batch count
            out["idle_passes"] = idle
        out["sample_tokens"] = float(exp.batch.attention_mask.sum()) * self.max_epochs  # prompt + response
        out["response_tokens"] = float(exp.batch.response_mask.sum()) * self.max_epochs
        return out

    def optimizer_steps(self, exp: Experience, layout, kl_coef: float, sums: dict[str, float],
                        train_actor: bool = True) -> int:
        """The update's optimizer steps; metric sums added to `sums` (the micro-batches' as float64 tensors on
        the device, read once by the caller). Returns how many ran."""
        micro = self.micro_step if train_actor else self.critic_step
        n_opt = 0
        for _ in range(self.max_epochs):
            for step_rows in self.step_rows(exp):
                step_mask = exp.batch.loss_mask[step_rows]
                # at least 1: a step whose samples all train on nothing (all truncated and masked) adds 0, not 0/0
                counts = dict(num_tokens=max(int(step_mask.sum()), 1), num_seqs=max(int(step_mask.any(dim=1).sum()), 1),
                              max_len=self.losses.max_len)
                mine = self.batcher.rank_share(step_rows, exp.group_ids, *self.dp)  # counts stay the whole step's
                cuts = self.batcher.cut(exp.batch, exp.group_ids, mine) if len(mine) else []
                # Under FSDP every forward/backward is a collective: a rank with fewer micro-batches
                # than another (token budgets, unequal shares) pads with passes that add nothing.
                idle = self.rank_max(len(cuts)) - len(cuts) if self.dp[1] > 1 else 0
                # One autocast region per optimizer step: its cache keeps the bf16 copies of the
                # weights for every micro-batch instead of casting them again in each.
                with autocast_ctx(self.autocast, self.device_type):
                    for rows in cuts:
                        _add(sums, micro(exp, rows, layout, kl_coef, counts))
                    if idle:
                        shortest = step_rows[exp.batch.attention_mask[step_rows].sum(dim=1).argmin()].view(1)
                        for _ in range(idle):
                            self.idle_pass(exp, shortest, layout, train_actor)
                if self.dp[1] > 1:
                    _add(sums, {"idle_passes": float(idle)})
                if train_actor:
                    _add(sums, self.learner.step(), "actor/")
                if self.critic_learner is not None:
                    _add(sums, self.critic_learner.step(), "critic/")
                n_opt += 1
        return n_opt

    def step_rows(self, exp: Experience) -> list[torch.Tensor]:
        """The rows of each optimizer step of one epoch: `batch_size` samples in a random order. An agent
        episode split into segments (`exp.episodes`) is one sample: all its segments go into the same
        step, so a rollout runs the planned optimizer steps however many segments its episodes made
        (and with one row per episode the steps are the per-row ones)."""
        if exp.episodes is None:
            perm = torch.randperm(len(exp), generator=self.shuffle_gen)
            return [perm[s : s + self.batch_size] for s in range(0, len(exp), self.batch_size)]
        _, episode = torch.unique(exp.episodes, return_inverse=True)
        n = int(episode.max()) + 1
        perm = torch.randperm(n, generator=self.shuffle_gen)
        place = torch.empty_like(perm)
        place[perm] = torch.arange(n)
        key = place[episode]  # each row's episode's place in the shuffled order
        order = torch.argsort(key, stable=True)
        bounds = torch.searchsorted(key[order], torch.arange(0, n + self.batch_size, self.batch_size)).tolist()
        return [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]

    def micro_step(self, exp: Experience, rows: torch.Tensor, layout, kl_coef: float, counts: dict) -> dict:
        """Forward + backward of one micro-batch. Returns token-weighted metric sums: detached tensors
        on the policy's device (no host sync per micro-batch; `read_once` reads the update's sums). With
        routing replay the backward runs inside the replay too (checkpointing routes again there)."""
        part = exp.select(rows, layout)
        share = len(rows) / max(counts["num_seqs"], 1)  # the micro-batch's share of the step's rows (moe/ metrics)
        with replayed(self.policy, part.batch, self.routing_replay) as (mb, replay):
            loss, out = self.policy_loss(part, mb, kl_coef, counts, share)
            if replay is not None:
                out.update({k: v * share for k, v in replay.metrics().items()})
            elif self.routing_replay:  # a batch without recorded experts: nothing replayed
                out["moe/replay_tokens"] = 0.0
            self.learner.backward(loss)
        if self.critic is not None:
            out["value_loss"] = self.value_backward(mb, part, counts)
        return out

    def policy_loss(self, part, mb, kl_coef: float, counts: dict, share: float) -> tuple[torch.Tensor, dict]:
        """The policy's loss on micro-batch `mb` (the layout of `part`, the micro-batch's experience) and
        its metric sums; `share`: the micro-batch's share of the step's rows (the aux loss's weight)."""
        c = self.losses
        mask = mb.loss_mask
        with record_routing(self.policy) if self.moe else contextlib.nullcontext() as routing:
            logp, entropy = response_logprobs(self.policy, mb, temperature=c.temperature, with_entropy=True,
                                              entropy_grad=bool(c.entropy_coef))
        logp = logp.float()
        if logp.device != mask.device:  # the policy sits on a GPU: bring the micro-batch's tensors to it
            mask = to_device(mask, logp.device)
            part = part.to(logp.device)
        old = part.old_logp if part.old_logp is not None else logp.detach()
        rollout = part.rollout_logp
        loss_fn, kw = c.policy_loss_call(self.loss_gen)
        if c.corrected:
            if rollout is None:
                raise TrainingError("the IS / decoupled correction needs the engine's logprobs of each token, and "
                                    "these trajectories carry none")
            loss, pm = decoupled_policy_loss(logp, old, rollout, part.advantages, mask, is_kind=c.is_kind,
                                             is_low=c.is_low, is_high=c.is_high, loss=loss_fn, **kw, **counts)
        else:
            loss, pm = loss_fn(logp, old, part.advantages, mask, **kw, **counts)
        ntok = mask.sum().double()  # the token-weighted sums in float64, the precision they are summed in
        out = {"train_tokens": float(mb.num_tokens), "policy_loss": loss.detach(),  # num_tokens: CPU-side
               "clip_frac": pm["clip_frac"] * ntok, "ppo_kl": pm["approx_kl"] * ntok,
               "entropy": (entropy.detach().float() * mask).sum()}
        if rollout is not None:
            out.update(_gap_metrics(old, rollout, mask, pm if c.corrected else None))
        if c.entropy_coef:
            loss = loss - c.entropy_coef * aggregate_loss(entropy.float(), mask, c.agg, **counts)
        if c.kl_loss and part.ref_logp is not None:
            kl = approx_kl(logp, part.ref_logp, c.kl_estimator)
            loss = loss + kl_coef * aggregate_loss(kl, mask, c.agg, **counts)
            out["kl_loss"] = (kl.detach() * mask).sum()
        if routing is not None:  # OpenRLHF adds the aux loss per micro-batch: here its share of the step's rows
            aux, moe_metrics = routing_loss(routing)
            if c.aux_loss_coef:
                loss = loss + c.aux_loss_coef * share * aux.to(loss.device)
            out.update({k: v.to(logp.device) * share for k, v in moe_metrics.items()})
        return loss, out

    def critic_step(self, exp: Experience, rows: torch.Tensor, layout, kl_coef: float, counts: dict) -> dict:
        """`micro_step` of the critic alone (the actor frozen for the critic's warm-up)."""
        part = exp.select(rows, layout)
        return {"train_tokens": float(part.batch.num_tokens),
                "value_loss": self.value_backward(part.batch, part, counts)}

    def value_backward(self, mb, part, counts: dict) -> torch.Tensor:
        """The critic's value loss on micro-batch `mb` against the targets of `part` (values, returns),
        backward into the critic's Learner; returned detached."""
        v = self.critic.response_values(mb).float()
        if part.values.device != v.device:
            part = part.to(v.device)
        vloss, _ = value_loss(v, part.values, part.returns, to_device(mb.loss_mask, v.device),
                              clip=self.losses.value_clip, agg=self.losses.agg, **counts)
        self.critic_learner.backward(vloss)
        return vloss.detach()

    def idle_pass(self, exp: Experience, rows: torch.Tensor, layout, train_actor: bool = True) -> None:
        """A forward/backward of the policy (unless frozen: `train_actor` False) and critic on `rows` (the
        step's shortest row) whose gradients are zero: the FSDP collectives of one micro-batch, without
        changing the step."""
        mb = exp.select(rows, layout).batch
        if train_actor:
            logp, _ = response_logprobs(self.policy, mb, temperature=self.losses.temperature)
            self.learner.backward(logp.float().sum() * 0.0)
        if self.critic is not None:
            self.critic_learner.backward(self.critic.response_values(mb).float().sum() * 0.0)

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict(), "loss_gen": self.loss_gen.get_state(),
                "critic_learner": self.critic_learner.state_dict() if self.critic_learner is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])
        if "loss_gen" in state:
            self.loss_gen.set_state(state["loss_gen"])
        if self.critic_learner is not None:
            self.critic_learner.load_state_dict(state["critic_learner"])


_MAXIMA = ("rollout/logprob_gap_max",)  # maxed, not summed, over micro-batches


def _gap_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, pm: dict | None) -> dict:
    """|rollout - trainer| logprob gap over the action tokens (`old` [b, r]: the old logprobs, or the
    current ones on the update's only pass), token-weighted sums; with a correction (`pm`: its
    metrics), the share of tokens whose weight was truncated (clamped or zeroed). Detached tensors."""
    gap = (rollout.float() - old.float()).abs() * mask
    out = {"rollout/logprob_gap_mean": gap.sum(), "rollout/logprob_gap_max": gap.max()}
    if pm is not None:
        truncated = pm.get("is_clip_frac", pm.get("is_zeroed_frac"))
        ntok = mask.sum().double()
        out["rollout/is_clipped_frac"] = 0.0 if truncated is None else truncated * ntok
        out["rollout/behav_weight_mean"] = pm["behav_weight_mean"] * ntok
    return out


def _add(sums: dict, metrics: dict, prefix: str = "") -> None:
    """Add `metrics` (floats or tensors) into `sums` (maxima kept for `_MAXIMA`), without reading a tensor;
    tensors are summed in float64, as Python floats would be, so a sum does not depend on where it is kept."""
    for k, v in metrics.items():
        key = prefix + k
        v = v.detach().double() if torch.is_tensor(v) else v
        if key not in sums:
            sums[key] = v
        elif key in _MAXIMA:
            both = torch.is_tensor(sums[key]) and torch.is_tensor(v)
            sums[key] = torch.maximum(sums[key], v) if both else max(float(sums[key]), float(v))
        else:
            sums[key] = sums[key] + v


def read_once(sums: dict) -> dict[str, float]:
    """`sums` as floats, its tensors read back in one transfer (the update's only read of the
    micro-batches' metrics: on CUDA each read waits for the device)."""
    keys = [k for k, v in sums.items() if torch.is_tensor(v)]
    out = {k: float(v) for k, v in sums.items() if not torch.is_tensor(v)}
    if keys:
        device = sums[keys[0]].device
        values = torch.stack([sums[k].detach().double().reshape(()).to(device) for k in keys]).tolist()
        out.update(zip(keys, values, strict=True))
    return out
