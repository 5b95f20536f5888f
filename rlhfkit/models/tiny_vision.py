"""Tiny random vision-language models and their processors, built in code, for tests and demos.

`tiny_vision_model_and_processor(family)` builds a 2-layer language model with a 1-layer vision
tower of one of three families, with random weights and the family's own processor (image
processor, tokenizer with the family's image tokens, chat template), nothing read from a hub or
from disk:

  qwen2_vl  Qwen2-VL: a ViT over 14-pixel patches merged 2x2, images of any size as a variable
            number of tokens, M-RoPE (3-D positions: time, height, width) in the language model
  llava     LLaVA: a CLIP vision tower, an MLP projector, a Llama language model; one image is a
            fixed number of tokens
  gemma3    Gemma 3: a SigLIP vision tower, pooled to a fixed number of soft tokens, a Gemma 3
            text model with sliding and full layers; image tokens attend to each other both ways

The tokenizer is models.tiny's character-level tokenizer with the family's image tokens added.
Images are made small (28 to 56 pixels a side) so that a forward runs in milliseconds on a CPU.
The Qwen2-VL processor is built image-only (no video processor, see models.vision).

`python -m rlhfkit.models.tiny_vision OUT [--family F] [--seed S]` writes one as an HF folder
(weights, config, processor) that `rlhfkit train rl|sft|dpo --actor.model_name_or_path OUT` loads.
"""

from __future__ import annotations

import torch

from rlhfkit.models.tiny import BOS, EOS, PAD, tiny_tokenizer
from rlhfkit.models.vision import image_only_processor

FAMILIES = ("qwen2_vl", "llava", "gemma3")

# A chat template that renders {"type": "image"} content parts as the family's image placeholder
# and text parts as their text (string contents as they are), one turn per message closed by EOS.
_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}IMAGE{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}" + EOS + "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 512}


def _ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def _text_ids(tok) -> dict:
    pad, bos, eos = _ids(tok, PAD, BOS, EOS)
    return {"vocab_size": len(tok), "pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos}


def _qwen2_vl():
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
        Qwen2VLProcessor,
    )

    tok = tiny_tokenizer()
    start, pad, end, video = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
    tok.add_special_tokens({"additional_special_tokens": [start, pad, end, video]})
    ip = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2,
                                  temporal_patch_size=2)
    processor = image_only_processor(Qwen2VLProcessor)(image_processor=ip, tokenizer=tok,
                                                       chat_template=_TEMPLATE.replace("IMAGE", start + pad + end))
    ids = _ids(tok, pad, video, start, end)
    config = Qwen2VLConfig(
        text_config={**_TEXT, **_text_ids(tok), "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
        image_token_id=ids[0], video_token_id=ids[1], vision_start_token_id=ids[2], vision_end_token_id=ids[3])
    return Qwen2VLForConditionalGeneration, config, processor


def _llava():
    from transformers import (
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaImageProcessorPil,
        LlavaProcessor,
    )

    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    size = 28
    ip = LlavaImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                do_center_crop=True, do_pad=False)
    processor = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=_TEMPLATE.replace("IMAGE", "<image>"))
    config = LlavaConfig(
        vision_config={"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": size, "patch_size": 14,
                       "projection_dim": 32},
        text_config={"model_type": "llama", **_TEXT, **_text_ids(tok)},
        image_token_id=_ids(tok, "<image>")[0], vision_feature_select_strategy="default", vision_feature_layer=-1)
    return LlavaForConditionalGeneration, config, processor


def _gemma3():
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        PreTrainedTokenizerFast,
    )

    boi, soft, eoi = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
    base = tiny_tokenizer()
    base.add_special_tokens({"additional_special_tokens": [boi, soft, eoi]})
    tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, pad_token=PAD, bos_token=BOS,
                                  eos_token=EOS, unk_token="<unk>",
                                  extra_special_tokens={"boi_token": boi, "image_token": soft, "eoi_token": eoi})
    size, tokens_per_image = 28, 4
    ip = Gemma3ImageProcessorPil(size={"height": size, "width": size})
    processor = Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=tokens_per_image,
                                chat_template=_TEMPLATE.replace("IMAGE", boi))
    ids = _ids(tok, boi, soft, eoi)
    config = Gemma3Config(
        text_config={**_TEXT, **_text_ids(tok), "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 8,
                     "layer_types": ["sliding_attention", "full_attention"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": size, "patch_size": 7},
        mm_tokens_per_image=tokens_per_image, boi_token_index=ids[0], image_token_index=ids[1],
        eoi_token_index=ids[2])
    return Gemma3ForConditionalGeneration, config, processor


_BUILDERS = {"qwen2_vl": _qwen2_vl, "llava": _llava, "gemma3": _gemma3}


def tiny_vision_model_and_processor(family: str = "qwen2_vl", seed: int = 0):
    """(model, processor) of `family` (one of FAMILIES): random weights drawn with `seed`, float32,
    eval mode, SDPA attention. The processor's tokenizer pads on the right."""
    if family not in _BUILDERS:
        raise ValueError(f"unknown tiny vision family {family!r}; choose one of {', '.join(FAMILIES)}")
    model_cls, config, processor = _BUILDERS[family]()
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
        for name, p in model.named_parameters():  # Gemma 3 starts its projector at zero: images would do nothing
            if "projector" in name and p.dim() > 1 and not p.detach().any():
                torch.nn.init.normal_(p.detach(), std=1.0 / p.shape[0] ** 0.5)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.bos_token_id = processor.tokenizer.bos_token_id
    return model.eval(), processor


def save_tiny_vision(out, family: str = "qwen2_vl", seed: int = 0):
    """Write `tiny_vision_model_and_processor(family, seed)` as an HF folder `out`; returns its path."""
    from pathlib import Path

    model, processor = tiny_vision_model_and_processor(family, seed)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write a tiny random vision-language model as an HF folder.")
    parser.add_argument("out")
    parser.add_argument("--family", default="qwen2_vl", choices=FAMILIES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(save_tiny_vision(args.out, args.family, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
