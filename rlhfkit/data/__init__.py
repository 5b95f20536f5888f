"""Datasets (prompts, SFT, preference, steps), prompt tokenization, PromptItem, Trajectory, padding, packing.
May import core (docs/architecture.md)."""

from rlhfkit.data.prompts import PromptExample, load_prompts

__all__ = ["PromptExample", "load_prompts"]
