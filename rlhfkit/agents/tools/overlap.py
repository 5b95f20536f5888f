"""Tool latency hidden behind generation: episodes that progress on their own, their turns batched.

In the turn-by-turn schedule (ToolExecutor's default) every unfinished episode generates its turn in
one engine call, then every call of the turn runs, then the next turn: while one slow tool runs,
nothing generates. With `TurnBatcher` each episode runs its own loop (generate, run its calls,
generate again) and asks the batcher for its turns; the batcher sends the turns waiting into one
engine call (in a thread, so the event loop keeps running the tools meanwhile) as soon as no
episode is still in a tool call, or after `linger_s` seconds when one is: an episode waiting on a
slow tool no longer holds the others' next turns back. This is the continuous-batching schedule of
agentic rollouts (verl's agent loop, SkyRL's async rollouts), on a synchronous engine.

`OverlapClock` measures what the schedule achieves: the wall seconds in which a tool call (or a
text environment's step) was running (`tools/busy_s`), the part of them in which the engine was
generating too (`tools/overlap_s`), and how many engine calls started while a tool ran
(`tools/generate_during_tools`). The turn-by-turn schedule has 0 overlap by construction.
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.rollout.base import GenerationEngine, SamplingParams, image_kwargs, turn_kwargs


@dataclass
class OverlapClock:
    """Seconds with a tool running, seconds with a tool and a generation running, engine calls started
    while a tool ran. `enter`/`leave` are called from one thread (the event loop's)."""

    busy_s: float = 0.0
    overlap_s: float = 0.0
    generate_during_tools: int = 0
    tools: int = 0  # tool calls / environment steps running now
    generating: int = 0  # engine calls running now
    since: float = field(default_factory=time.perf_counter)

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.tools:
            self.busy_s += now - self.since
            if self.generating:
                self.overlap_s += now - self.since
        self.since = now

    def enter(self, kind: str) -> None:
        """A tool call (`kind` "tool") or an engine call ("generate") starts."""
        self._tick()
        if kind == "tool":
            self.tools += 1
        else:
            self.generate_during_tools += self.tools > 0
            self.generating += 1

    def leave(self, kind: str) -> None:
        self._tick()
        if kind == "tool":
            self.tools -= 1
        else:
            self.generating -= 1

    def metrics(self) -> dict[str, float]:
        return {"tools/busy_s": self.busy_s, "tools/overlap_s": self.overlap_s,
                "tools/generate_during_tools": float(self.generate_during_tools)}


@dataclass
class _Turn:
    ids: list[int]
    params: SamplingParams
    seed: int | None
    done: asyncio.Future
    vision: Any = None  # the episode's image tensors (a vision-language policy), None without images
    key: object = None  # the episode's name to an engine that keeps its KV cache across turns


class TurnBatcher:
    """Turns of independent episodes -> batched `engine.generate` calls (see the module docstring).

    Args:
      engine: the generation engine (called from a worker thread, one call at a time).
      clock: counts tool and generation time; its `tools` is how many tool calls run now.
      generator: seeds the calls of turns without a seed.
      linger_s: how long turns wait for episodes still in a tool call before they generate without them.
    """

    def __init__(self, engine: GenerationEngine, clock: OverlapClock, generator: torch.Generator | None = None,
                 linger_s: float = 0.05):
        self.engine, self.clock, self.generator, self.linger_s = engine, clock, generator, linger_s
        self.waiting: list[_Turn] = []
        self.changed = asyncio.Event()  # a turn arrived or a tool call ended
        self.running: asyncio.Task | None = None

    async def generate(self, ids: list[int], params: SamplingParams, seed: int | None,
                       vision: Any = None, key=None) -> Trajectory:
        """One turn of one episode (prompt + response so far -> its next action); `vision`: the episode's
        image tensors (data.images.VisionInputs) for a VisionEngine, None without images; `key` names the
        episode (rollout.base.turn_kwargs)."""
        turn = _Turn(ids, params, seed, asyncio.get_running_loop().create_future(), vision, key)
        self.waiting.append(turn)
        self.poke()
        if self.running is None:
            self.running = asyncio.create_task(self._dispatch())
        return await turn.done

    def poke(self) -> None:
        """Wake the dispatcher: a tool call ended (the episode may be about to ask for its turn)."""
        self.changed.set()

    async def tool(self, work: Awaitable):
        """`await work` counted as a tool call (the dispatcher knows an episode is busy)."""
        self.clock.enter("tool")
        try:
            return await work
        finally:
            self.clock.leave("tool")
            self.poke()

    async def _dispatch(self) -> None:
        try:
            while self.waiting:
                await self._linger()
                turns, self.waiting = self.waiting, []
                await self._generate(turns)
        finally:
            self.running = None

    async def _linger(self) -> None:
        """Wait (at most linger_s) while episodes are in tool calls, so their turns join this call."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        await asyncio.sleep(0)  # the turns asked for in this same pass of the event loop join
        while self.clock.tools and loop.time() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            await asyncio.sleep(0)

    async def _generate(self, turns: list[_Turn]) -> None:
        """One engine call per distinct sampling params (and seededness), in a thread."""
        groups: dict[tuple[SamplingParams, bool], list[_Turn]] = {}
        for t in turns:
            groups.setdefault((t.params, t.seed is not None), []).append(t)
        for (params, seeded), group in groups.items():
            ids = [t.ids for t in group]
            kwargs = {"seeds": [t.seed for t in group]} if seeded else {"generator": self.generator}
            kwargs.update(image_kwargs(group))  # a VisionEngine takes each episode's images
            if all(t.key is not None for t in group):
                kwargs.update(turn_kwargs(self.engine, [t.key for t in group]))
            self.clock.enter("generate")
            try:
                outs = await asyncio.to_thread(self.engine.generate, ids, params, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every episode waiting on this call sees it
                for t in group:
                    t.done.set_exception(exc)
                continue
            finally:
                self.clock.leave("generate")
            for t, out in zip(group, outs):
                t.done.set_result(out)


class QuietStdout:
    """What tools print, dropped while any of them runs: one capture that coroutines interleaving on
    the event loop share (nested `redirect_stdout`s that exit out of order would leave a buffer as
    sys.stdout); the first to enter saves sys.stdout, the last to leave restores it."""

    def __init__(self):
        self.depth, self.saved = 0, None

    def __enter__(self) -> None:
        if self.depth == 0:
            self.saved, sys.stdout = sys.stdout, io.StringIO()
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth == 0:
            sys.stdout, self.saved = self.saved, None
