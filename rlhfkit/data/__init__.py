"""Prompt / SFT / preference datasets, typed batches, padding and packing."""

from rlhfkit.data.prompts import PromptExample, load_prompts

__all__ = ["PromptExample", "load_prompts"]
