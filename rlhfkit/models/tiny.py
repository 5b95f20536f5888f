"""A tiny Llama and a character-level tokenizer, built in code, for tests and demos.

Nothing is read from a hub or from disk. The tokenizer has one token per character of a small
alphabet (digits, letters, arithmetic and punctuation, space, newline) plus <pad>, <bos>, <eos>,
and a minimal chat template so `apply_chat_template` works. Both round-trip through
`save_pretrained` / `from_pretrained`.
"""

from __future__ import annotations

import string

import torch

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
ALPHABET = string.digits + string.ascii_letters + " \n+-*/=()?!.,:;'\"<>|_#%"

# One turn per message, closed by EOS; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '" + EOS + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def tiny_tokenizer():
    """A char-level `PreTrainedTokenizerFast` over `ALPHABET` with <pad>/<bos>/<eos>/<unk>.

    Padding side is left to callers (default right). Vocab size = 4 + len(ALPHABET).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split into single characters (each character is its own "word").
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
    )
    return tok


def tiny_model_and_tokenizer(
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 512,
    tie_embeddings: bool = False,
    init_std: float = 0.1,
):
    """A randomly initialised `LlamaForCausalLM` (deterministic given `seed`) and its tokenizer.

    The vocabulary is the tokenizer's (see `tiny_tokenizer`); the model is in fp32, eval mode.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=tie_embeddings,
        initializer_range=init_std,  # larger than Llama's 0.02 so outputs are not near-uniform
    )
    cpu_rng = torch.random.get_rng_state()
    try:  # seed only for the init, then give the caller's global RNG back untouched
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(cpu_rng)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok
