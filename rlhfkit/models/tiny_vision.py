"""Tiny random vision-language models and their processors, built in code, for tests and demos.

`tiny_vision_model_and_processor(family)` builds a 2-layer language model with a 1-layer vision
tower of one of FAMILIES, with random weights and the family's own processor (image processor,
tokenizer with the family's image tokens, chat template), nothing read from a hub or from disk:

  qwen2_vl      Qwen2-VL: a ViT over 14-pixel patches merged 2x2, images of any size as a variable
                number of tokens, M-RoPE (3-D positions: time, height, width) in the language model
  qwen2_5_vl    Qwen2.5-VL: the same with window attention in the tower
  qwen3_vl      Qwen3-VL: 16-pixel patches, interleaved M-RoPE, deepstack features fed to the
                language model's first layer; qwen3_vl_moe: with mixture-of-experts MLPs
  qwen3_5       Qwen3.5: Qwen3-VL's tower, a Gated DeltaNet (linear attention) layer and a
                full-attention layer with partial rotary positions
  llava         LLaVA: a CLIP vision tower, an MLP projector, a Llama language model; one image is a
                fixed number of tokens
  gemma3        Gemma 3: a SigLIP vision tower, pooled to a fixed number of soft tokens, a Gemma 3
                text model with sliding and full layers; image tokens attend to each other both ways
  gemma4        Gemma 4: a variable number of pooled soft tokens per image, per-layer input
                embeddings, bidirectional attention within an image in the sliding layers
  smolvlm       SmolVLM (and idefics3, its base): each image split into sub-images plus the whole,
                a SigLIP tower per sub-image, pixel shuffle, a Llama language model
  internvl      InternVL: each image cut into tiles plus a thumbnail, pixel shuffle, a Qwen2 model
  llava_next    LLaVA-NeXT: anyres (each image resized to the best grid of tiles, every tile and the whole
                through the tower, unpadded to its aspect ratio with a newline token a row), `image_sizes`;
                llava_onevision: LLaVA-OneVision, the same layout over a SigLIP tower and a Qwen2 model
  glm4v         GLM-4.1V: a Qwen2-VL-like tower, 3-D rotary positions from the model's get_rope_index
  paligemma     PaliGemma: a prefix LM, its images and prompt attending both ways, its response causally
                (token_type_ids 0 and 1)
  aya_vision    Aya Vision: tiles plus a thumbnail, pixel shuffle, a Cohere 2 model with sliding layers
  mllama        Llama 3.2 Vision: one token an image, its tiles' features read by a cross-attention layer
                through a per-token cross_attention_mask
  mistral3      Mistral 3: a Pixtral tower (images of any size, 2-D rotary positions), patches merged 2x2,
                a row-break token after each row of image tokens, a Mistral language model

The tokenizer is models.tiny's character-level tokenizer with the family's image tokens added
(Qwen3.5's as its own byte-level tokenizer class, which transformers loads its folders with).
Images are made small (28 to 56 pixels a side) so that a forward runs in milliseconds on a CPU.
Processors whose video (or audio) part needs torchvision are built image-only (models.vision).

`python -m rlhfkit.models.tiny_vision OUT [--family F] [--seed S]` writes one as an HF folder
(weights, config, processor) that `rlhfkit train rl|sft|dpo --actor.model_name_or_path OUT` loads.
"""

from __future__ import annotations

import torch

from rlhfkit.models.tiny import ALPHABET, BOS, EOS, PAD, SPECIAL_TOKENS, UNK, tiny_tokenizer
from rlhfkit.models.vision import image_only_processor

FAMILIES = ("qwen2_vl", "llava", "gemma3", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "smolvlm", "idefics3", "qwen3_5",
            "gemma4", "internvl", "llava_next", "llava_onevision", "glm4v", "paligemma", "aya_vision", "mllama",
            "mistral3")

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


