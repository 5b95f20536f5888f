"""SFT and preference samples with images: the processor's tokens and pixels, the target turns cut as
for text, the logprobs of the trainer's forward equal transformers' forward of the whole rendered
conversation with its images, and the image checks that run before a model loads."""

import json

import pytest
import torch
from PIL import Image

from rlhfkit.data.batch import collate
from rlhfkit.data.supervised import load_pairs, load_sft
from rlhfkit.data.supervised_images import VisionTextFormat, check_supervised_images
from rlhfkit.errors import DataError
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import FAMILIES, tiny_vision_model_and_processor
from rlhfkit.models.vision import token_type_kwargs


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request):
    return tiny_vision_model_and_processor(request.param)


def rows(tmp_path):
    Image.new("RGB", (40, 40), (220, 30, 30)).save(tmp_path / "red.png")
    Image.new("RGB", (40, 40), (30, 30, 220)).save(tmp_path / "blue.png")
    return [{"prompt": "Which colour?", "images": ["red.png"], "output": "red", "chosen": "red", "rejected": "blue"},
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "And?"}, {"type": "image"}]}],
             "images": ["blue.png"], "output": "blue", "chosen": "blue", "rejected": "red"}]


def write(tmp_path, records):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sft_logprobs_are_transformers_forward_of_the_conversation_with_its_images(vlm, tmp_path):
    model, processor = vlm
    path = write(tmp_path, rows(tmp_path))
    fmt = VisionTextFormat(processor, "images", 1, tmp_path)
    samples, skipped = load_sft(path, fmt, input_key="prompt", output_key="output")
    assert skipped == 0 and all(s.vision is not None and s.vision.num_images == 1 for s in samples)
    s = samples[0]
    assert processor.tokenizer.decode(s.response_ids[s.loss_mask]).startswith("red")
    logp, _ = response_logprobs(model, collate(samples, processor.tokenizer.pad_token_id))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]},
                {"role": "assistant", "content": "red"}]
    text = processor.apply_chat_template(messages, tokenize=False)
    image = [[Image.open(tmp_path / "red.png").convert("RGB")]]
    if model.config.model_type == "paligemma":  # a prefix LM: its processor writes the response as the suffix
        text, suffix = processor.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True), "red"
        inputs = processor(text=[text], images=image, suffix=[suffix], return_tensors="pt", add_special_tokens=False)
    else:
        inputs = processor(text=[text], images=image, return_tensors="pt", add_special_tokens=False)
    ids = inputs["input_ids"]
    assert ids[0, : len(s.prompt_ids)].tolist() == s.prompt_ids.tolist()
    pixels = {k: v for k, v in inputs.items() if k in s.vision.tensors}
    p, r = len(s.prompt_ids), len(s.response_ids)
    types = token_type_kwargs(model, ids, torch.tensor([p]))
    assert all(types[k].tolist() == inputs[k].tolist() for k in types if k in inputs)  # the processor's own
    with torch.no_grad():
        logits = model(input_ids=ids, **pixels, **types).logits[0].float()
    expected = torch.log_softmax(logits[p - 1 : p - 1 + r], -1).gather(-1, s.response_ids[:, None]).squeeze(-1)
    torch.testing.assert_close(logp[0, :r], expected, rtol=0, atol=2e-5)


def test_both_sides_of_a_pair_carry_the_prompts_image(vlm, tmp_path):
    _, processor = vlm
    path = write(tmp_path, rows(tmp_path))
    pairs, _ = load_pairs(path, VisionTextFormat(processor, None, 1, tmp_path))
    for pair in pairs:
        assert torch.equal(pair.chosen.prompt_ids, pair.rejected.prompt_ids)
        assert torch.equal(pair.chosen.vision.tensors["pixel_values"], pair.rejected.vision.tensors["pixel_values"])
    assert not torch.equal(pairs[0].chosen.vision.tensors["pixel_values"],
                           pairs[1].chosen.vision.tensors["pixel_values"])


