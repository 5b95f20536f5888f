"""The RL loop in the shape of seed article 002:

    for episode in episodes:
        for rollout batch (rollout.batch_size prompts x n_samples_per_prompt):
            generate ─► reward ─► experience (old/ref logprobs, values, KL, advantages)
            ─► replay buffer ─► max_epochs passes in micro-batches, an optimizer step every
               train.batch_size samples ─► weight sync to the engine (version + 1)

Every stage has a timer; the math lives in rlhfkit.core, the optimizer in `Learner`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlhfkit.agents.executor import SingleTurnExecutor, TokenBudget, agent_rewards, drift_count
from rlhfkit.config.rl import GROUP_ESTIMATORS, BatchPlan, RLConfig
from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.kl import AdaptiveKLController, FixedKLController, approx_kl
from rlhfkit.core.losses import policy_loss, value_loss
from rlhfkit.core.shaping import overlong_penalty
from rlhfkit.data.batch import TokenBatch, collate, select_rows
from rlhfkit.data.packing import micro_batches, pack_shared_prefix
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import CheckpointError, DataError, TrainingError
from rlhfkit.models import response_logprobs, save_hf_folder
from rlhfkit.models.compile import CompiledLayers
from rlhfkit.models.precision import autocast_ctx
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.base import GenerationEngine, SamplingParams
from rlhfkit.core.filtering import keep_groups_in_range
from rlhfkit.trainers.experience import Experience, make_experience
from rlhfkit.trainers.learner import Learner

RewardFn = Callable[..., RewardOutput]
_PER_STEP = ("policy_loss", "value_loss")  # summed over the micro-batches of one optimizer step
# Shortest row of the shared-prefix layout: a row holds one prompt and responses up to this many
# tokens (or the longest sample). Its attention is dense over the row, so rows stay short.
SHARED_ROW_TOKENS = 512


@dataclass
class PromptItem:
    """A tokenized prompt of the dataset."""

    text: str
    ids: list[int]
    label: object = None


class RunningMoments:
    """Running mean and std of rewards (Welford/Chan merge), for --reward.normalize."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, x: torch.Tensor) -> None:
        n = x.numel()
        if n == 0:
            return
        mean, var = float(x.mean()), float(x.var(unbiased=False))
        delta, total = mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += var * n + delta**2 * self.count * n / total
        self.count = total

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = state["count"], state["mean"], state["m2"]

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 0 else 1.0


@dataclass
class StepTimer:
    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


