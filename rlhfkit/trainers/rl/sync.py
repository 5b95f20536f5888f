"""The sync stage of the RL loop: the updated policy's weights to the generation engine."""

from __future__ import annotations

from rlhfkit.rollout.base import GenerationEngine


def sync_weights(engine: GenerationEngine) -> int:
    """Hand the updated policy to the engine; returns the new policy version. The HF engine shares
    the policy module (a version bump); others pull the weights (vLLM, Ray workers)."""
    engine.update_weights({}, engine.version + 1)
    return engine.version
