"""models.vision.language_lora_targets: LoRA's layers of a VLM outside its vision tower (the tiny
families: 2 language layers of 7 linear layers each; LLaVA's projector has 2 more, Qwen2-VL's merger
sits inside its tower), where peft's own name matching would also pick the tower's layers."""

import pytest

from rlhfkit.errors import ConfigError
from rlhfkit.models.lora import add_lora
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.models.vision import language_lora_targets


@pytest.mark.parametrize("family,count,projector", [("qwen2_vl", 14, 0), ("llava", 16, 2), ("gemma3", 14, 0)])
def test_all_linear_is_the_language_model_and_the_projector(family, count, projector):
    model, _ = tiny_vision_model_and_processor(family)
    names = language_lora_targets(model, "all-linear")
    assert len(names) == count and sum("multi_modal_projector" in n for n in names) == projector
    assert all("language_model.layers." in n for n in names if "projector" not in n)
    assert language_lora_targets(model, ("q_proj", "v_proj")) == [
        f"model.language_model.layers.{i}.self_attn.{m}" for i in (0, 1) for m in ("q_proj", "v_proj")]


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