class RLTrainer:
    """Runs `cfg` with the given components. Build them with `rlhfkit.trainers.build`."""

    def __init__(
        self,
        cfg: RLConfig,
        plan: BatchPlan,
        policy: torch.nn.Module,
        tokenizer,
        engine: GenerationEngine,
        reward_fn: RewardFn,
        prompts: Sequence[PromptItem],
        ref: torch.nn.Module | None = None,
        critic: torch.nn.Module | None = None,
        tracker=None,
        callbacks: Sequence[Callable[[RLTrainer, int, dict], None]] = (),
        executor=None,
    ):
        self.cfg, self.plan = cfg, plan
        self.policy, self.tokenizer, self.engine = policy, tokenizer, engine
        self.reward_fn, self.prompts = reward_fn, list(prompts)
        self.ref, self.critic, self.tracker = ref, critic, tracker
        self.callbacks = list(callbacks)
        self.executor = executor or SingleTurnExecutor()
        r, g = cfg.rollout, cfg.agent
        multi = self.executor.provides_rewards
        self.budget = TokenBudget(r.max_new_tokens, (g.max_response_tokens or r.max_new_tokens * g.max_turns)
                                  if multi else r.max_new_tokens, g.max_turns if multi else 1)
        t = cfg.train
        self.sample_gen = torch.Generator().manual_seed(t.seed)
        self.shuffle_gen = torch.Generator().manual_seed(t.seed + 1)
        self.rollouts_per_episode = len(self.prompts) // cfg.rollout.batch_size
        if self.rollouts_per_episode == 0:
            raise DataError(
                f"the prompt dataset has {len(self.prompts)} usable prompts, fewer than "
                f"--rollout.batch_size {cfg.rollout.batch_size}; lower the batch size or add prompts"
            )
        self.total_steps = self.rollouts_per_episode * t.num_episodes
        if t.max_steps is not None:
            self.total_steps = min(self.total_steps, t.max_steps)
        a = cfg.actor
        opt_steps = self.total_steps * plan.optimizer_steps_per_rollout
        self.learner = Learner(
            policy, a.adam.lr, a.adam.betas, a.adam.eps, a.adam.weight_decay, total_steps=opt_steps,
            warmup_steps=int(a.lr_warmup_ratio * opt_steps), scheduler=a.lr_scheduler,
            min_lr_ratio=a.min_lr_ratio, max_norm=a.max_norm, ema_beta=a.ema_beta,
            max_consecutive_skips=t.max_skipped_steps,
        )
        self.compiled = CompiledLayers(policy) if t.compile_enable else None
        self.critic_learner = None
        if critic is not None:
            c = cfg.critic
            self.critic_learner = Learner(
                critic, c.adam.lr, c.adam.betas, c.adam.eps, c.adam.weight_decay, total_steps=opt_steps,
                warmup_steps=int(a.lr_warmup_ratio * opt_steps), scheduler=a.lr_scheduler,
                min_lr_ratio=a.min_lr_ratio, max_norm=c.max_norm, max_consecutive_skips=t.max_skipped_steps,
                name="critic",
            )
        k = cfg.algo.kl
        self.kl_ctl = (
            AdaptiveKLController(k.init_coef, k.target, k.horizon) if k.target is not None
            else FixedKLController(k.init_coef)
        )
        self.reward_moments = RunningMoments()
        # async runs (rlhfkit.distributed.fit_async): rollouts generated ahead, taken by generate()
        self.pipeline = None
        self.step = 0
        self.dp = (0, 1)  # (rank, world size): under FSDP each rank updates on its share of every step's rows
        # data position: the episode, its shuffled prompt order, the next rollout batch in it
        self.episode, self.order, self.index = 0, None, 0

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict]:
        """Train from the current data position (the start, or where a checkpoint left off)."""
        history = []
        stream = self.prompt_stream()  # dynamic sampling tops batches up from the same stream
        while self.step < self.total_steps:
            episode = self.episode
            batch = list(itertools.islice(stream, self.cfg.rollout.batch_size))
            if not batch:
                break  # dynamic sampling used up the prompts of every episode
            metrics = self.train_step(batch, stream)
            metrics["episode"] = episode
            history.append(metrics)
            for cb in self.callbacks:
                cb(self, self.step, metrics)
        return history

    def prompt_stream(self) -> Iterator[PromptItem]:
        """The prompts in training order: each episode a fresh shuffle, cut to whole rollout
        batches. Lazy: the data position (episode, order, index) moves one prompt per item
        consumed, so a checkpoint taken between steps resumes the stream exactly."""
        while (prompt := self.next_prompt()) is not None:
            yield prompt

    def next_prompt(self) -> PromptItem | None:
        n = self.rollouts_per_episode * self.cfg.rollout.batch_size
        if self.episode >= self.cfg.train.num_episodes:
            return None
        if self.order is None:
            self.order = torch.randperm(len(self.prompts), generator=self.shuffle_gen).tolist()[:n]
        prompt = self.prompts[self.order[self.index]]
        self.index += 1
        if self.index == len(self.order):
            self.episode, self.order, self.index = self.episode + 1, None, 0
        return prompt

    def train_step(self, prompts: Sequence[PromptItem], more: Iterator[PromptItem] | None = None) -> dict[str, float]:
        """One RL step: rollout (+ DAPO top-up from `more`), reward, experience, update, weight sync."""
        timer, more = StepTimer(), more if more is not None else iter(())
        t_start = time.perf_counter()
        prompts, trajs, rewards, metrics = self.rollout(prompts, more, timer)
        metrics.update(self.check_staleness(trajs))
        n_tokens = metrics.pop("generated_tokens")
        if trajs:
            # one autocast region for all its forwards: the policy's bf16 weight casts are reused
            with timer("experience"), autocast_ctx(self.cfg.actor.autocast):
                exp = self.make_experience(trajs, rewards)
            with timer("update"):
                metrics.update(self.update(exp))
            metrics.update(self.experience_metrics(exp, trajs))
            self.kl_ctl.update(metrics.get("kl", 0.0), len(trajs))
            self.log_samples(prompts, trajs, exp)
        self.step += 1
        self.engine.update_weights({}, self.engine.version + 1)
        metrics.update({f"time/{k}": v for k, v in timer.times.items()})
        metrics["time/step"] = time.perf_counter() - t_start
        metrics["rollout_tokens_per_s"] = n_tokens / max(timer.times.get("generate", 1e-9), 1e-9)
        metrics["kl_coef"] = self.kl_ctl.value
        if self.tracker is not None:
            self.tracker.log(self.step, metrics)
        return metrics

    # ------------------------------------------------------------------ stages
    def rollout(self, prompts: Sequence[PromptItem], more: Iterator[PromptItem], timer: StepTimer):
        """generate -> reward -> DAPO filter; with --algo.dynamic_filtering_enable, new prompts from
        `more` replace dropped groups until rollout.batch_size groups are accepted (accepted groups
        are never discarded: when `more` or the rounds run out, the batch trains as filled).
        Returns (prompts, kept trajectories, their rewards, metrics); group_id indexes prompts."""
        a, want = self.cfg.algo, self.cfg.rollout.batch_size
        all_prompts: list[PromptItem] = []
        kept, kept_rewards, all_scores = [], [], []
        metrics: dict[str, float] = {"filtered_groups": 0.0, "generated_tokens": 0.0, "drift_frac": 0.0}
        for rounds in range(1, a.dynamic_filtering_max_rounds + 1):
            with timer("generate"):
                trajs = self.generate(prompts)
            with timer("reward"):
                rewards, scores, reward_metrics = self.score(prompts, trajs)
            metrics = {**reward_metrics, **metrics} if rounds == 1 else metrics
            metrics["generated_tokens"] += sum(t.response_length for t in trajs)
            metrics["drift_frac"] += drift_count(trajs, self.tokenizer)
            all_scores.append(scores)
            trajs, rewards, scores, dropped = self.filter_groups(trajs, rewards, scores)
            metrics["filtered_groups"] += dropped
            for t in trajs:
                t.group_id += len(all_prompts)
            all_prompts += prompts
            kept += trajs
            kept_rewards.append(rewards)
            need = want - len({t.group_id for t in kept})
            if not a.dynamic_filtering_enable or need <= 0 or rounds == a.dynamic_filtering_max_rounds:
                break  # (never draw prompts a round will not use: they would be lost)
            prompts = list(itertools.islice(more, need))
            if not prompts:
                break
        scores = torch.cat(all_scores)
        metrics.update(score=float(scores.mean()), dynamic_rounds=float(rounds),
                       drift_frac=metrics["drift_frac"] / scores.numel())
        return all_prompts, kept, torch.cat(kept_rewards), metrics

    def sampling_params(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            n=r.n_samples_per_prompt, stop_token_ids=tuple(r.stop_token_ids),
        )

    def prompt_seeds(self, count: int) -> list[int]:
        """One sampling seed per prompt from sample_gen: samples do not depend on how an engine pool
        shards the prompts, and a re-issued prompt regenerates the same samples."""
        return torch.randint(0, 2**62, (count,), generator=self.sample_gen).tolist()

    def generate(self, prompts: Sequence[PromptItem]) -> list[Trajectory]:
        if self.pipeline is not None:  # async: generated ahead (stale groups re-issued there)
            return self.pipeline.take(self, prompts)
        params, seeds = self.sampling_params(), self.prompt_seeds(len(prompts))
        try:
            return self.executor.run(self.engine, self.tokenizer, prompts, params, self.budget, seeds=seeds)
        except RuntimeError as exc:  # the engine refuses NaN/inf probabilities
            if "inf" not in str(exc) and "nan" not in str(exc):
                raise
            raise TrainingError(
                f"step {self.step + 1}: the policy's next-token probabilities are NaN/inf (its weights diverged or were "
                "loaded with NaN/inf); lower --actor.adam.lr and resume from the last good checkpoint with "
                "--ckpt.load_enable true, or check the model folder"
            ) from exc

    def check_staleness(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Staleness of a sample = the policy version now - the version that generated it. Training on
        a sample staler than --train.max_staleness is refused (the async pipeline drops those first)."""
        lags = torch.tensor([float(self.engine.version - t.version) for t in trajs] or [0.0])
        if lags.max() > self.cfg.train.max_staleness:
            raise TrainingError(f"step {self.step + 1}: a sample is {int(lags.max())} policy versions old, more than "
                                f"--train.max_staleness {self.cfg.train.max_staleness}; this is a bug in the pipeline")
        dropped = self.pipeline.pop_dropped() if self.pipeline is not None else 0
        return {"staleness_max": float(lags.max()), "staleness_mean": float(lags.mean()), "stale_dropped": float(dropped)}

    def score(self, prompts: Sequence[PromptItem], trajs: list[Trajectory]):
        """Call the reward function; apply overlong shaping and normalisation."""
        ids = [t.response_ids.tolist() for t in trajs]
        # queries as OpenRLHF builds them (prompt + response with special tokens); `responses`
        # is the generated text alone, without special tokens.
        raw = self.tokenizer.batch_decode(ids, skip_special_tokens=False)
        responses = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        prompt_texts = [prompts[t.group_id].text for t in trajs]
        labels = [prompts[t.group_id].label for t in trajs]
        queries = [p + r for p, r in zip(prompt_texts, raw)]
        lengths = torch.tensor([t.response_length for t in trajs], dtype=torch.float32)
        if self.executor.provides_rewards:
            out = agent_rewards(trajs)
        else:
            out = self.reward_fn(queries, prompt_texts, labels, responses=responses, response_lengths=lengths,
                                 group_ids=torch.tensor([t.group_id for t in trajs]))
        rewards, scores = out.rewards.float().clone(), out.scores.float()
        metrics = {f"reward_extra/{k}": float(v.float().mean()) for k, v in out.extra_logs.items()}
        metrics["reward"] = float(rewards.mean())
        w = self.cfg.reward
        if w.overlong_buffer_len is not None:
            penalty = overlong_penalty(lengths, self.budget.total, w.overlong_buffer_len, w.overlong_penalty_factor)
            rewards = rewards + penalty
            metrics["overlong_penalty"] = float(penalty.mean())
        if self.cfg.reward.normalize:
            self.reward_moments.update(rewards)
            rewards = (rewards - self.reward_moments.mean) / (self.reward_moments.std + 1e-8)
        return rewards, scores, metrics

    def filter_groups(self, trajs, rewards, scores):
        """DAPO dynamic filtering: drop groups whose mean score is outside the range (counted)."""
        a = self.cfg.algo
        if not a.dynamic_filtering_enable:
            return trajs, rewards, scores, 0
        keep, dropped = keep_groups_in_range(torch.tensor([t.group_id for t in trajs]), scores,
                                             *a.dynamic_filtering_range)
        idx = keep.nonzero().flatten().tolist()
        return [trajs[i] for i in idx], rewards[keep], scores[keep], dropped

    def make_experience(self, trajs: list[Trajectory], rewards: torch.Tensor) -> Experience:
        cfg = self.cfg
        batch = collate(trajs, self.tokenizer.pad_token_id)
        group_ids = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
        kl_coef = self.kl_ctl.value
        kl_in_reward = kl_coef > 0 and not cfg.algo.kl.use_loss
        need_old = self.plan.optimizer_steps_per_rollout > 1 or kl_in_reward
        temp = cfg.rollout.temperature or 1.0
        amp = cfg.actor.autocast

        def logp_of(model):
            def fn(mb: TokenBatch) -> torch.Tensor:
                with autocast_ctx(amp):
                    return response_logprobs(model, mb, temperature=temp)[0]
            return fn

        def values_fn(mb: TokenBatch) -> torch.Tensor:
            with autocast_ctx(amp):
                return self.critic.response_values(mb)

        adv = cfg.algo.advantage
        whiten = {"true": True, "mean": "mean", "false": False}[adv.whiten]
        return make_experience(
            batch, rewards, group_ids, estimator=adv.estimator,
            gamma=1.0 if adv.estimator in GROUP_ESTIMATORS else adv.gamma, lam=adv.lambd, whiten=whiten,
            reward_clip=cfg.reward.clip_range, kl_coef=kl_coef, kl_estimator=cfg.algo.kl.estimator,
            kl_in_reward=kl_in_reward,
            policy_logp=logp_of(self.policy) if need_old else None,
            ref_logp=logp_of(self.ref) if (self.ref is not None and kl_coef > 0) else None,
            values=values_fn if self.critic is not None else None,
            chunks=self.micro_batches(batch, group_ids, torch.arange(len(trajs))), layout=self.layout(batch),
        )

    # ------------------------------------------------------------------ micro-batches
    def layout(self, batch: TokenBatch):
        """How a micro-batch's rows are laid out for the forward: the shared-prefix layout (each
        prompt once per row, rows up to max(SHARED_ROW_TOKENS, longest sample) tokens) or padded rows."""
        row_tokens = self.shared_row_tokens(batch)
        if row_tokens is None:
            return select_rows
        pad = self.tokenizer.pad_token_id
        return lambda b, rows: pack_shared_prefix(b, rows, pad, row_tokens)

    def shared_row_tokens(self, batch: TokenBatch) -> int | None:
        """Row size of the shared-prefix layout, None when it is off."""
        if not self.cfg.train.shared_prefix_enable:
            return None
        return max(SHARED_ROW_TOKENS, int(batch.attention_mask.sum(dim=1).max()))

    def micro_batches(self, batch: TokenBatch, group_ids: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        """`rows` cut into micro-batches: --train.micro_batch_size samples, or about
        --train.max_tokens_per_micro_batch tokens with --train.dynamic_batch_enable. With the shared
        prefix, the rows are first ordered by group (one optimizer step sums the same gradients in
        any order) so that samples of one prompt meet in a micro-batch."""
        t = self.cfg.train
        if t.shared_prefix_enable:
            rows = rows[torch.argsort(group_ids[rows], stable=True)]
        cuts = micro_batches(
            rows.tolist(), batch.prompt_lengths.tolist(), batch.response_mask.sum(dim=1).tolist(), group_ids.tolist(),
            max_samples=None if t.dynamic_batch_enable else t.micro_batch_size,
            max_tokens=t.max_tokens_per_micro_batch if t.dynamic_batch_enable else None,
            shared_prefix_row_tokens=self.shared_row_tokens(batch),
        )
        return [torch.tensor(c, dtype=torch.long) for c in cuts]

    def rank_share(self, step_rows: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """This rank's equal share of an optimizer step's rows under FSDP (all of them in one process).
        With the shared prefix, rows are ordered by group first, so a rank holds whole groups and its
        micro-batches are the ones one process would cut."""
        rank, world = self.dp
        if world == 1:
            return step_rows
        if self.cfg.train.shared_prefix_enable:
            step_rows = step_rows[torch.argsort(group_ids[step_rows], stable=True)]
        return step_rows.tensor_split(world)[rank]

    def update(self, exp: Experience) -> dict[str, float]:
        """max_epochs passes over the replay buffer; an optimizer step per train.batch_size samples."""
        t = self.cfg.train
        sums: dict[str, float] = {}
        self.policy.train()
        layout = self.layout(exp.batch)
        with self.compiled.active() if self.compiled is not None else contextlib.nullcontext():
            n_opt = self._optimizer_steps(exp, layout, sums)
        # Per-step quantities are averaged over optimizer steps; token sums over all tokens seen.
        total_tokens = max(int(exp.batch.loss_mask.sum()) * t.max_epochs, 1)
        computed = sums.pop("train_tokens", 0.0)
        out = {k: v / (n_opt if k in _PER_STEP or k.startswith(("actor/", "critic/")) else total_tokens)
               for k, v in sums.items()}
        out["optimizer_steps"] = float(n_opt)
        out["train_tokens"] = computed  # tokens the forward/backward ran on (no padding; shared prompts once)
        out["sample_tokens"] = float(exp.batch.attention_mask.sum()) * t.max_epochs  # prompt + response per sample
        out["response_tokens"] = float(exp.batch.response_mask.sum()) * t.max_epochs
        return out

    def _optimizer_steps(self, exp: Experience, layout, sums: dict[str, float]) -> int:
        """The update's optimizer steps; metric sums added to `sums`. Returns how many ran."""
        t = self.cfg.train
        n_opt = 0
        for _ in range(t.max_epochs):
            perm = torch.randperm(len(exp), generator=self.shuffle_gen)
            for s in range(0, len(exp), t.batch_size):
                step_rows = perm[s : s + t.batch_size]
                step_mask = exp.batch.loss_mask[step_rows]
                num_tokens = int(step_mask.sum())
                num_seqs = int(step_mask.any(dim=1).sum())
                mine = self.rank_share(step_rows, exp.group_ids)  # counts above stay those of the whole step
                # One autocast region per optimizer step: its cache keeps the bf16 copies of the
                # weights for every micro-batch instead of casting them again in each.
                with autocast_ctx(self.cfg.actor.autocast):
                    for rows in self.micro_batches(exp.batch, exp.group_ids, mine):
                        for k, v in self.micro_step(exp, rows, layout, num_tokens, num_seqs).items():
                            sums[k] = sums.get(k, 0.0) + v
                for k, v in self.learner.step().items():
                    sums[f"actor/{k}"] = sums.get(f"actor/{k}", 0.0) + v
                if self.critic_learner is not None:
                    for k, v in self.critic_learner.step().items():
                        sums[f"critic/{k}"] = sums.get(f"critic/{k}", 0.0) + v
                n_opt += 1
        return n_opt

    def micro_step(self, exp: Experience, rows: torch.Tensor, layout, num_tokens: int, num_seqs: int) -> dict[str, float]:
        """Forward + backward of one micro-batch. Returns token-weighted metric sums."""
        cfg, a = self.cfg, self.cfg.actor
        mb, x = exp.select(rows, layout)
        mask = mb.loss_mask
        counts = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_len=self.budget.total)
        with autocast_ctx(a.autocast):
            logp, entropy = response_logprobs(self.policy, mb, temperature=cfg.rollout.temperature or 1.0,
                                              with_entropy=True, entropy_grad=bool(a.entropy_coef))
        logp = logp.float()
        if logp.device != mask.device:  # the policy sits on a GPU: bring the micro-batch's tensors to it
            mask = mask.to(logp.device)
            x = {k: None if v is None else v.to(logp.device) for k, v in x.items()}
        old = x["old_logp"] if x["old_logp"] is not None else logp.detach()
        lo, hi = a.eps_clip_low_high
        loss, pm = policy_loss(
            logp, old, x["advantages"], mask, eps_low=lo, eps_high=hi, dual_clip=a.dual_clip,
            ratio_level="sequence" if a.policy_loss_type == "gspo" else "token", agg=a.loss_agg_mode, **counts,
        )
        ntok = float(mask.sum())
        out = {"train_tokens": float(mb.num_tokens), "policy_loss": float(loss.detach()),
               "clip_frac": float(pm["clip_frac"]) * ntok,
               "ppo_kl": float(pm["approx_kl"]) * ntok}
        out["entropy"] = float((entropy.detach().float() * mask).sum())
        if a.entropy_coef:
            loss = loss - a.entropy_coef * aggregate_loss(entropy.float(), mask, a.loss_agg_mode, **counts)
        if cfg.algo.kl.use_loss and x["ref_logp"] is not None:
            kl = approx_kl(logp, x["ref_logp"], cfg.algo.kl.estimator)
            loss = loss + self.kl_ctl.value * aggregate_loss(kl, mask, a.loss_agg_mode, **counts)
            out["kl_loss"] = float((kl.detach() * mask).sum())
        self.learner.backward(loss)
        if self.critic is not None:
            with autocast_ctx(a.autocast):
                v = self.critic.response_values(mb).float()
            vloss, _ = value_loss(v, x["values"], x["returns"], mask, clip=cfg.critic.value_clip,
                                  agg=a.loss_agg_mode, **counts)
            self.critic_learner.backward(vloss)
            out["value_loss"] = float(vloss.detach())
        return out

    # ------------------------------------------------------------------ logging
    def experience_metrics(self, exp: Experience, trajs: list[Trajectory]) -> dict[str, float]:
        mask = exp.batch.loss_mask
        lengths = torch.tensor([float(t.response_length) for t in trajs])
        out = {
            "response_length": float(lengths.mean()),
            "truncated_frac": float(sum(t.truncated for t in trajs) / len(trajs)),
            "advantage_abs": float((exp.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
            "policy_version": float(trajs[0].version),
        }
        if exp.kl is not None:
            out["kl"] = float((exp.kl * mask).sum() / mask.sum().clamp(min=1))
        elif exp.ref_logp is not None and exp.old_logp is not None:
            out["kl"] = float((approx_kl(exp.old_logp, exp.ref_logp, "k1") * mask).sum() / mask.sum().clamp(min=1))
        return out

    def log_samples(self, prompts, trajs: list[Trajectory], exp: Experience) -> None:
        if self.tracker is None or self.cfg.logger.log_samples <= 0:
            return
        rows = []
        for i, t in enumerate(trajs[: self.cfg.logger.log_samples]):
            m = exp.batch.loss_mask[i]
            rows.append({
                "prompt": prompts[t.group_id].text,
                "response": self.tokenizer.decode(t.response_ids.tolist(), skip_special_tokens=False),
                "label": str(prompts[t.group_id].label),
                "reward": float(exp.rewards[i]),
                "advantage": float(exp.advantages[i][m].mean()) if m.any() else 0.0,
                "length": t.response_length,
            })
        self.tracker.log_samples(self.step + 1, rows)  # the step number its metrics are logged under

    # ------------------------------------------------------------------ checkpoint (trainers.checkpoint)
    def state_dict(self) -> dict:
        """Everything besides the weights that a resumed run needs to continue bit for bit."""
        return {
            "step": self.step, "episode": self.episode, "order": self.order, "index": self.index,
            "num_prompts": len(self.prompts), "rollout_batch_size": self.cfg.rollout.batch_size,
            "sample_gen": self.sample_gen.get_state(), "shuffle_gen": self.shuffle_gen.get_state(),
            "policy_version": self.engine.version, "kl_ctl": self.kl_ctl.state_dict(),
            "reward_moments": self.reward_moments.state_dict(), "learner": self.learner.state_dict(),
            "critic_learner": self.critic_learner.state_dict() if self.critic_learner is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        here = (len(self.prompts), self.cfg.rollout.batch_size)
        there = (state["num_prompts"], state["rollout_batch_size"])
        if here != there:
            raise CheckpointError(
                f"the checkpoint was written with {there[0]} prompts and --rollout.batch_size {there[1]}, this run "
                f"has {here[0]} and {here[1]}; resume with the same data and flags, or use a new --ckpt.output_dir"
            )
        self.step, self.episode, self.order, self.index = state["step"], state["episode"], state["order"], state["index"]
        self.sample_gen.set_state(state["sample_gen"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        self.engine.update_weights({}, state["policy_version"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.reward_moments.load_state_dict(state["reward_moments"])
        self.learner.load_state_dict(state["learner"])
        if self.critic_learner is not None:
            self.critic_learner.load_state_dict(state["critic_learner"])

    def checkpoint_modules(self) -> dict[str, tuple]:
        """The trained modules: the policy as an HF folder (with the tokenizer), the critic's state dict."""
        mods: dict[str, tuple] = {"model": (self.policy, self.tokenizer)}
        if self.critic is not None:
            mods["critic"] = (self.critic, None)
        return mods

    def can_checkpoint(self) -> bool:
        """False while the last optimizer steps were skipped (non-finite): keep the last good checkpoint."""
        learners = [x for x in (self.learner, self.critic_learner) if x is not None]
        return all(x.consecutive_skips == 0 for x in learners)

    def save(self, path: str | Path) -> Path:
        """The policy as an HF folder (safetensors + tokenizer)."""
        return save_hf_folder(self.policy, self.tokenizer, path)

    def save_ema(self, path: str | Path) -> Path | None:
        """The EMA of the policy's weights (--actor.ema_beta) as an HF folder, or None without one.
        The EMA is written through the policy module (its weights swapped in and restored)."""
        ema = self.learner.ema
        if ema is None:
            return None
        params = self.learner.params
        with torch.no_grad():
            kept = [p.detach().clone() for p in params]
            try:
                for p, e in zip(params, ema, strict=True):
                    p.copy_(e)
                return save_hf_folder(self.policy, self.tokenizer, path)
            finally:
                for p, k in zip(params, kept, strict=True):
                    p.copy_(k)
