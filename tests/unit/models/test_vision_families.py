"""What each tiny vision-language family brings beyond the equality tests of test_vision_engine.py: its
processor saved and loaded back (image-only where its video processor needs torchvision) encodes as the
one built in code; SmolVLM's sub-images of several prompts padded as its processor pads them; the tiny
models exercise what the families are known for (Qwen2.5-VL's window attention, Qwen3-VL's deepstack
features, Qwen3.5's linear-attention layers that decode without a cache); Mistral 3's processor (rlhfkit's own:
transformers' needs torchvision) expands images as transformers' would."""

import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image

from rlhfkit.data.images import encode
from rlhfkit.models.tiny_vision import FAMILIES, save_tiny_vision, tiny_vision_model_and_processor
from rlhfkit.models.vision import concat_vision, load_processor
from rlhfkit.rollout.kv_cache import cache_support


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def text(processor, images: int = 1) -> str:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": "colour?"}]
    return processor.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                         add_generation_prompt=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_saved_processor_encodes_as_the_one_built_in_code(tmp_path, family):
    """The image-only processors keep their own settings (SmolVLM's image_seq_len, InternVL's and Gemma 4's
    image_seq_length) in processor_config.json: loaded without them, an image would get the default
    number of tokens (169, 256, 280) and the model would refuse the prompt."""
    _, built = tiny_vision_model_and_processor(family)
    loaded = load_processor(str(save_tiny_vision(tmp_path, family)))
    assert type(loaded).__name__ == type(built).__name__
    images = [noise(56, 28), noise(40, 40, 1)]
    ids, vision = encode(built, text(built, 2), images)
    ids_back, vision_back = encode(loaded, text(loaded, 2), images)
    assert ids_back == ids and vision_back.tensors.keys() == vision.tensors.keys()
    assert all(torch.equal(vision_back.tensors[k], v) for k, v in vision.tensors.items())


def test_smolvlm_rows_with_different_sub_image_counts_are_padded_as_its_processor_pads_them():
    """A 56 x 28 image is 1 x 2 sub-images and the whole (3 frames), a 40 x 40 one 2 x 2 and the whole (5):
    the rows' [1, frames, 3, 28, 28] tensors are zero-padded to 5 frames, as the processor batches them."""
    _, processor = tiny_vision_model_and_processor("smolvlm")
    wide, square = noise(56, 28), noise(40, 40, 1)
    _, a = encode(processor, text(processor), [wide])
    _, b = encode(processor, text(processor), [square])
    assert a.tensors["pixel_values"].shape[1] == 3 and b.tensors["pixel_values"].shape[1] == 5
    both = processor(text=[text(processor)] * 2, images=[[wide], [square]], return_tensors="pt", padding=True)
    merged = concat_vision([a, None, b])
    assert merged.keys() == {"pixel_values", "pixel_attention_mask"}
    assert all(torch.equal(merged[k], both[k]) for k in merged)
    assert not merged["pixel_values"][0, 3:].any()  # the padding frames the model drops


def test_qwen2_5_vl_tower_runs_window_attention():
    """Windows of one merged 2 x 2 patch group: a 56 x 56 image's 16 patches attend in 4 windows, and the
    tower's output differs from one window over the whole image."""
    model, processor = tiny_vision_model_and_processor("qwen2_5_vl")
    _, vision = encode(processor, text(processor), [noise(56, 56)])
    tower = model.model.visual
    with torch.no_grad():
        windowed = tower(vision.tensors["pixel_values"], grid_thw=vision.tensors["image_grid_thw"]).pooler_output
        tower.window_size = 112
        whole = tower(vision.tensors["pixel_values"], grid_thw=vision.tensors["image_grid_thw"]).pooler_output
    assert (windowed - whole).abs().max() > 1e-5


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_deepstack_features_reach_the_language_model(family):
    """The tower's layer-0 features (deepstack) are added after the language model's first layer: zeroing
    their merger changes the logits of the tokens after the image."""
    model, processor = tiny_vision_model_and_processor(family)
    ids, vision = encode(processor, text(processor), [noise(56, 56)])
    inputs = {"input_ids": torch.tensor([ids]), **vision.tensors,
              "mm_token_type_ids": (torch.tensor([ids]) == model.config.image_token_id).long()}
    with torch.no_grad():
        full = model(**inputs).logits
        for p in model.model.visual.deepstack_merger_list.parameters():
            p.zero_()
        without = model(**inputs).logits
    assert (full - without).abs().max() > 1e-5