def test_image_checks_before_the_model_loads(tmp_path, huge_png):
    records = rows(tmp_path)
    assert check_supervised_images(write(tmp_path, records), ("prompt",), "images", 1) == 2
    records[1]["images"] = ["blue.png", "red.png"]
    with pytest.raises(DataError, match=r"data.jsonl, line 2: 2 images, more than --data.max_images_per_prompt 1"):
        check_supervised_images(write(tmp_path, records), ("prompt",), "images", 1)
    records[1]["images"] = [str(huge_png(tmp_path / "huge.png"))]
    with pytest.raises(DataError, match=r"line 2, image 0: image .* has 400,000,000 pixels"):
        check_supervised_images(write(tmp_path, records), ("prompt",), "images", 1)
    records[1]["images"] = ["nowhere.png"]
    with pytest.raises(DataError, match=r"line 2, image 0: image file 'nowhere.png' not found"):
        check_supervised_images(write(tmp_path, records), ("prompt",), "images", 1)


def test_sft_rows_in_verl_and_openai_forms_give_one_image_each(tmp_path):
    """SFT on LLaVA (whose image token is "<image>"): a verl row marking its image with "<image>" in
    the text and an OpenAI image_url part with a data: URL each give the image's tokens once, as the
    plain row does (before: 2 image tokens for 1 image, and no image passed)."""
    import base64

    _, processor = tiny_vision_model_and_processor("llava")
    red = rows(tmp_path)[0]["images"][0]
    url = "data:image/png;base64," + base64.b64encode((tmp_path / red).read_bytes()).decode()
    records = [{"prompt": "Which colour?", "images": [red], "output": "red"},
               {"prompt": [{"role": "user", "content": "<image>Which colour?"}], "images": [red], "output": "red"},
               {"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                        {"type": "text", "text": "Which colour?"}]}], "output": "red"}]
    path = write(tmp_path, records)
    assert check_supervised_images(path, ("prompt",), None, 1) == 3
    samples, _ = load_sft(path, VisionTextFormat(processor, None, 1, tmp_path), input_key="prompt", output_key="output")
    plain = samples[0]
    for s in samples[1:]:
        assert s.prompt_ids.tolist() == plain.prompt_ids.tolist()
        assert torch.equal(s.vision.tensors["pixel_values"], plain.vision.tensors["pixel_values"])


@pytest.mark.parametrize("family", ["mllama", "paligemma"])
def test_images_after_the_first_turn_are_refused_where_a_prompt_holds_them_first(tmp_path, family):
    """Llama 3.2 Vision's cross-attention mask covers one piece's tokens from the sequence's start (two pieces
    would be two rows of masks, a later piece's rows would start at 0), PaliGemma's processor writes each piece
    with images as a prefix of its own: one line naming the record; LLaVA-NeXT takes the same records."""
    Image.new("RGB", (40, 40), (220, 30, 30)).save(tmp_path / "red.png")
    turn = [{"type": "image"}, {"type": "text", "text": "Which?"}]
    record = {"prompt": [{"role": "user", "content": turn}, {"role": "assistant", "content": "red"},
                         {"role": "user", "content": turn}], "images": ["red.png", "red.png"], "output": "red"}
    late = dict(record, prompt=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hi"},
                                {"role": "user", "content": turn}], images=["red.png"])
    path = write(tmp_path, [record, late])
    for bad in (record, late):  # images in two turns; an image in the second turn only
        with pytest.raises(DataError, match=r"data.jsonl, line 1.*images after the conversation's first turn"):
            load_sft(write(tmp_path, [bad]), VisionTextFormat(tiny_vision_model_and_processor(family)[1], "images",
                                                              2, tmp_path), input_key="prompt", output_key="output")
    path = write(tmp_path, [record, late])
    samples, _ = load_sft(path, VisionTextFormat(tiny_vision_model_and_processor("llava_next")[1], "images", 2,
                                                 tmp_path), input_key="prompt", output_key="output")
    assert samples[0].vision.num_images == 2 and samples[1].vision.num_images == 1
