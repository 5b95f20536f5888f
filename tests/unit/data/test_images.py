"""Prompts with images: the formats (OpenRLHF's jsonl + image folder, TRL's image / images columns, a
datasets Image feature, inline parts, bytes), the placeholders, the tokenization through a processor,
and the bad images refused with one line naming the record before any model loads."""

import base64
import io
import json

import pytest
import torch
from PIL import Image

from rlhfkit.data.images import (
    check_vision_prompts,
    load_vision_prompts,
    messages_with_images,
    open_image,
    refuse_images_for_text_model,
    tokenize_vision_prompts,
)
from rlhfkit.errors import DataError
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]}]


@pytest.fixture(scope="module")
def processor():
    return tiny_vision_model_and_processor("qwen2_vl")[1]


def png(path, colour=(200, 10, 10), size=(40, 40)):
    Image.new("RGB", size, colour).save(path)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def openrlhf_dataset(tmp_path, images=("red.png",)):
    (tmp_path / "imgs").mkdir(exist_ok=True)
    png(tmp_path / "imgs" / "red.png")
    png(tmp_path / "imgs" / "blue.png", (10, 10, 200))
    rows = [{"prompt": QUESTION, "images": [f"imgs/{name}" for name in images], "label": "red"},
            {"prompt": QUESTION, "images": ["imgs/blue.png"], "label": "blue"}]
    return write_jsonl(tmp_path / "train.jsonl", rows)


def test_openrlhf_jsonl_with_an_image_folder_tokenizes_each_image_into_its_tokens(tmp_path, processor):
    path = openrlhf_dataset(tmp_path)
    assert check_vision_prompts(path, "prompt", "label", "images", 1) == 2
    examples = load_vision_prompts(path, processor, "prompt", "label", "images", 1)
    items, skipped = tokenize_vision_prompts(examples, processor, 512, "prompt")
    assert skipped == 0 and [i.label for i in items] == ["red", "blue"]
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grid = items[0].vision.tensors["image_grid_thw"]
    assert grid.tolist() == [[1, 2, 2]]  # 40x40 resized to 28x28: 2x2 patches, merged 2x2 into one token
    assert items[0].ids.count(pad) == 1 and items[0].vision.num_images == 1
    assert "<|vision_start|><|image_pad|><|vision_end|>Which colour?" in items[0].text
    red, blue = (i.vision.tensors["pixel_values"] for i in items)
    assert not torch.equal(red, blue)


def test_trl_image_column_of_a_datasets_dataset_without_placeholders(processor):
    import datasets

    rows = {"prompt": ["Which colour?", "And this one?"],
            "image": [Image.new("RGB", (40, 40), (200, 0, 0)), Image.new("RGB", (30, 50), (0, 0, 200))]}
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    examples = load_vision_prompts(ds, processor, "prompt")
    assert [len(e.images) for e in examples] == [1, 1]
    assert examples[0].example.text.startswith("user: <|vision_start|><|image_pad|><|vision_end|>Which colour?")
    assert examples[1].images[0].size == (30, 50)


def test_inline_image_parts_and_bytes():
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buffer, format="PNG")
    messages = [{"role": "user", "content": [{"type": "image", "image": buffer.getvalue()},
                                             {"type": "text", "text": "a"}, {"type": "image"}]}]
    out, images = messages_with_images(messages, ["b.png"], "rec")
    assert images == [buffer.getvalue(), "b.png"]
    assert out[0]["content"] == [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "image"}]
    assert open_image(images[0], "rec").getpixel((0, 0)) == (1, 2, 3)
    assert open_image({"bytes": buffer.getvalue(), "path": None}, "rec").size == (8, 8)


def test_a_prompt_without_images_has_no_vision_inputs(tmp_path, processor):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "just text", "images": []}])
    items, _ = tokenize_vision_prompts(load_vision_prompts(path, processor, "prompt"), processor, 64, "prompt")
    assert items[0].vision is None