def test_qwen3_5_decodes_with_its_deltanet_states_in_the_cache():
    """Its Gated DeltaNet layers' convolution and recurrent states are copied per sample and have rows
    dropped with the keys and values (rollout.kv_cache.repeat_rows / select_rows): the engine keeps a
    cache (the equality tests then check its steps against generate with the same images)."""
    model, _ = tiny_vision_model_and_processor("qwen3_5")
    assert cache_support(model) is None


def test_smolvlm_without_num2words_is_one_line_naming_the_package(tmp_path, monkeypatch):
    """transformers' SmolVLM processor refuses to build without num2words (it writes video prompts with it);
    the error says which package to install, not that the folder is broken."""
    import transformers.models.smolvlm.processing_smolvlm as smolvlm

    from rlhfkit.errors import ModelError

    folder = save_tiny_vision(tmp_path, "smolvlm")
    monkeypatch.setattr(smolvlm, "num2words", None)
    with pytest.raises(ModelError, match=r"SmolVLMProcessor needs a package that is not installed .*num2words.*"
                                         r"pip install 'rlhfkit\[vision\]'") as err:
        load_processor(str(folder))
    assert "\n" not in str(err.value)


def transformers_pixtral_processor(monkeypatch):
    """transformers' own PixtralProcessor class: its module imports a function of the torchvision image processor
    module, which the PIL image processor module also defines; handed that one instead, it imports without
    torchvision (for this test only: both modules are put back)."""
    import sys

    import transformers.models.pixtral.image_processing_pil_pixtral as pil

    monkeypatch.setitem(sys.modules, "transformers.models.pixtral.image_processing_pixtral", pil)
    monkeypatch.delitem(sys.modules, "transformers.models.pixtral.processing_pixtral", raising=False)
    module = importlib.import_module("transformers.models.pixtral.processing_pixtral")
    monkeypatch.delitem(sys.modules, "transformers.models.pixtral.processing_pixtral")
    return module.PixtralProcessor


def test_mistral3_expands_images_as_transformers_pixtral_processor(monkeypatch):
    """One token per 14-pixel square (7-pixel patches merged 2 x 2), [IMG_BREAK] after each row, [IMG_END] last:
    a 56 x 28 image (2 rows of 4) is 10 tokens, a 40 x 40 one (rounded up to 42 x 42: 3 rows of 3) 12, and a
    100 x 30 one shrunk to fit 56 pixels (56 x 17, rounded up to 56 x 28: 2 rows of 4) 10; ids and tensors
    are those of transformers' own processor given the same parts and settings."""
    _, ours = tiny_vision_model_and_processor("mistral3")
    row = "[IMG]" * 4
    images = [noise(56, 28), noise(40, 40, 1), noise(100, 30, 2)]
    ids, vision = encode(ours, text(ours, 3), images)
    expected = (row + "[IMG_BREAK]" + row + "[IMG_END]" + ("[IMG]" * 3 + "[IMG_BREAK]") * 2 + "[IMG]" * 3 + "[IMG_END]"
                + row + "[IMG_BREAK]" + row + "[IMG_END]")
    assert ours.tokenizer.decode(ids) == text(ours, 3).replace("[IMG]" * 3, expected)
    assert vision.tensors["image_sizes"].tolist() == [[28, 56], [42, 42], [28, 56]]
    theirs = transformers_pixtral_processor(monkeypatch)(
        image_processor=ours.image_processor, tokenizer=ours.tokenizer, patch_size=7, spatial_merge_size=2,
        chat_template=ours.chat_template)
    ids_theirs, vision_theirs = encode(theirs, text(theirs, 3), images)
    assert ids_theirs == ids and vision_theirs.tensors.keys() == vision.tensors.keys()
    assert all(torch.equal(vision_theirs.tensors[k], v) for k, v in vision.tensors.items())