def _qwen_processor(processor_cls, patch_size: int = 14, tok=None):
    """(processor, {image_token_id, video_token_id, vision_start_token_id, vision_end_token_id}) of a
    Qwen-VL family: the character tokenizer (or `tok`) with Qwen's vision tokens, the PIL image processor
    making images of 28 to 56 pixels (2 to 4 patches a side, merged 2x2), image-only (no video processor)."""
    from transformers import Qwen2VLImageProcessorPil

    tok = tok or tiny_tokenizer()
    start, pad, end, video = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
    tok.add_special_tokens({"additional_special_tokens": [start, pad, end, video]})
    side = 2 * patch_size
    ip = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=4 * side * side, patch_size=patch_size,
                                  merge_size=2, temporal_patch_size=2)
    processor = image_only_processor(processor_cls)(image_processor=ip, tokenizer=tok,
                                                    chat_template=_TEMPLATE.replace("IMAGE", start + pad + end))
    ids = dict(zip(("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"),
                   _ids(tok, pad, video, start, end)))
    return processor, ids


def _qwen_vision(patch_size: int = 14, **more) -> dict:
    """A 1-layer Qwen-VL vision tower of width 32 whose merger projects to the language model's width."""
    return {"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": patch_size, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "in_channels": 3, **more}


def _qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    processor, ids = _qwen_processor(Qwen2VLProcessor)
    config = Qwen2VLConfig(
        text_config={**_TEXT, **_text_ids(processor.tokenizer), "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
        vision_config=_qwen_vision(embed_dim=32, mlp_ratio=2), **ids)
    return Qwen2VLForConditionalGeneration, config, processor


def _qwen2_5_vl():
    """Qwen2.5-VL: Qwen2-VL's M-RoPE, a tower with window attention (windows of one merged 2x2 patch
    group, so that a 2x2-group image is reordered into 4 windows) and RMSNorm / gated MLPs."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    processor, ids = _qwen_processor(Qwen2_5_VLProcessor)
    config = Qwen2_5_VLConfig(
        text_config={**_TEXT, **_text_ids(processor.tokenizer), "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
        vision_config=_qwen_vision(intermediate_size=64, out_hidden_size=32, window_size=28,
                                   fullatt_block_indexes=[]), **ids)
    return Qwen2_5_VLForConditionalGeneration, config, processor


def _qwen3_vl(moe: bool = False):
    """Qwen3-VL: 16-pixel patches, interleaved M-RoPE, and deepstack: the tower's layer 0 features are
    added to the image tokens' hidden states after the language model's first layer. `moe`: Qwen3-VL-MoE,
    its MLPs mixtures of 4 experts (2 per token)."""
    import transformers

    name = "Qwen3VLMoe" if moe else "Qwen3VL"
    processor, ids = _qwen_processor(transformers.Qwen3VLProcessor, patch_size=16)
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32} if moe else {}
    config = getattr(transformers, f"{name}Config")(
        text_config={**_TEXT, **_text_ids(processor.tokenizer), **experts, "head_dim": 8, "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
        vision_config=_qwen_vision(16, intermediate_size=64, out_hidden_size=32, num_position_embeddings=16,
                                   deepstack_visual_indexes=[0]), **ids)
    return getattr(transformers, f"{name}ForConditionalGeneration"), config, processor


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


def _tokenizer_with(specials: dict):
    """The character tokenizer with `specials` (name -> token, e.g. {"image_token": "<image_soft_token>"}) as
    named special tokens: the tokenizer has `tok.image_token` and `tok.image_token_id`, as Gemma's processors read."""
    from transformers import PreTrainedTokenizerFast

    base = tiny_tokenizer()
    base.add_special_tokens({"additional_special_tokens": list(specials.values())})
    return PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token="<unk>", extra_special_tokens=specials)


def _gemma3():
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
    )

    boi, soft, eoi = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
    tok = _tokenizer_with({"boi_token": boi, "image_token": soft, "eoi_token": eoi})
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


