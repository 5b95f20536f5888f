"""The prompts in training order, each with its sampling seed (the data position of a run).

Each episode is a fresh shuffle of the prompts (by the trainer's shuffle generator) cut to whole
rollout batches. Every prompt taken gets a sampling seed from the sample generator at that moment,
so a prompt's samples do not depend on how an engine pool shards a batch, and a re-issued prompt
regenerates the same samples. `peek` draws a batch ahead (async rollout) without moving the
position that a checkpoint records: a resumed run draws that batch again, with the same seeds.
`take_topup` is the second cursor, for dynamic-filtering top-ups while a batch is drawn ahead: it
draws past that batch, and the position records how many prompts it drew there, so that a resumed
run, after drawing the batch again, skips them (drawn and dropped, seeds included): every prompt is
trained once, in the uninterrupted run's order.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlhfkit.data.types import PromptItem
from rlhfkit.errors import CheckpointError, DataError


@dataclass
class PromptBatch:
    """Prompts and one sampling seed per prompt."""

    prompts: list[PromptItem]
    seeds: list[int]

    def __len__(self) -> int:
        return len(self.prompts)


class PromptStream:
    """The data position of an RL run: episode, its shuffled order, the next prompt in it.

    `prompts`: the dataset; `batch_size`: prompts per rollout batch; `shuffle_gen` draws each
    episode's order, `sample_gen` the sampling seeds (both owned by the caller, seeded)."""

    def __init__(self, prompts: list[PromptItem], batch_size: int, num_episodes: int,
                 shuffle_gen: torch.Generator, sample_gen: torch.Generator):
        self.prompts, self.batch_size, self.num_episodes = list(prompts), batch_size, num_episodes
        self.shuffle_gen, self.sample_gen = shuffle_gen, sample_gen
        self.rollouts_per_episode = len(self.prompts) // batch_size
        if self.rollouts_per_episode == 0:
            raise DataError(
                f"the prompt dataset has {len(self.prompts)} usable prompts, fewer than "
                f"--rollout.batch_size {batch_size}; lower the batch size or add prompts"
            )
        self._episode, self.order, self.index = 0, None, 0
        self.ahead: deque[PromptBatch] = deque()  # drawn by peek, not yet taken
        self.snapshot: dict | None = None  # the position before the first batch drawn ahead
        self.topups: list[int] = []  # sizes of top-ups drawn past the batches ahead (or, resumed, to skip)
        self._digest: str | None = None

    @property
    def episode(self) -> int:
        """The episode of the next batch that `take` returns."""
        return self.snapshot["episode"] if self.snapshot is not None else self._episode

    def rollout_batches(self) -> Iterator[PromptBatch]:
        """The rest of the current episode, one rollout batch at a time."""
        episode = self.episode
        while self.episode == episode:
            batch = self.take(self.batch_size)
            if not batch:
                return
            yield batch

    def take(self, n: int) -> PromptBatch:
        """The next `n` prompts (fewer, or none, when the last episode runs out), across episodes."""
        if self.ahead:
            batch = self.ahead.popleft()
            if len(batch) > n:
                raise RuntimeError(f"PromptStream: asked for {n} prompts, {len(batch)} were drawn ahead (a bug)")
            if not self.ahead:
                self.snapshot, self.topups = None, []
            return batch
        batch = self._draw(n)
        for m in self.topups:  # a resumed run: the top-ups the checkpointed run drew past this batch
            self._draw(m)
        self.topups = []
        return batch

    def take_topup(self, n: int) -> PromptBatch:
        """The next `n` prompts for a dynamic-filtering top-up: `take(n)`, or while batches are drawn
        ahead, the prompts past them (they stay next for `take`; the position records the top-up)."""
        if not self.ahead:
            return self.take(n)
        batch = self._draw(n)
        self.topups.append(len(batch))
        return batch

    def _draw(self, n: int) -> PromptBatch:
        prompts = []
        while len(prompts) < n and (p := self._next_prompt()) is not None:
            prompts.append(p)
        seeds = torch.randint(0, 2**62, (len(prompts),), generator=self.sample_gen).tolist() if prompts else []
        return PromptBatch(prompts, seeds)

    def peek(self, n: int) -> PromptBatch:
        """Draw the next `n` prompts ahead: `take(n)` returns them next; until then `state_dict`
        keeps the position before them."""
        if self.snapshot is None:
            self.snapshot = self._position()
        batch = self._draw(n)
        self.ahead.append(batch)
        return batch

    def _next_prompt(self) -> PromptItem | None:
        if self._episode >= self.num_episodes:
            return None
        if self.order is None:
            n = self.rollouts_per_episode * self.batch_size
            self.order = torch.randperm(len(self.prompts), generator=self.shuffle_gen).tolist()[:n]
        prompt = self.prompts[self.order[self.index]]
        self.index += 1
        if self.index == len(self.order):
            self._episode, self.order, self.index = self._episode + 1, None, 0
        return prompt

    def _position(self) -> dict:
        return {"episode": self._episode, "order": None if self.order is None else list(self.order),
                "index": self.index, "sample_gen": self.sample_gen.get_state()}

    def state_dict(self) -> dict:
        """The position of the next batch not yet taken (batches drawn ahead are drawn again on resume,
        the top-ups drawn past them skipped)."""
        state = dict(self.snapshot if self.snapshot is not None else self._position())
        state.update(num_prompts=len(self.prompts), rollout_batch_size=self.batch_size,
                     shuffle_gen=self.shuffle_gen.get_state(), topups=list(self.topups),
                     prompts_digest=self.digest())
        return state

    def digest(self) -> str:
        """A fingerprint of the prompts' token ids, in dataset order (computed once): a resumed run
        checks that it reads the same prompts (the same data, mix and seed), not only as many."""
        if self._digest is None:
            h = hashlib.sha256()
            for p in self.prompts:
                h.update(array("q", [len(p.ids), *p.ids]).tobytes())
            self._digest = h.hexdigest()
        return self._digest

    def load_state_dict(self, state: dict) -> None:
        here = (len(self.prompts), self.batch_size)
        there = (state["num_prompts"], state["rollout_batch_size"])
        if here != there:
            raise CheckpointError(
                f"the checkpoint was written with {there[0]} prompts and --rollout.batch_size {there[1]}, this run "
                f"has {here[0]} and {here[1]}; resume with the same data and flags, or use a new --ckpt.output_dir"
            )
        if state.get("prompts_digest", self.digest()) != self.digest():  # checkpoints before it have none
            raise CheckpointError(
                "the checkpoint was written with other prompts (as many, in another order or with other text: "
                "another dataset, --data.prompt_probs or --train.seed); resume with the same data and flags, "
                "or use a new --ckpt.output_dir")
        self._episode, self.order, self.index = state["episode"], state["order"], state["index"]
        self.sample_gen.set_state(state["sample_gen"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        self.ahead.clear()
        self.snapshot, self.topups = None, list(state.get("topups", []))