def truncated_png(path):
    png(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("case,expected", [
    ("missing", "line 1, image 0: image file 'imgs/nope.png' not found"),
    ("truncated", "line 1, image 0: image 'imgs/cut.png' cannot be decoded"),
    ("huge", "line 1, image 0: image 'imgs/huge.png' has 400,000,000 pixels, more than the 67,108,864 allowed"),
    ("large", "line 1, image 0: image 'imgs/huge.png' is 9000x9000 pixels (81,000,000), more than the 67,108,864"),
    ("too_many", "line 1: 2 images, more than --data.max_images_per_prompt 1"),
    ("placeholders", "line 2: the prompt has 1 image placeholder(s)"),
])
def test_bad_images_are_one_line_errors_naming_the_record(tmp_path, processor, huge_png, case, expected):
    path = openrlhf_dataset(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if case == "missing":
        rows[0]["images"] = ["imgs/nope.png"]
    elif case == "truncated":
        truncated_png(tmp_path / "imgs" / "cut.png")
        rows[0]["images"] = ["imgs/cut.png"]
    elif case in ("huge", "large"):
        huge_png(tmp_path / "imgs" / "huge.png", 20000 if case == "huge" else 9000)
        rows[0]["images"] = ["imgs/huge.png"]
    elif case == "too_many":
        rows[0]["images"] = ["imgs/red.png", "imgs/blue.png"]
        rows[0]["prompt"] = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}]
    else:
        rows[1]["images"] = ["imgs/red.png", "imgs/blue.png"]
    write_jsonl(path, rows)
    for run in (lambda: check_vision_prompts(path, "prompt", "label", "images", 1),
                lambda: load_vision_prompts(path, processor, "prompt", "label", "images", 1)):
        with pytest.raises(DataError) as err:
            run()
        message = str(err.value)
        assert "\n" not in message and message.startswith(str(path)) and expected in message


def test_images_in_a_text_only_run_are_refused_naming_the_record(tmp_path):
    path = openrlhf_dataset(tmp_path)
    with pytest.raises(DataError, match=r"line 1: the record holds images but the model tiny is a text-only"):
        refuse_images_for_text_model(path, "prompt", None, "tiny")
    text = write_jsonl(tmp_path / "text.jsonl", [{"prompt": "2+2?"}])
    refuse_images_for_text_model(text, "prompt", None, "tiny")  # no images: fine