def _byte_level_tokenizer():
    """The character tokenizer as Qwen3.5's own tokenizer class (byte-level BPE, no merges: one token a
    character), which transformers loads a qwen3_5 folder's tokenizer with whatever class it names."""
    from transformers import Qwen3_5Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte[ord(ch)]: len(SPECIAL_TOKENS) + i for i, ch in enumerate(ALPHABET)})  # ASCII: one byte each
    return Qwen3_5Tokenizer(vocab=vocab, merges=[], unk_token=UNK, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def _qwen3_5():
    """Qwen3.5: Qwen3-VL's tower (no deepstack) under a hybrid language model: a Gated DeltaNet
    (linear attention, a recurrent state and a causal convolution) layer, then a full-attention
    layer with partial rotary positions (half of each head)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor

    processor, ids = _qwen_processor(Qwen3VLProcessor, patch_size=16, tok=_byte_level_tokenizer())
    config = Qwen3_5Config(
        text_config={**_TEXT, **_text_ids(processor.tokenizer), "head_dim": 16,
                     "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
                     "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
                     "linear_num_value_heads": 4, "rope_parameters": {
                         "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True, "partial_rotary_factor": 0.5}},
        vision_config=_qwen_vision(16, intermediate_size=64, out_hidden_size=32, num_position_embeddings=16), **ids)
    return Qwen3_5ForConditionalGeneration, config, processor


def _gemma4():
    """Gemma 4: a vision tower over 4-pixel patches with 2-D rotary positions, pooled 2x2 into soft
    tokens (a variable number per image: its aspect ratio kept within 70 tokens), a language model with
    per-layer input embeddings, sliding and full layers, image tokens attending to each other both ways
    in the sliding layers; the processor built image-only (no audio feature extractor, no video)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4ImageProcessorPil, Gemma4Processor

    specials = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>",
                "boa_token": "<start_of_audio>", "audio_token": "<audio_soft_token>", "eoa_token": "<end_of_audio>"}
    tok = _tokenizer_with(specials)
    ip = Gemma4ImageProcessorPil(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
    processor = image_only_processor(Gemma4Processor)(image_processor=ip, tokenizer=tok, image_seq_length=70,
                                                      chat_template=_TEMPLATE.replace("IMAGE", specials["image_token"]))
    ids = dict(zip(("boi_token_id", "image_token_id", "eoi_token_id", "boa_token_id", "audio_token_id",
                    "eoa_token_index", "video_token_id"),
                   _ids(tok, *specials.values(), processor.video_token)))
    config = Gemma4Config(
        text_config={**_TEXT, **_text_ids(tok), "head_dim": 8, "global_head_dim": 8, "sliding_window": 8,
                     "layer_types": ["sliding_attention", "full_attention"], "hidden_size_per_layer_input": 8,
                     "vocab_size_per_layer_input": len(tok), "use_bidirectional_attention": "vision"},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4, "pooling_kernel_size": 2,
                       "position_embedding_size": 64},
        audio_config=None, **ids)
    return Gemma4ForConditionalGeneration, config, processor


def _internvl():
    """InternVL: each image cut into 28-pixel tiles (up to 4, with a thumbnail of the whole when there are
    several), an InternViT tower over 7-pixel patches, pixel shuffle (16 patches -> 4 tokens a tile) and an
    MLP projector, a Qwen2 language model; the processor built image-only (no video processor)."""
    from transformers import (
        GotOcr2ImageProcessorPil,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
    )

    specials = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>"}
    tok = _tokenizer_with(specials)
    ip = GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=True, min_patches=1, max_patches=4)
    processor = image_only_processor(InternVLProcessor)(
        image_processor=ip, tokenizer=tok, image_seq_length=4,
        chat_template=_TEMPLATE.replace("IMAGE", specials["context_image_token"]))
    config = InternVLConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": [28, 28], "patch_size": [7, 7]},
        text_config={"model_type": "qwen2", **_TEXT, **_text_ids(tok)}, image_seq_length=4, downsample_ratio=0.5,
        image_token_id=_ids(tok, specials["context_image_token"])[0])
    return InternVLForConditionalGeneration, config, processor


