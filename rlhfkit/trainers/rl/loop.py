"""The RL loop, in the shape of OpenRLHF's PPO trainer:

    for episode in episodes:
        for rollout batch (rollout_batch_size prompts x n_samples_per_prompt) of the episode:
            generate ─► score (reward, shaping, normalisation, dynamic filtering)
            ─► experience (old/ref logprobs, values, KL, advantages)
            ─► update (max_epochs passes in micro-batches, an optimizer step every train_batch_size samples)
            ─► sync (engine weights, policy version + 1)

Each stage is a component built with plain arguments (rlhfkit.api.RLTrainer.from_config builds them
from a config): `RolloutSource` (trainers.rl.generate), `Scorer` and `GroupFilter` (trainers.rl.scoring),
`ExperienceMaker` (trainers.rl.experience), `PolicyUpdate` (trainers.rl.update). Every stage has a timer.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlhfkit.core.kl import approx_kl
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import TrainingError
from rlhfkit.models import save_hf_folder
from rlhfkit.models.precision import model_device, peak_memory, synchronize
from rlhfkit.rollout.base import GenerationEngine
from rlhfkit.trainers.evaluate import conversation_fields
from rlhfkit.trainers.rl.experience import Experience, ExperienceMaker
from rlhfkit.trainers.rl.generate import RolloutSource
from rlhfkit.trainers.rl.scoring import BatchFill, Collected, GroupFilter, Scorer
from rlhfkit.trainers.rl.stream import PromptBatch, PromptStream
from rlhfkit.trainers.rl.sync import sync_weights
from rlhfkit.trainers.rl.update import PolicyUpdate

Callback = Callable[["RLLoop", int, dict], None]
log = logging.getLogger("rlhfkit")


@dataclass
class StepTimer:
    """Seconds per stage; on a CUDA `device` also each stage's peak allocated memory (GiB). On CUDA a
    stage starts and ends with a device synchronisation (`synchronize`), so its time is the time its
    work ran, not the time to queue it (the update's kernels would otherwise be counted in the sync)."""

    times: dict[str, float] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    peaks: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str):
        synchronize(self.device)
        t0 = time.perf_counter()
        with peak_memory(self.device, self.peaks, name):
            yield
            synchronize(self.device)
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


