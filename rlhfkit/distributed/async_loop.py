"""Async RL: generate rollout batch k+1 on the workers while the trainer trains on batch k.

`Prefetch` is a rollout source (rlhfkit.trainers.generate.RolloutSource) over a RayEnginePool.
When the loop asks for batch k it also hands over a way to draw batch k+1 (`upcoming`); Prefetch
submits k+1 to the pool right away, so the workers generate it with the weights they hold while
the trainer trains on k (version v_k, or older on a worker that lags). The trainer then trains on
batch k+1 at version v_{k+1}: a staleness of 1 in the steady state. `generate` enforces the bound:
every group generated more than `max_staleness` versions before the trainer's current version is
dropped (counted in `stale_dropped`, logged) and its prompt re-issued with the SAME seed at the
current version; `RLLoop.check_staleness` then refuses to train on anything staler.

The look-ahead is one batch, so a bound k >= 2 is reached only by a worker that lags (it holds
weights older than the trainer's last sync); the loop logs the staleness reached
(`async/staleness_max`). The trainer corrects for it with decoupled PPO (core.decoupled_policy_loss,
on whenever async is): the workers' logprobs are the behaviour policy, the trainer's weights
before the update the proximal one.

Checkpoints: a batch drawn ahead does not move the data position a checkpoint records
(PromptStream.peek), so a resumed run draws it again with the same seeds (at the checkpoint's
version) and no prompt is lost or trained twice.
"""

from __future__ import annotations

import logging
from collections import deque

from rlhfkit.data.types import Trajectory
from rlhfkit.distributed.pool import RayEnginePool
from rlhfkit.errors import TrainingError
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.generate import Upcoming
from rlhfkit.trainers.stream import PromptBatch

log = logging.getLogger(__name__)


class Prefetch:
    """Rollout batches submitted ahead to `pool` with `params`; stale groups regenerated when taken."""

    def __init__(self, pool: RayEnginePool, params: SamplingParams, max_staleness: int):
        self.pool, self.params, self.max_staleness = pool, params, max_staleness
        self.queue: deque = deque()
        self.dropped = 0  # groups dropped as too stale since the last pop_metrics()
        self.dropped_total = 0

    def submit(self, batch: PromptBatch) -> None:
        pending = self.pool.submit([p.ids for p in batch.prompts], self.params, batch.seeds)
        self.queue.append((batch, pending))

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        """The trajectories of `batch` (submitted now if it was not ahead), after submitting the
        batch `upcoming` draws; stale groups regenerated at the current version."""
        if not self.queue:
            self.submit(batch)
        if self.queue[0][0] is not batch:
            raise TrainingError("async pipeline: the trainer asked for a batch that was not prefetched (a bug)")
        if upcoming is not None:
            nxt = upcoming()
            if nxt:
                self.submit(nxt)  # generated on the workers while `batch` trains
        _, pending = self.queue.popleft()
        trajs = self.pool.gather(pending)
        n = pending.params.n
        now = self.pool.version
        stale = sorted({i // n for i, t in enumerate(trajs) if now - t.version > self.max_staleness})
        if not stale:
            return trajs
        log.warning("dropping %d of %d groups staler than %d versions; re-issuing their prompts",
                    len(stale), len(batch), self.max_staleness)
        self.dropped += len(stale)
        self.dropped_total += len(stale)
        fresh = self.pool.gather(self.pool.submit([batch.prompts[i].ids for i in stale], pending.params,
                                                  [batch.seeds[i] for i in stale], group_ids=stale, fresh=True))
        for j, g in enumerate(stale):
            trajs[g * n:(g + 1) * n] = fresh[j * n:(j + 1) * n]
        return trajs

    def pop_metrics(self) -> dict[str, float]:
        dropped, self.dropped = self.dropped, 0
        return {"stale_dropped": float(dropped)}
