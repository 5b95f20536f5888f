"""HF causal LMs: loading (policy, teacher, GGUF) and saving, tiny models, critic / reward heads, logprobs, LoRA.
May import core (docs/architecture.md)."""

from rlhfkit.models.critic import Critic
from rlhfkit.models.loading import (
    load_causal_lm,
    load_tokenizer,
    materialize_smollm2,
    save_hf_folder,
    smollm2_gguf_path,
)
from rlhfkit.models.logprobs import response_logits, response_logprobs
from rlhfkit.models.tiny import tiny_model_and_tokenizer, tiny_tokenizer

__all__ = [
    "Critic",
    "load_causal_lm",
    "load_tokenizer",
    "materialize_smollm2",
    "save_hf_folder",
    "response_logits",
    "response_logprobs",
    "smollm2_gguf_path",
    "tiny_model_and_tokenizer",
    "tiny_tokenizer",
]