class RLLoop:
    """The RL loop over its stages.

    data: the prompts in training order (PromptStream); source: the trajectories of a batch
    (trainers.rl.generate); engine: the generation engine whose weights `sync_weights` updates and
    whose version stamps samples; scorer, group_filter, experience, update: the stages; kl_ctl: the
    KL coefficient's controller; total_steps: RL steps to run; max_staleness: most policy versions a
    trained sample may lag (0: synchronous); tokenizer: for completion logs; tracker: metrics and
    completion logs (None: not logged); log_samples: completions logged per step; callbacks:
    `cb(loop, step, metrics)` after each step (evaluation, checkpoints); actor_freezing_steps: the
    critic's warm-up, the first RL steps whose update trains the critic alone (OpenRLHF's
    --critic.freezing_steps: the actor trains from step N + 1 on)."""

    def __init__(self, data: PromptStream, source: RolloutSource, engine: GenerationEngine, scorer: Scorer,
                 group_filter: GroupFilter, experience: ExperienceMaker, update: PolicyUpdate, kl_ctl, *,
                 total_steps: int, max_staleness: int = 0, tokenizer=None, tracker=None, log_samples: int = 0,
                 callbacks: Sequence[Callback] = (), actor_freezing_steps: int = 0):
        self.data, self.source, self.engine = data, source, engine
        self.scorer, self.group_filter, self.experience, self.update = scorer, group_filter, experience, update
        self.kl_ctl, self.total_steps, self.max_staleness = kl_ctl, total_steps, max_staleness
        self.tokenizer, self.tracker, self.log_samples = tokenizer, tracker, log_samples
        self.callbacks = list(callbacks)
        self.actor_freezing_steps = actor_freezing_steps
        self.step = 0

    @property
    def policy(self) -> torch.nn.Module:
        return self.update.policy

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        """Train from the current data position (the start, or where a checkpoint left off) to
        total_steps; returns each step's metrics."""
        history: list[dict] = []
        while self.step < self.total_steps and self.data.episode < self.data.num_episodes:
            episode = self.data.episode
            for batch in self.data.rollout_batches():
                metrics = self.train_step(batch)
                metrics["episode"] = episode
                history.append(metrics)
                for cb in self.callbacks:
                    cb(self, self.step, metrics)
                if self.step >= self.total_steps:
                    break
        reason = self.stop_reason()
        if reason is not None:
            print(reason)
        return history

    def stop_reason(self) -> str | None:
        """One line saying why training ended before total_steps (the prompts ran out), else None."""
        if self.step >= self.total_steps:
            return None
        why = f"the prompts of --train.num_episodes {self.data.num_episodes} episode(s) ran out"
        if self.group_filter.enabled and self.group_filter.max_rounds > 1:
            why += (" (dynamic filtering drew extra prompts to top batches up, up to "
                    f"--algo.dynamic_filtering_max_rounds {self.group_filter.max_rounds} rounds per step)")
        return (f"training stopped after {self.step} of {self.total_steps} planned steps: {why}; "
                "raise --train.num_episodes or add prompts to reach them")

    def train_step(self, batch: PromptBatch) -> dict[str, float]:
        """One RL step: generate, reward and filter (with dynamic filtering, rounds of new prompts top
        the batch up), experience, update, weight sync; each stage a timed block."""
        timer, t_start = StepTimer(device=model_device(self.policy)), time.perf_counter()
        upcoming = (lambda: self.data.peek(self.data.batch_size)) if self.step + 1 < self.total_steps else None
        fill = BatchFill(self.group_filter, self.scorer.tokenizer, want=self.data.batch_size)
        try:
            while batch:  # the rollout batch, then the top-ups that replace dropped groups
                with timer("generate"):
                    trajs = self.source.generate(batch, upcoming if fill.rounds == 0 else None)
                with timer("reward"):
                    scored = self.scorer(batch.prompts, trajs)
                need = fill.add(batch, trajs, scored)
                batch = self.data.take_topup(need) if need else None
        except TrainingError as exc:
            raise TrainingError(f"step {self.step + 1}: {exc}") from exc
        got = fill.collected()
        metrics = dict(got.scored.metrics)
        metrics.update(self.check_staleness(got.trajs))
        metrics.update({"stale_dropped": 0.0, **self.source.pop_metrics()})
        frozen = self.step < self.actor_freezing_steps
        if self.actor_freezing_steps:
            metrics["actor_frozen"] = float(frozen)
        if frozen:
            log.info("step %d: actor frozen, only the critic is updated (critic warm-up: --actor.freezing_steps %d)",
                     self.step + 1, self.actor_freezing_steps)
        if got.trajs:
            kl_coef = self.kl_ctl.value
            with timer("experience"):
                exp = self.experience(got.trajs, got.scored.rewards, kl_coef, got.scored.token_rewards)
            with timer("update"):
                metrics.update(self.update(exp, kl_coef, train_actor=not frozen))
            metrics.update(experience_metrics(exp, got.trajs))
            self.kl_ctl.update(metrics.get("kl", 0.0), len(got.trajs))
            self.log_completions(got, exp)
        self.step += 1
        with timer("sync"):
            sync_weights(self.engine)
        return self.finish_metrics(metrics, timer, t_start, got.generated_tokens)

    def finish_metrics(self, metrics: dict, timer: StepTimer, t_start: float, generated_tokens: int) -> dict:
        """The step's timings, memory peaks, throughput and KL coefficient added to `metrics`; logged."""
        metrics.update({f"time/{k}": v for k, v in timer.times.items()})
        metrics.update({f"memory/{k}_peak_gib": v for k, v in timer.peaks.items()})
        metrics["time/step"] = time.perf_counter() - t_start
        metrics["rollout_tokens_per_s"] = generated_tokens / max(timer.times.get("generate", 1e-9), 1e-9)
        metrics["kl_coef"] = self.kl_ctl.value
        if self.tracker is not None:
            self.tracker.log(self.step, metrics)
        return metrics

    def check_staleness(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Staleness of a sample = the policy version now - the version of its oldest token. Training on
        a sample staler than max_staleness is refused (an async source drops those first). In async
        runs also the share of samples whose tokens come from more than one version (partial
        rollouts, agents' turns across an update)."""
        lags = torch.tensor([float(self.engine.version - t.version) for t in trajs] or [0.0])
        if lags.max() > self.max_staleness:
            raise TrainingError(f"step {self.step + 1}: a sample is {int(lags.max())} policy versions old, more than "
                                f"--train.max_staleness {self.max_staleness}; this is a bug in the pipeline")
        out = {"staleness_max": float(lags.max()), "staleness_mean": float(lags.mean())}
        if self.max_staleness > 0:  # async: the staleness reached, beside the bound it may reach
            mixed = [t.versions is not None and bool((t.versions != t.versions[:1]).any()) for t in trajs]
            out.update({"async/staleness_max": out["staleness_max"], "async/staleness_mean": out["staleness_mean"],
                        "async/max_staleness": float(self.max_staleness),
                        "async/mixed_version_frac": sum(mixed) / max(len(mixed), 1)})
        return out

    # ------------------------------------------------------------------ logging
    def log_completions(self, got: Collected, exp: Experience) -> None:
        if self.tracker is None or self.log_samples <= 0:
            return
        rows = []
        for i, t in enumerate(got.trajs[: self.log_samples]):
            m = exp.batch.loss_mask[i]
            prompt = got.prompts[t.group_id]
            rows.append({
                "prompt": prompt.text,
                "response": self.tokenizer.decode(t.response_ids.tolist(), skip_special_tokens=False),
                "label": str(prompt.label),
                "reward": float(exp.rewards[i]),
                "advantage": float(exp.advantages[i][m].mean()) if m.any() else 0.0,
                "length": t.response_length,
                **conversation_fields(t.info),  # tool-calling and text-environment episodes
            })
        self.tracker.log_samples(self.step + 1, rows)  # the step number its metrics are logged under

    # ------------------------------------------------------------------ checkpoint (trainers.checkpoint)
    def state_dict(self) -> dict:
        """Everything besides the weights that a resumed run needs to continue bit for bit."""
        return {"step": self.step, "data": self.data.state_dict(), "policy_version": self.engine.version,
                "kl_ctl": self.kl_ctl.state_dict(), "reward_moments": self.scorer.state_dict(),
                **self.update.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.data.load_state_dict(state["data"])
        self.step = state["step"]
        self.engine.update_weights({}, state["policy_version"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.scorer.load_state_dict(state["reward_moments"])
        self.update.load_state_dict(state)

    def checkpoint_modules(self) -> dict[str, tuple]:
        """The trained modules: the policy as an HF folder (with the tokenizer), the critic's state dict."""
        mods: dict[str, tuple] = {"model": (self.policy, self.tokenizer)}
        if self.update.critic is not None:
            mods["critic"] = (self.update.critic, None)
        return mods

    def checkpoint_learners(self) -> dict[str, tuple]:
        """{key of state_dict(): (name in checkpoint_modules(), its Learner)}: where each trained module's
        optimizer state and EMA sit, for a checkpointer that saves them as shards (distributed.fsdp_checkpoint)."""
        out: dict[str, tuple] = {"learner": ("model", self.update.learner)}
        if self.update.critic_learner is not None:
            out["critic_learner"] = ("critic", self.update.critic_learner)
        return out

    def can_checkpoint(self) -> bool:
        """False while the last optimizer steps were skipped (non-finite): keep the last good checkpoint."""
        learners = [x for x in (self.update.learner, self.update.critic_learner) if x is not None]
        return all(x.consecutive_skips == 0 for x in learners)

    def save(self, path: str | Path) -> Path:
        """The policy as an HF folder (safetensors + tokenizer)."""
        return save_hf_folder(self.policy, self.tokenizer, path)

    def save_ema(self, path: str | Path) -> Path | None:
        """The EMA of the policy's weights (--actor.ema_beta) as an HF folder, or None without one.
        The EMA is written through the policy module (its weights swapped in and restored)."""
        ema = self.update.learner.ema
        if ema is None:
            return None
        params = self.update.learner.params
        with torch.no_grad():
            kept = [p.detach().clone() for p in params]
            try:
                for p, e in zip(params, ema, strict=True):
                    p.copy_(e)
                return save_hf_folder(self.policy, self.tokenizer, path)
            finally:
                for p, k in zip(params, kept, strict=True):
                    p.copy_(k)


def experience_metrics(exp: Experience, trajs: list[Trajectory]) -> dict[str, float]:
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