def _idefics_processor(processor_cls, image_processor_cls, **settings):
    """(processor, image token id) of an Idefics3-style processor: the character tokenizer with its image
    tokens; images resized to 56 pixels on their longest side and split into 28-pixel sub-images (a
    56 x 56 image: 2 x 2 sub-images and the whole image shrunk to 28 x 28, a 56 x 28 one: 1 x 2 and
    the whole), each 4 image tokens (28-pixel frames of 7-pixel patches, pixel-shuffled by 2)."""
    fake, image, glob = "<fake_token_around_image>", "<image>", "<global-img>"
    tok = tiny_tokenizer()
    rows = [f"<row_{r}_col_{c}>" for r in range(1, 3) for c in range(1, 3)]
    tok.add_special_tokens({"additional_special_tokens": [fake, image, glob, "<end_of_utterance>", *rows]})
    ip = image_processor_cls(size={"longest_edge": 56}, max_image_size={"longest_edge": 28}, do_image_splitting=True)
    processor = processor_cls(image_processor=ip, tokenizer=tok, image_seq_len=4,
                              chat_template=_TEMPLATE.replace("IMAGE", image), **settings)
    return processor, _ids(tok, image)[0]


def _idefics_config(config_cls, tok, image_token_id):
    return config_cls(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 7},
        text_config={"model_type": "llama", **_TEXT, **_text_ids(tok)}, scale_factor=2, image_token_id=image_token_id)


def _smolvlm():
    """SmolVLM: a SigLIP tower over each sub-image, pixel shuffle and a linear connector, a Llama
    language model; its processor built image-only (its video processor needs torchvision)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessorPil,
        SmolVLMProcessor,
    )

    processor, image = _idefics_processor(image_only_processor(SmolVLMProcessor), SmolVLMImageProcessorPil)
    return SmolVLMForConditionalGeneration, _idefics_config(SmolVLMConfig, processor.tokenizer, image), processor


def _idefics3():
    """Idefics3: SmolVLM's architecture (SmolVLM is built on it) with its own processor (images only)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    processor, image = _idefics_processor(Idefics3Processor, Idefics3ImageProcessorPil)
    return Idefics3ForConditionalGeneration, _idefics_config(Idefics3Config, processor.tokenizer, image), processor


def _clip(size: int, model_type: str = "clip_vision_model", **more) -> dict:
    """A 1-layer CLIP / SigLIP tower of width 32 over `size`-pixel images of 14-pixel patches."""
    return {"model_type": model_type, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "image_size": size, "patch_size": 14, **more}


def _llava_next(onevision: bool = False):
    """LLaVA-NeXT (anyres): each image resized to the best of 28-pixel grids of 1 x 1 to 2 x 2 tiles, every
    tile and the whole image shrunk to 28 pixels through a CLIP tower, the tiles' features unpadded to the
    image's aspect ratio with an image_newline token after each row; `onevision`: LLaVA-OneVision, the
    same anyres layout over a SigLIP tower (no CLS token) and a Qwen2 model, its processor image-only."""
    import transformers

    name = "LlavaOnevision" if onevision else "LlavaNext"
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"] if onevision else ["<image>"]})
    pins = [[28, 28], [28, 56], [56, 28], [56, 56]]
    image_cls = getattr(transformers, f"{name}ImageProcessorPil")
    template = _TEMPLATE.replace("IMAGE", "<image>")
    if onevision:
        ip = image_cls(size={"height": 28, "width": 28}, image_grid_pinpoints=pins)
        processor = image_only_processor(transformers.LlavaOnevisionProcessor)(
            image_processor=ip, tokenizer=tok, num_image_tokens=4, vision_feature_select_strategy="full",
            vision_aspect_ratio="anyres_max_4", chat_template=template)
        tower = _clip(28, "siglip_vision_model")
        ids = {"image_token_index": _ids(tok, "<image>")[0], "video_token_index": _ids(tok, "<video>")[0],
               "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_4"}
        text = {"model_type": "qwen2"}
    else:
        ip = image_cls(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=pins)
        processor = transformers.LlavaNextProcessor(
            image_processor=ip, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
            num_additional_image_tokens=1, chat_template=template)
        tower = _clip(28, projection_dim=32)
        ids = {"image_token_index": _ids(tok, "<image>")[0], "vision_feature_select_strategy": "default"}
        text = {"model_type": "llama"}
    config = getattr(transformers, f"{name}Config")(
        vision_config=tower, text_config={**text, **_TEXT, **_text_ids(tok)}, image_grid_pinpoints=pins,
        vision_feature_layer=-1, **ids)
    return getattr(transformers, f"{name}ForConditionalGeneration"), config, processor


