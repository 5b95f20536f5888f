"""Async RL: generate rollout batch k+1 on the workers while the trainer trains on batch k.

`fit_async` is `RLTrainer.fit` with one batch of look-ahead: before training on batch k it
submits batch k+1 to the engine pool, which generates it with the weights the workers hold at
that time (version v_k, or older on a worker that lags). The trainer then trains on batch k+1
at version v_{k+1}: a staleness of 1 in the steady state. `Prefetch.take` enforces the bound:
every group generated more than `max_staleness` versions before the trainer's current version
is dropped (counted in `stale_dropped`, logged) and its prompt re-issued with the SAME seed at
the current version; `RLTrainer.check_staleness` then refuses to train on anything staler.

Checkpoints: the callbacks (evaluation, checkpointing) run with the data position and
sample_gen rewound to before the look-ahead batch was drawn, so a resumed run regenerates it
(at the checkpoint's version) and no prompt is lost or trained twice.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Sequence

from rlhfkit.data.types import Trajectory
from rlhfkit.distributed.pool import RayEnginePool
from rlhfkit.errors import TrainingError

log = logging.getLogger(__name__)


class Prefetch:
    """Rollout batches submitted ahead to `pool`; `RLTrainer.generate` takes them (trainer.pipeline)."""

    def __init__(self, pool: RayEnginePool, max_staleness: int):
        self.pool, self.max_staleness = pool, max_staleness
        self.queue: deque = deque()
        self.dropped = 0  # groups dropped as too stale since the last pop_dropped()
        self.dropped_total = 0

    def submit(self, trainer, prompts: Sequence) -> None:
        seeds = trainer.prompt_seeds(len(prompts))
        pending = self.pool.submit([p.ids for p in prompts], trainer.sampling_params(), seeds)
        self.queue.append((list(prompts), seeds, pending))

    def take(self, trainer, prompts: Sequence) -> list[Trajectory]:
        """The prefetched trajectories of `prompts`, stale groups regenerated at the current version."""
        if not self.queue or self.queue[0][0] != list(prompts):
            raise TrainingError("async pipeline: the trainer asked for a batch that was not prefetched (a bug)")
        batch, seeds, pending = self.queue.popleft()
        trajs = self.pool.gather(pending)
        n = pending.params.n
        now = self.pool.version
        stale = sorted({i // n for i, t in enumerate(trajs) if now - t.version > self.max_staleness})
        if not stale:
            return trajs
        log.warning("step %d: dropping %d of %d groups staler than %d versions; re-issuing their prompts",
                    trainer.step + 1, len(stale), len(batch), self.max_staleness)
        self.dropped += len(stale)
        self.dropped_total += len(stale)
        fresh = self.pool.gather(self.pool.submit([batch[i].ids for i in stale], pending.params,
                                                  [seeds[i] for i in stale], group_ids=stale, fresh=True))
        for j, g in enumerate(stale):
            trajs[g * n:(g + 1) * n] = fresh[j * n:(j + 1) * n]
        return trajs

    def pop_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped


def fit_async(trainer, batch_size: int, max_staleness: int) -> list[dict]:
    """`trainer.fit()` with rollout k+1 overlapping training on k; `trainer.engine` is a RayEnginePool."""
    pipe = Prefetch(trainer.engine, max_staleness)
    trainer.pipeline = pipe
    stream = trainer.prompt_stream()
    history: list[dict] = []
    try:
        episode = trainer.episode
        cur = list(itertools.islice(stream, batch_size))
        if cur:
            pipe.submit(trainer, cur)
        while cur and trainer.step < trainer.total_steps:
            resume_at = _position(trainer)  # before the look-ahead batch is drawn
            next_episode = trainer.episode
            nxt = list(itertools.islice(stream, batch_size)) if trainer.step + 1 < trainer.total_steps else []
            if nxt:
                pipe.submit(trainer, nxt)  # generated on the workers while `cur` trains below
            metrics = trainer.train_step(cur)
            metrics["episode"] = episode
            history.append(metrics)
            with _rewound(trainer, resume_at):
                for cb in trainer.callbacks:
                    cb(trainer, trainer.step, metrics)
            cur, episode = nxt, next_episode
    finally:
        trainer.pipeline = None
    return history


def _position(trainer) -> tuple:
    order = None if trainer.order is None else list(trainer.order)
    return trainer.episode, order, trainer.index, trainer.sample_gen.get_state()


@contextlib.contextmanager
def _rewound(trainer, position: tuple):
    now = _position(trainer)
    trainer.episode, trainer.order, trainer.index = position[:3]
    trainer.sample_gen.set_state(position[3])
    try:
        yield
    finally:
        trainer.episode, trainer.order, trainer.index = now[:3]
        trainer.sample_gen.set_state(now[3])