# Mistral-Small-3.1-24B-Instruct-2503's settings as its hub folder writes them: the image processor's in
# preprocessor_config.json and the processor's in processor_config.json, or (folders saved by transformers 5) both in
# processor_config.json, the image processor's under "image_processor".
PIXTRAL_IMAGE_PROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "PixtralImageProcessorFast", "patch_size": 14, "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1540}}
PIXTRAL_PROCESSOR = {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
                     "patch_size": 14, "processor_class": "PixtralProcessor", "spatial_merge_size": 2}


@pytest.mark.parametrize("nested", [False, True])
def test_mistral_small_3_1_folder_settings_load_and_expand_as_transformers(tmp_path, monkeypatch, nested):
    """A folder with Mistral-Small-3.1's processor settings loads with them (14-pixel patches merged 2 x 2: one
    token per 28 pixels, longest side 1540), and encodes as transformers' PixtralProcessor given the same
    settings: an image wider than 1540 shrunk (1600 x 50 -> 1540 x 48, rounded up to 1540 x 56: 2 rows of 55),
    a 1 x 1 one (one token and [IMG_END]), grey, RGBA and palette images, all in one message."""
    import json

    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    folder = save_tiny_vision(tmp_path, "mistral3")
    (folder / "preprocessor_config.json").unlink(missing_ok=True)
    own = {"image_processor": PIXTRAL_IMAGE_PROCESSOR} if nested else {}
    (folder / "processor_config.json").write_text(json.dumps({**PIXTRAL_PROCESSOR, **own}))
    if not nested:
        (folder / "preprocessor_config.json").write_text(
            json.dumps({**PIXTRAL_IMAGE_PROCESSOR, "processor_class": "PixtralProcessor"}))
    ours = load_processor(str(folder))
    assert (ours.patch_size, ours.spatial_merge_size, ours.image_processor.size.longest_edge) == (14, 2, 1540)
    images = [noise(1600, 50), noise(1, 1, 1), noise(70, 30, 2).convert("L"), noise(60, 50, 3).convert("RGBA"),
              noise(50, 50, 4).convert("P")]
    ids, vision = encode(ours, text(ours, 5), images)
    assert vision.tensors["image_sizes"].tolist() == [[56, 1540], [28, 28], [56, 84], [56, 84], [56, 56]]
    image_processor = PixtralImageProcessorPil(**{k: v for k, v in PIXTRAL_IMAGE_PROCESSOR.items()
                                                  if k != "image_processor_type"})
    theirs = transformers_pixtral_processor(monkeypatch)(
        image_processor=image_processor, tokenizer=ours.tokenizer, patch_size=14, spatial_merge_size=2,
        chat_template=ours.chat_template)
    ids_theirs, vision_theirs = encode(theirs, text(theirs, 5), images)
    assert ids_theirs == ids and ids.count(ours.image_token_id) == 110 + 1 + 6 + 6 + 4
    assert vision_theirs.tensors.keys() == vision.tensors.keys()
    assert all(torch.equal(vision_theirs.tensors[k], v) for k, v in vision.tensors.items())


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision builds the processor")
def test_a_processor_needing_torchvision_without_a_class_of_rlhfkits_is_one_line_naming_it(tmp_path, monkeypatch):
    """transformers will not import PixtralProcessor without torchvision, and it has no video part to leave out:
    without rlhfkit's own class for it (models.pixtral), loading says which processor needs torchvision and how
    to install it, not that the folder is broken; with it, the folder loads."""
    from rlhfkit.errors import ModelError
    from rlhfkit.models import vision

    folder = str(save_tiny_vision(tmp_path, "mistral3"))
    assert type(load_processor(folder)).__name__ == "PixtralProcessor"
    monkeypatch.setattr(vision, "_WITHOUT_TORCHVISION", {})
    with pytest.raises(ModelError, match=r"PixtralProcessor needs torchvision even for images, .*pip install "
                                         r"torchvision") as err:
        load_processor(folder)
    assert "\n" not in str(err.value)
