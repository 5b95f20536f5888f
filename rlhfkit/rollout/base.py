"""The generation-engine protocol every rollout backend implements (HF, vLLM, remote workers)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from rlhfkit.data.types import Trajectory


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` means greedy decoding."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = no top-k truncation
    n: int = 1  # samples per prompt
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # EOS is always a stop token
    # CTRL's repetition penalty (Keskar et al. 2019; transformers' and vLLM's `repetition_penalty`): the logit
    # of a token already in the prompt or the response is divided by it where positive, multiplied where
    # negative, in the choice of the token only (the logprob stays the model's, like top-k / top-p). 1 = off.
    repetition_penalty: float = 1.0


@runtime_checkable
class GenerationEngine(Protocol):
    """Generates responses token-in, token-out and takes new weights with a version stamp."""

    @property
    def version(self) -> int:
        """The policy version whose weights the engine currently holds."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """Sample `params.n` responses for each prompt.

        Returns len(prompts) * n trajectories, the n samples of prompt i at [i*n, (i+1)*n),
        each stamped with the version of the weights that generated them and `group_ids[i]`
        (default i). With `seeds` (one int per prompt), prompt i's samples depend only on its
        ids, the weights and seeds[i], not on the other prompts of the call (so prompts can be
        sharded over engines and re-issued); otherwise `generator` seeds the whole call.
        """
        ...

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state` (a model state dict, possibly partial) and set `version`."""
        ...


# An optional hint on top of the protocol: an engine whose `keeps_turns` is True takes
# `generate(..., episode_keys=[one hashable per prompt])` (the prompts are turns of these episodes:
# it may keep each episode's KV cache for its next turn, whose prompt extends this one) and
# `end_episodes(keys)` (those episodes are finished: free what it kept). Engines without the attribute
# never see either; vLLM keeps prefixes by content on its own (automatic prefix caching).


def turn_kwargs(engine, keys: Sequence[Hashable]) -> dict:
    """`{"episode_keys": keys}` for an engine that keeps an episode's KV cache across its turns
    (rollout.hf.HFEngine), else {} (every engine's generate)."""
    return {"episode_keys": list(keys)} if getattr(engine, "keeps_turns", False) else {}


def end_episodes(engine, keys: Sequence[Hashable]) -> None:
    """Tell an engine that keeps episodes' KV caches across turns that the episodes `keys` are finished."""
    if keys and getattr(engine, "keeps_turns", False):
        engine.end_episodes(list(keys))


def image_kwargs(prompts) -> dict:
    """`{"vision": [...]}`: the prompts' image tensors (PromptItem.vision) for an engine that takes them
    (rollout.vision.VisionEngine), or {} when no prompt holds images (every engine's generate)."""
    images = [getattr(p, "vision", None) for p in prompts]
    return {"vision": images} if any(v is not None for v in images) else {}