def data_url(path):
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def test_images_as_urls_and_in_openai_and_transformers_content_parts(tmp_path, processor):
    """A file:// URL and a data: URL in the image column, OpenAI's image_url parts (a data: URL, a
    file:// URL, the url as a plain string) and transformers' {"type": "image", "url" / "path"} parts
    each give the image itself, in its place (before: 'not found', or the processor's own error)."""
    red = png(tmp_path / "red.png")
    blue = png(tmp_path / "blue.png", (10, 10, 200))

    def ask(*parts):
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "Which colour?"}]}]

    rows = [{"prompt": QUESTION, "images": [f"file://{red}"]},
            {"prompt": QUESTION, "images": [data_url(red)]},
            {"prompt": ask({"type": "image_url", "image_url": {"url": data_url(red)}})},
            {"prompt": ask({"type": "image_url", "image_url": {"url": f"file://{red}"}})},
            {"prompt": ask({"type": "image_url", "image_url": data_url(red)})},
            {"prompt": ask({"type": "image", "url": data_url(red)})},
            {"prompt": ask({"type": "image", "path": str(red)})},
            {"prompt": ask({"type": "image", "path": str(blue)},
                           {"type": "image_url", "image_url": {"url": data_url(red)}})}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert check_vision_prompts(path, "prompt", max_images=2) == len(rows)
    examples = load_vision_prompts(path, processor, "prompt", max_images=2)
    items, _ = tokenize_vision_prompts(examples, processor, 512, "prompt")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert [i.ids.count(pad) for i in items] == [1] * 7 + [2]
    for e in examples[:7]:
        assert e.example.text.startswith("user: <|vision_start|><|image_pad|><|vision_end|>Which colour?")
        assert [im.getpixel((0, 0)) for im in e.images] == [(200, 10, 10)]
    assert [im.getpixel((0, 0)) for im in examples[7].images] == [(10, 10, 200), (200, 10, 10)]
    with pytest.raises(DataError, match=r"line 1: the record holds images but the model tiny is a text-only"):
        refuse_images_for_text_model(write_jsonl(tmp_path / "o.jsonl", rows[2:3]), "prompt", None, "tiny")


def test_verl_geo3k_rows_image_markers_in_the_text_and_bytes_dicts(tmp_path, processor):
    """verl's geo3k parquet: a message whose string content marks its image with "<image>", the image
    a {"bytes", "path"} dict. The marker is the image's place (not left as text); a text-only record
    that mentions "<image>" stays text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    red, blue = (png(tmp_path / n, c).read_bytes() for n, c in (("r.png", (200, 10, 10)), ("b.png", (10, 10, 200))))
    rows = [{"prompt": [{"role": "user", "content": "<image>Find x."}], "images": [{"bytes": red, "path": None}]},
            {"prompt": [{"role": "user", "content": "Is <image> like <image>?"}],
             "images": [{"bytes": blue, "path": "geo/1.png"}, {"bytes": red, "path": "geo/2.png"}]},
            {"prompt": [{"role": "user", "content": "What does <image> mean in HTML?"}], "images": []}]
    path = tmp_path / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    examples = load_vision_prompts(path, processor, "prompt", max_images=2)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert [e.example.text.split("<eos>")[0] for e in examples] == [
        f"user: {image}Find x.", f"user: Is {image} like {image}?", "user: What does <image> mean in HTML?"]
    assert [[im.getpixel((0, 0)) for im in e.images] for e in examples] == [
        [(200, 10, 10)], [(10, 10, 200), (200, 10, 10)], []]


def test_base64_text_in_a_bytes_dict_opens_and_bare_base64_is_one_line(tmp_path):
    """A geo3k row written out as JSON holds its image's "bytes" as base64 text: it opens. Bare base64
    in the image column (no data: prefix) is refused in one line naming the record, not with the
    file system's 'File name too long' and 5,000 characters of data."""
    noise = io.BytesIO()
    Image.effect_noise((64, 64), 50).save(noise, format="PNG")
    text = base64.b64encode(noise.getvalue()).decode()
    rows = [{"prompt": QUESTION, "images": [{"bytes": text, "path": None}]}, {"prompt": QUESTION, "images": [text]}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(DataError) as err:
        check_vision_prompts(path, "prompt")
    message = str(err.value)
    assert message.startswith(f"{path}, line 2, image 0: image 'iVBOR") and len(message) < 300
    assert "characters) is not a file; give a path, a URL, or base64 data as a data:image" in message
    assert open_image(rows[0]["images"][0], "rec").size == (64, 64)


def test_a_bytes_dict_path_without_a_suffix_is_a_path_not_base64(tmp_path):
    """{"bytes": None, "path": ...} opens its path even when the file's name has no suffix (only the "bytes"
    entry may be base64 text)."""
    Image.new("RGB", (4, 4), (5, 6, 7)).save(tmp_path / "cat", format="PNG")
    assert open_image({"bytes": None, "path": "cat"}, "rec", base_dir=tmp_path).getpixel((0, 0)) == (5, 6, 7)


def test_an_exif_rotated_photo_is_turned_upright_as_datasets_and_transformers_turn_it(tmp_path):
    """A camera's portrait photo is stored landscape with an EXIF Orientation tag (6: turn 90 degrees clockwise):
    read from a file, bytes or an undecoded Image feature it is turned upright, as `datasets` decodes it and
    transformers' load_image reads it, so the model sees the same image whichever way it is given."""
    import numpy as np
    from PIL import ImageOps

    stored = Image.fromarray(np.random.default_rng(0).integers(0, 256, (10, 30, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    stored.save(buffer, format="PNG", exif=exif)
    (tmp_path / "photo.png").write_bytes(buffer.getvalue())
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue())))
    assert upright.size == (10, 30)
    for value in (str(tmp_path / "photo.png"), buffer.getvalue(), {"bytes": buffer.getvalue(), "path": None}):
        image = open_image(value, "row 0")
        assert image.size == (10, 30) and image.tobytes() == upright.convert("RGB").tobytes()


def test_an_image_the_processor_refuses_is_one_line_naming_the_record(tmp_path, processor):
    """A 3000 x 1 strip: Qwen2-VL's resize refuses aspect ratios above 200 with a raw ValueError."""
    Image.new("RGB", (3000, 1)).save(tmp_path / "strip.png")
    rows = [{"prompt": QUESTION, "images": ["red.png"]}, {"prompt": QUESTION, "images": ["strip.png"]}]
    Image.new("RGB", (40, 40), (200, 10, 10)).save(tmp_path / "red.png")
    examples = load_vision_prompts(write_jsonl(tmp_path / "t.jsonl", rows), processor, "prompt", None, "images", 1)
    with pytest.raises(DataError, match=r"^record 1: \w+ refuses its image\(s\) of 3000x1 pixels \(.*aspect ratio"):
        tokenize_vision_prompts(examples, processor, 512, "prompt")
