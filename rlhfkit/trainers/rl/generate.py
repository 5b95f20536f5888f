"""The generate stage: prompts (with their seeds) -> trajectories, token-in token-out.

`RolloutSource` is what the RL loop asks for the trajectories of a rollout batch. `Generate` is the
synchronous source: it runs the executor (single-turn, or an agent's episodes) on the engine now.
An asynchronous source (rlhfkit.distributed.async_loop.Prefetch) generates batches ahead on other
workers and hands them over when asked, with the same contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import TrainingError
from rlhfkit.rollout.base import GenerationEngine, SamplingParams
from rlhfkit.trainers.rl.stream import PromptBatch

Upcoming = Callable[[], PromptBatch]  # draws the next rollout batch ahead (PromptStream.peek)


class RolloutSource(Protocol):
    """Trajectories for a rollout batch: `batch.prompts[i]`'s samples carry group_id i."""

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        """The trajectories of `batch`. `upcoming`, when given, draws the batch the loop will ask for
        next (a source may start generating it now); None when no step follows."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """Counters since the last call (e.g. groups dropped as too stale)."""
        ...


class Generate:
    """The synchronous source: `executor.run` on `engine` with one seed per prompt."""

    def __init__(self, executor, engine: GenerationEngine, tokenizer, params: SamplingParams, budget: TokenBudget):
        self.executor, self.engine, self.tokenizer = executor, engine, tokenizer
        self.params, self.budget = params, budget

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        try:
            return self.executor.run(self.engine, self.tokenizer, batch.prompts, self.params, self.budget,
                                     seeds=batch.seeds)
        except RuntimeError as exc:  # the engine refuses NaN/inf probabilities
            if "inf" not in str(exc) and "nan" not in str(exc):
                raise
            raise TrainingError(
                "the policy's next-token probabilities are NaN/inf (its weights diverged or were loaded with "
                "NaN/inf); lower --actor.adam.lr and resume from the last good checkpoint with "
                "--ckpt.load_enable true, or check the model folder"
            ) from exc

    def pop_metrics(self) -> dict[str, float]:
        """The executor's counters (tool calls, template checks), where it keeps any."""
        pop = getattr(self.executor, "pop_metrics", None)
        return pop() if pop is not None else {}
