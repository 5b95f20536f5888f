"""models.vision.language_lora_targets: LoRA's layers of a VLM outside its vision tower (the tiny
families: 2 language layers of 7 linear layers each, q/k/v/o and gate/up/down; the projector's linear
layers outside the tower: LLaVA's and InternVL's 2, SmolVLM's / Idefics3's connector 1, Gemma 4's
embed_vision 1; Qwen-VL's merger sits inside its tower), where peft's own name matching would also pick
the tower's layers."""

import pytest

from rlhfkit.errors import ConfigError
from rlhfkit.models.lora import add_lora
from rlhfkit.models.tiny_vision import FAMILIES, tiny_vision_model_and_processor
from rlhfkit.models.vision import TOWER_NAMES, language_lora_targets

# family -> (linear layers outside the tower, of which in the projector, the language model's name, its layers
# with q_proj / v_proj). Qwen3-VL-MoE: its experts are fused 3-D weights, no Linear: 2 x 4 attention layers.
# Qwen3.5: layer 0 is a Gated DeltaNet (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj: 5) + MLP 3,
# layer 1 attention 4 + MLP 3. Gemma 4: 14 + per-layer inputs (a gate and a projection a layer: 4, the model's
# projection: 1) + embed_vision 1. GLM-4.1V: its MLP's gate and up projections are one layer (gate_up_proj):
# 2 x (4 + 2). PaliGemma's projector is one linear layer, LLaVA-NeXT's, LLaVA-OneVision's and Aya Vision's two.
# Llama 3.2 Vision: 3 layers of 7, layer 1 a cross-attention layer (its q/k/v/o are cross_attn's), + its projector.
# Mistral 3: 2 x 7 + its projector's patch merger (one linear layer) and two linear layers.
LAYOUT = {"qwen2_vl": (14, 0, "language_model", (0, 1)), "llava": (16, 2, "language_model", (0, 1)),
          "gemma3": (14, 0, "language_model", (0, 1)), "qwen2_5_vl": (14, 0, "language_model", (0, 1)),
          "qwen3_vl": (14, 0, "language_model", (0, 1)), "qwen3_vl_moe": (8, 0, "language_model", (0, 1)),
          "smolvlm": (15, 1, "text_model", (0, 1)), "idefics3": (15, 1, "text_model", (0, 1)),
          "qwen3_5": (15, 0, "language_model", (1,)), "gemma4": (20, 1, "language_model", (0, 1)),
          "internvl": (16, 2, "language_model", (0, 1)), "llava_next": (16, 2, "language_model", (0, 1)),
          "llava_onevision": (16, 2, "language_model", (0, 1)), "glm4v": (12, 0, "language_model", (0, 1)),
          "paligemma": (15, 1, "language_model", (0, 1)), "aya_vision": (16, 2, "language_model", (0, 1)),
          "mllama": (22, 1, "language_model", (0, 2)), "mistral3": (17, 3, "language_model", (0, 1))}
PROJECTORS = ("multi_modal_projector", "connector", "embed_vision")
CROSS_ATTENTION = {"mllama": (1,)}  # family -> its language model's cross-attention layers (q/k/v/o: cross_attn's)


def test_every_tiny_family_is_laid_out_here():
    assert set(LAYOUT) == set(FAMILIES)


@pytest.mark.parametrize("family", list(LAYOUT))
def test_all_linear_is_the_language_model_and_the_projector(family):
    count, projector, lm, attention = LAYOUT[family]
    model, _ = tiny_vision_model_and_processor(family)
    names = language_lora_targets(model, "all-linear")
    assert len(names) == count and sum(any(p in n for p in PROJECTORS) for n in names) == projector
    assert all(f"model.{lm}." in n for n in names if not any(p in n for p in PROJECTORS))
    assert not any(f".{t}." in n for n in names for t in TOWER_NAMES)
    cross = CROSS_ATTENTION.get(family, ())
    assert language_lora_targets(model, ("q_proj", "v_proj")) == [
        f"model.{lm}.layers.{i}.{'cross_attn' if i in cross else 'self_attn'}.{m}" for i in sorted({*attention, *cross})
        for m in ("q_proj", "v_proj")]


def test_peft_would_put_adapters_in_the_tower_and_the_names_keep_them_out():
    """LLaVA's CLIP tower has q_proj too: by name peft adapts it; by the full names it does not."""
    model, _ = tiny_vision_model_and_processor("llava")
    by_name = add_lora(model, 2, 4, ("q_proj",))
    assert any("vision_tower" in n and "lora_A" in n for n, _ in by_name.named_parameters())
    model, _ = tiny_vision_model_and_processor("llava")
    ours = add_lora(model, 2, 4, language_lora_targets(model, ("q_proj",)))
    adapted = [n for n, p in ours.named_parameters() if p.requires_grad]
    assert len(adapted) == 4 and all("language_model" in n for n in adapted)  # A and B of 2 layers


def test_a_name_no_layer_has_is_a_config_error():
    model, _ = tiny_vision_model_and_processor("qwen2_vl")
    with pytest.raises(ConfigError, match="no linear layer of that name outside the vision tower"):
        language_lora_targets(model, ("qkv",))  # the tower's attention only
