"""Async RL: generate rollout batch k+1 on the workers while the trainer trains on batch k.

`Prefetch` is a rollout source (rlhfkit.trainers.rl.generate.RolloutSource) over a RayEnginePool.
When the loop asks for batch k it also hands over a way to draw batch k+1 (`upcoming`); once batch
k is in, Prefetch starts batch k+1 in a background thread that runs the executor (single-turn, or
an agent's multi-turn episodes) against the pool, so the workers generate it with the weights they
hold while the trainer trains on k (version v_k, or older on a worker that lags; an agent's turns
may straddle a weight update, each token stamped with the version that produced it). The trainer
then trains on batch k+1 at version v_{k+1}: a staleness of 1 in the steady state.

`generate` enforces the bound per sample: a sample's staleness is the trainer's version now minus
the OLDEST version among its tokens; every group holding a sample more than `max_staleness` versions
old is dropped (counted in `stale_dropped`, logged) and its prompt re-issued with the SAME seed at
the current version; `RLLoop.check_staleness` then refuses to train on anything staler. A batch
that was not drawn ahead (the first one; a dynamic-filtering top-up) is generated at once, fresh.
Every executor call runs on the one background thread, one at a time (an agent executor's event
loop and state are never used by two threads; the workers run one generation at a time anyway).
The executor's counters (tools/*) are taken on that thread right after each of its runs and handed
over with the batch they counted, so a step logs its own batch's tool calls, not the batch ahead's.

The look-ahead is one batch, so a bound k >= 2 is reached only by a worker that lags (it holds
weights older than the trainer's last sync); the loop logs the staleness reached
(`async/staleness_max`). The trainer corrects for it with decoupled PPO (core.decoupled_policy_loss,
on whenever async is): the workers' logprobs are the behaviour policy, the trainer's weights
before the update the proximal one.

Checkpoints: a batch drawn ahead does not move the data position a checkpoint records
(PromptStream.peek), so a resumed run draws it again with the same seeds (at the checkpoint's
version) and no prompt is lost or trained twice; top-up prompts drawn past it are recorded so that
a resumed run skips them (PromptStream.take_topup).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.distributed.pool import RayEnginePool
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.rl.generate import Generate, Upcoming
from rlhfkit.trainers.rl.stream import PromptBatch

log = logging.getLogger(__name__)


class LaggingPool:
    """The pool as a GenerationEngine for generation ahead: a worker does not wait long for the newest
    weights (its samples carry the version it used). `version` is the oldest version of anything it
    generated since `reset` (the pool's when nothing yet): an executor that stamps a whole episode
    with `engine.version` then never under-states its staleness."""

    def __init__(self, pool: RayEnginePool):
        self.pool, self.oldest = pool, None

    def reset(self) -> None:
        self.oldest = None

    @property
    def version(self) -> int:
        return self.pool.version if self.oldest is None else self.oldest

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 generator: torch.Generator | None = None, group_ids: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None, vision: Sequence | None = None) -> list[Trajectory]:
        if seeds is None:
            gen = generator if generator is not None else torch.Generator().manual_seed(0)
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=gen).tolist()
        out = self.pool.gather(self.pool.submit(prompts, params, seeds, group_ids, vision=vision))
        self.oldest = min([t.version for t in out] + ([self.oldest] if self.oldest is not None else []))
        return out

    def update_weights(self, state, version: int) -> None:
        self.pool.update_weights(state, version)


class Prefetch:
    """Rollout batches generated ahead on `pool` by `executor` (one batch at a time, in a background
    thread); stale groups regenerated when taken. `tokenizer`, `params`, `budget` (a TokenBudget)
    as for `Generate`."""

    def __init__(self, executor, pool: RayEnginePool, tokenizer, params: SamplingParams, budget,
                 max_staleness: int):
        self.pool, self.max_staleness = pool, max_staleness
        self.lagging = LaggingPool(pool)
        self.ahead_source = Generate(executor, self.lagging, tokenizer, params, budget)
        self.fresh_source = Generate(executor, pool, tokenizer, params, budget)
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlhfkit-prefetch")
        self.ahead: tuple[PromptBatch, Future] | None = None
        self.dropped = 0  # groups dropped as too stale since the last pop_metrics()
        self.dropped_total = 0
        self.counted: list[dict[str, float]] = []  # the executor's counters of the batches handed over

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        """The trajectories of `batch` (generated now if it was not drawn ahead), then the batch
        `upcoming` draws is started; stale groups regenerated at the current version."""
        if self.ahead is not None and self.ahead[0] is batch:
            trajs, counted = self.ahead[1].result()
            self.counted.append(counted)
            self.ahead = None
        else:
            trajs = self.fresh(batch)
        trajs = self.regenerate_stale(batch, trajs)
        if upcoming is not None and self.ahead is None:
            nxt = upcoming()
            if nxt:
                self.ahead = (nxt, self.thread.submit(self._generate_ahead, nxt))  # while `batch` trains
        return trajs

    def fresh(self, batch: PromptBatch) -> list[Trajectory]:
        """`batch` generated at the current version (on the background thread, after what is queued there)."""
        trajs, counted = self.thread.submit(_counted, self.fresh_source, batch).result()
        self.counted.append(counted)
        return trajs

    def _generate_ahead(self, batch: PromptBatch) -> tuple[list[Trajectory], dict[str, float]]:
        self.lagging.reset()
        return _counted(self.ahead_source, batch)

    def regenerate_stale(self, batch: PromptBatch, trajs: list[Trajectory]) -> list[Trajectory]:
        """`trajs` with every group holding a sample staler than the bound regenerated now."""
        now = self.pool.version
        stale = sorted({t.group_id for t in trajs if now - t.version > self.max_staleness})
        if not stale:
            return trajs
        log.warning("dropping %d of %d groups staler than %d versions; re-issuing their prompts",
                    len(stale), len(batch), self.max_staleness)
        self.dropped += len(stale)
        self.dropped_total += len(stale)
        fresh = self.fresh(PromptBatch([batch.prompts[g] for g in stale], [batch.seeds[g] for g in stale]))
        for t in fresh:
            t.group_id = stale[t.group_id]
        kept = [t for t in trajs if t.group_id not in set(stale)]
        return sorted(kept + fresh, key=lambda t: t.group_id)  # stable: a group's samples keep their order

    def pop_metrics(self) -> dict[str, float]:
        """Groups dropped as too stale and the executor's counters of the batches handed over since the
        last call."""
        dropped, self.dropped = self.dropped, 0
        counted, self.counted = self.counted, []
        return {"stale_dropped": float(dropped), **merge_counters(counted)}


def _counted(source: Generate, batch: PromptBatch) -> tuple[list[Trajectory], dict[str, float]]:
    """`batch`'s trajectories from `source` and the executor's counters of that run (on the calling thread)."""
    trajs = source.generate(batch)
    return trajs, source.pop_metrics()


def merge_counters(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """The counters of several executor runs of one step (a batch, its stale groups regenerated, its
    dynamic-filtering top-ups) as one: rates and means (`*rate`, `*mean*`) averaged over the runs that
    report them, every other counter summed."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for run in runs:
        for k, v in run.items():
            out[k] = out.get(k, 0.0) + v
            seen[k] = seen.get(k, 0) + 1
    return {k: v / seen[k] if k.endswith("rate") or "mean" in k else v for k, v in out.items()}