def _glm4v():
    """GLM-4.1V: a Qwen2-VL-like tower (14-pixel patches merged 2 x 2, images of any size) and 3-D rotary
    positions computed by the model's get_rope_index; the processor image-only (no video processor)."""
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessorPil, Glm4vProcessor

    names = ("<|begin_of_image|>", "<|image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|video|>",
             "<|end_of_video|>")
    tok = _tokenizer_with({"image_token": names[1], "video_token": names[4]})
    tok.add_special_tokens({"additional_special_tokens": list(names)})
    ip = Glm4vImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 4 * 28 * 28}, patch_size=14,
                                merge_size=2, temporal_patch_size=2)
    processor = image_only_processor(Glm4vProcessor)(
        image_processor=ip, tokenizer=tok, chat_template=_TEMPLATE.replace("IMAGE", "".join(names[:3])))
    ids = dict(zip(("image_start_token_id", "image_token_id", "image_end_token_id", "video_start_token_id",
                    "video_token_id", "video_end_token_id"), _ids(tok, *names)))
    config = Glm4vConfig(
        text_config={**_TEXT, **_text_ids(tok), "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2], "partial_rotary_factor": 1.0}},
        vision_config={"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "intermediate_size": 64, "out_hidden_size": 32, "image_size": 28},
        **ids)
    return Glm4vForConditionalGeneration, config, processor


def _paligemma():
    """PaliGemma: a SigLIP tower, 4 tokens an image (28-pixel images of 14-pixel patches), a Gemma model
    whose prefix (the images and the prompt) attends both ways and whose suffix (the response) attends
    causally, as its token_type_ids (0 prefix, 1 suffix) say."""
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessorPil,
    )

    tok = _tokenizer_with({"image_token": "<image>"})
    ip = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    ip.image_seq_length = 4
    processor = PaliGemmaProcessor(image_processor=ip, tokenizer=tok,
                                   chat_template=_TEMPLATE.replace("IMAGE", "<image>"))
    config = PaliGemmaConfig(
        vision_config=_clip(28, "siglip_vision_model", projection_dim=32),
        text_config={"model_type": "gemma", **_TEXT, **_text_ids(tok), "head_dim": 8},
        image_token_index=tok.image_token_id, projection_dim=32, hidden_size=32)
    return PaliGemmaForConditionalGeneration, config, processor


def _aya_vision():
    """Aya Vision: each image cut into 28-pixel tiles (up to 4, a thumbnail of the whole when there are
    several), a SigLIP tower, pixel shuffle 2 x 2 and a SwiGLU projector, a Cohere 2 language model."""
    from transformers import (
        AyaVisionConfig,
        AyaVisionForConditionalGeneration,
        AyaVisionProcessor,
        GotOcr2ImageProcessorPil,
    )

    names = ("<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE",
             "TILE_GLOBAL")
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(names)})
    ip = GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=True, min_patches=1, max_patches=4)
    processor = AyaVisionProcessor(image_processor=ip, tokenizer=tok, patch_size=14, img_size=28, downsample_factor=2,
                                   chat_template=_TEMPLATE.replace("IMAGE", "<image>"))
    config = AyaVisionConfig(
        vision_config=_clip(28, "siglip_vision_model"),
        text_config={"model_type": "cohere2", **_TEXT, **_text_ids(tok), "head_dim": 8, "sliding_window": 8,
                     "layer_types": ["sliding_attention", "full_attention"]},
        downsample_factor=2, image_token_index=_ids(tok, "<|IMG_PATCH|>")[0])
    return AyaVisionForConditionalGeneration, config, processor


def _mllama():
    """Llama 3.2 Vision: each image one <|image|> token, its tiles (up to 2 of 28 pixels, by its aspect ratio)
    through a tower with aspect-ratio embeddings, the language model attending to their features in a
    cross-attention layer (layer 1 of 3), as the per-token cross_attention_mask says."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaImageProcessorPil, MllamaProcessor

    tok = _tokenizer_with({"image_token": "<|image|>"})
    tok.add_special_tokens({"additional_special_tokens": ["<|image|>", "<|python_tag|>"]})
    ip = MllamaImageProcessorPil(size={"height": 28, "width": 28}, max_image_tiles=2)
    processor = MllamaProcessor(image_processor=ip, tokenizer=tok,
                                chat_template=_TEMPLATE.replace("IMAGE", "<|image|>"))
    config = MllamaConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_global_layers": 1,
                       "attention_heads": 2, "image_size": 28, "patch_size": 14, "max_num_tiles": 2,
                       "vision_output_dim": 64, "intermediate_layers_indices": [0],
                       "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]]},
        text_config={**_TEXT, **_text_ids(tok), "num_hidden_layers": 3, "cross_attention_layers": [1]},
        image_token_index=tok.image_token_id)
    return MllamaForConditionalGeneration, config, processor


def _mistral3():
    """Mistral 3 (Mistral-Small-3.1 / 3.2): a Pixtral tower over 7-pixel patches with 2-D rotary positions, images
    of any size (longest side shrunk to 56, sides rounded up to 14 pixels), patches merged 2 x 2 into one token,
    each row of tokens closed by [IMG_BREAK] and the image by [IMG_END], a Mistral language model; the processor
    is rlhfkit's own (models.pixtral: transformers' needs torchvision to import)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessorPil

    from rlhfkit.models.pixtral import pixtral_processor_class

    names = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(names)})
    ip = PixtralImageProcessorPil(size={"longest_edge": 56}, patch_size=14)
    processor = pixtral_processor_class()(image_processor=ip, tokenizer=tok, patch_size=7, spatial_merge_size=2,
                                          chat_template=_TEMPLATE.replace("IMAGE", names[0]))
    config = Mistral3Config(
        vision_config={"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "head_dim": 16, "image_size": 56, "patch_size": 7},
        text_config={"model_type": "mistral", **_TEXT, **_text_ids(tok), "head_dim": 8, "sliding_window": None},
        spatial_merge_size=2, image_token_index=_ids(tok, names[0])[0], vision_feature_layer=-1)
    return Mistral3ForConditionalGeneration, config, processor


_BUILDERS = {"qwen2_vl": _qwen2_vl, "llava": _llava, "gemma3": _gemma3, "qwen2_5_vl": _qwen2_5_vl,
             "qwen3_vl": _qwen3_vl, "qwen3_vl_moe": lambda: _qwen3_vl(moe=True), "smolvlm": _smolvlm,
             "idefics3": _idefics3, "qwen3_5": _qwen3_5, "gemma4": _gemma4, "internvl": _internvl,
             "llava_next": _llava_next, "llava_onevision": lambda: _llava_next(onevision=True),
             "glm4v": _glm4v, "paligemma": _paligemma, "aya_vision": _aya_vision,
             "mllama": _mllama, "mistral3": _mistral3}


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
            if name.endswith("_gate") and "cross_attn" in name:  # Llama 3.2 Vision's cross-attention: tanh(0) = 0
                torch.nn.init.ones_(p.detach())
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
