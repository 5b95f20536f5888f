"""Prompts with images: read, check and tokenize them through a vision-language model's processor.

A record's images come from its image column (`image_key`; by default "images", else TRL's
"image") and from inline content parts. A value is a path (absolute, or relative to the
dataset file's folder, else to the working directory), a file:// URL, an http(s) URL (fetched
once and kept in a cache folder), a data:image/...;base64 URL, raw bytes, a `{"bytes": ..., "path":
...}` dict (a `datasets` Image feature that is not decoded), or a PIL image (a decoded Image
feature); a column holds one image or a list.

The prompt (`input_key`) is a string or a message list; content parts `{"type": "image"}` are
placeholders filled in order from the image column, parts that name an image carry it inline
(`part_image`: TRL's "image", transformers' "url" / "path", OpenAI's `image_url` parts). In a record
with images, "<image>" inside a string content is a placeholder (verl's datasets). When the prompt has no image part but
the record has images, one placeholder per image is put at the start of the first user message
(as TRL does for a prompt without placeholders). The processor's chat template renders the
placeholders as the model's image tokens; the processor then expands them to each image's
number of tokens and computes the pixel tensors (`VisionInputs`).

Checks (`check_vision_prompts`, run before any model loads): every image opens (a missing file, a
truncated or corrupt file, a URL that cannot be fetched), is at most MAX_IMAGE_PIXELS pixels (read
from the header, before decoding), a record has at most `max_images` images, and placeholders and
images match in number. Each failure is a DataError naming the source, the record and the image.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from rlhfkit.data.prompts import PromptExample, kept_records
from rlhfkit.data.records import Record, Source, is_messages, label_value, source_name
from rlhfkit.data.types import PromptItem
from rlhfkit.errors import ConfigError, DataError, first_line

IMAGE_KEYS = ("images", "image")  # the columns looked for when no image_key is given (OpenRLHF's, TRL's)
MAX_IMAGE_PIXELS = 8192 * 8192  # larger images are refused before they are decoded
URL_TIMEOUT_S = 30


@dataclass(frozen=True)
class VisionInputs:
    """The processor's image tensors of one prompt (e.g. `pixel_values` and Qwen2-VL's
    `image_grid_thw`), dim 0 indexing its images or their patches; `num_images`; `images`: the
    decoded images they were computed from, in order (the vLLM engine sends these; () where not
    kept). The n samples of a prompt share one object (no copy)."""

    tensors: dict
    num_images: int
    images: tuple = field(default=(), compare=False, repr=False)


@dataclass
class VisionExample:
    """A PromptExample (rendered text, label, raw record, index) with its opened images."""

    example: PromptExample
    images: list


def image_column(data: dict, image_key: str | None) -> str | None:
    """The image column of a record's `data`: `image_key` when given, else the first of IMAGE_KEYS it has."""
    if image_key is not None:
        return image_key
    return next((k for k in IMAGE_KEYS if k in data), None)


def record_has_images(record: Record, input_key: str, image_key: str | None) -> bool:
    """Whether the record holds any image (in its image column or inline in its messages)."""
    column = image_column(record.data, image_key)
    return bool(column_values(record.data.get(column)) if column else []) or bool(
        _inline_parts(record.data.get(input_key)))


def column_values(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _parts(message: dict) -> list:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _is_image_part(part: Any) -> bool:
    """An image content part: `{"type": "image", ...}` (OpenRLHF's, TRL's, transformers') or OpenAI's
    `{"type": "image_url", "image_url": {"url": ...}}`."""
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def part_image(part: dict) -> Any:
    """The image an image part carries inline, None for a bare placeholder `{"type": "image"}`: its
    "image" (TRL), "url" or "path" (transformers' chat templates), or OpenAI's image_url (its "url",
    or the string itself)."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    return next((part[k] for k in ("image", "url", "path") if part.get(k) is not None), None)


def _inline_parts(value: Any) -> list:
    if not is_messages(value):
        return []
    return [p for m in value for p in _parts(m) if _is_image_part(p) and part_image(p) is not None]


def inline_images(value: Any) -> list:
    """The images a prompt's message list carries in its content parts, in order."""
    return [part_image(p) for p in _inline_parts(value)]


IMAGE_MARKER = "<image>"  # verl's (and LLaVA data's) image placeholder inside a string content


def _text_parts(text: str, markers: bool) -> list[dict]:
    """A string content as content parts; with `markers`, each "<image>" in it an image placeholder
    (verl's geo3k rows: "<image>Find x.")."""
    if not markers or IMAGE_MARKER not in text:
        return [{"type": "text", "text": text}]
    pieces = text.split(IMAGE_MARKER)
    parts = [{"type": "text", "text": pieces[0]}]
    for piece in pieces[1:]:
        parts += [{"type": "image"}, {"type": "text", "text": piece}]
    return [p for p in parts if p.get("text") != ""]


def open_image(value: Any, where: str, base_dir: Path | None = None, cache_dir: Path | None = None):
    """An RGB PIL image from a path, URL, bytes, {"bytes", "path"} dict or PIL image; DataError
    naming `where` when it cannot be read or has more than MAX_IMAGE_PIXELS pixels."""
    from PIL import Image

    if isinstance(value, dict):
        raw = value.get("bytes")
        if isinstance(raw, str) and raw:  # "bytes" written out as base64 text (JSON)
            raw = _base64_bytes(raw, where)
        value = raw or value.get("path")
    if isinstance(value, str) and value.startswith("data:"):
        value = data_url_bytes(value, where)
    elif isinstance(value, str) and value.startswith("file://"):
        value = url2pathname(urlparse(value).path)
    if isinstance(value, Image.Image):
        return _checked(value, where, "image").convert("RGB")
    if isinstance(value, (bytes, bytearray)):
        return _decode(io.BytesIO(bytes(value)), where, f"{len(value)} bytes")
    if not isinstance(value, (str, Path)):
        raise DataError(f"{where}: an image must be a path, URL, bytes or PIL image, got {type(value).__name__}")
    text = str(value)
    if text.startswith(("http://", "https://")):
        return _decode(io.BytesIO(_fetch(text, where, cache_dir)), where, text)
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() or base_dir is None else [base_dir / path, path]
    found = next((c for c in candidates if _is_file(c)), None)
    if found is None:
        if len(text) > 200:  # no file has such a name: say what it is without printing all of it
            raise DataError(f"{where}: image {text[:40]!r}... ({len(text):,} characters) is not a file; give a path, "
                            "a URL, or base64 data as a data:image/<format>;base64,<data> URL")
        raise DataError(f"{where}: image file {text!r} not found (looked in {', '.join(str(c) for c in candidates)})")
    return _decode(found, where, text)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system
        return False


def _base64_bytes(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DataError(f"{where}: the image's \"bytes\" is text but not base64 ({exc})") from exc


def data_url_bytes(url: str, where: str) -> bytes:
    """The bytes of a `data:image/<format>;base64,<data>` URL; DataError naming `where` for another kind of
    URL or data that is not base64."""
    header, comma, data = url.partition(",")
    if not (url.startswith("data:image/") and comma and header.endswith(";base64")):
        raise DataError(f"{where}: image URL {url[:40]!r}...: give a data:image/<format>;base64,<data> URL")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DataError(f"{where}: the data URL is not valid base64 ({exc})") from exc


def image_data_url(image) -> str:
    """A PIL image as a `data:image/png;base64,...` URL (lossless: it decodes to the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _checked(image, where: str, name: str):
    w, h = image.size
    if w * h > MAX_IMAGE_PIXELS:
        raise DataError(f"{where}: image {name} is {w}x{h} pixels ({w * h:,}), more than the {MAX_IMAGE_PIXELS:,} "
                        "allowed; resize it")
    return image


def _decode(file, where: str, name: str):
    from PIL import Image, ImageOps

    try:
        with Image.open(file) as image:  # reads the header only: the size is checked before decoding
            _checked(image, where, repr(name))
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # a camera's Orientation tag, as datasets' decoding does
            return image.convert("RGB")
    except DataError:
        raise
    except Image.DecompressionBombError as exc:  # PIL refuses to open far larger ones: their size is in its message
        found = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(found.group(1)):,} pixels" if found else "more pixels"
        raise DataError(f"{where}: image {name!r} has {pixels}, more than the {MAX_IMAGE_PIXELS:,} allowed; "
                        "resize it") from exc
    except Exception as exc:
        raise DataError(f"{where}: image {name!r} cannot be decoded ({type(exc).__name__}: {first_line(exc)}); "
                        "the file is truncated or not an image") from exc


def _fetch(url: str, where: str, cache_dir: Path | None) -> bytes:
    """The bytes at `url`, from `cache_dir` when fetched before (kept there after the first fetch)."""
    import urllib.request

    cache = Path(cache_dir or Path.home() / ".cache" / "rlhfkit" / "images")
    file = cache / hashlib.sha256(url.encode()).hexdigest()
    if file.is_file():
        return file.read_bytes()
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:
            data = response.read()
    except Exception as exc:
        raise DataError(f"{where}: image URL {url} cannot be fetched "
                        f"({type(exc).__name__}: {first_line(exc)})") from exc
    cache.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(file)
    return data


def messages_with_images(value: Any, column: list, where: str) -> tuple[list[dict], list]:
    """(messages, image values in order) of a prompt: a string becomes one user message; the
    column's images fill the `{"type": "image"}` placeholders in order, inline images stay where they
    are; placeholders are added at the start of the first user message when there are none."""
    if isinstance(value, str):
        messages = [{"role": "user", "content": _text_parts(value, bool(column))}]
    elif is_messages(value):
        messages = [dict(m, content=list(m["content"]) if isinstance(m["content"], list) else
                         _text_parts(m["content"], bool(column))) for m in value]
    else:
        raise DataError(f"{where}: expected a string or a list of {{'role', 'content'}} messages, "
                        f"got {type(value).__name__}")
    parts = [p for m in messages for p in m["content"] if _is_image_part(p)]
    if not parts and column:
        user = next((m for m in messages if m["role"] == "user"), messages[0])
        user["content"] = [{"type": "image"} for _ in column] + user["content"]
        parts = user["content"][: len(column)]
    placeholders = [p for p in parts if part_image(p) is None]
    if len(placeholders) != len(column):
        raise DataError(f"{where}: the prompt has {len(placeholders)} image placeholder(s) {{'type': 'image'}} "
                        f"for {len(column)} image(s) in the image column; give one placeholder per image")
    fill = iter(column)
    images = [part_image(p) if part_image(p) is not None else next(fill) for p in parts]
    for m in messages:  # the chat template sees bare placeholders
        m["content"] = [{"type": "image"} if _is_image_part(p) else p for p in m["content"]]
    return messages, images


def image_messages(value: Any, num_images: int, where: str) -> list[dict]:
    """The messages of a prompt (`value`: a string or a message list, as `PromptItem.raw`) holding
    `num_images` images, as `load_vision_prompts` renders them: a bare `{"type": "image"}` part per
    image (inline ones in place, the image column's at the start of the first user message when
    there is no placeholder). Messages without an image part keep a plain string content."""
    column = [None] * (num_images - len(_inline_parts(value)))
    messages, _ = messages_with_images(value, column, where)
    for m in messages:
        if not any(_is_image_part(p) for p in m["content"]):
            m["content"] = "".join(p.get("text", "") for p in m["content"])
    return messages


def _vision_records(source: Source, input_key: str, label_key: str | None, image_key: str | None,
                    max_images: int, options: dict) -> tuple[str, list[tuple[int, Record, list[dict], list]]]:
    """(source name, [(index, record, messages, image values)]) of the kept records, with the counts checked."""
    if max_images < 1:
        raise ConfigError(f"--data.max_images_per_prompt must be >= 1, got {max_images}")
    name, kept = kept_records(source, input_key, label_key, apply_chat_template=True, **options)
    out = []
    for i, record in kept:
        where = f"{name}, {record.where}"
        column = image_column(record.data, image_key)
        if image_key is not None and column not in record.data:
            raise DataError(f"{where}: no image column {image_key!r} (--data.image_key); the record has "
                            f"{', '.join(sorted(record.data))}")
        messages, images = messages_with_images(record.data[input_key],
                                                column_values(record.data.get(column)) if column else [], where)
        if len(images) > max_images:
            raise DataError(f"{where}: {len(images)} images, more than --data.max_images_per_prompt {max_images}; "
                            "raise it or drop images from the record")
        out.append((i, record, messages, images))
    return name, out


def _base_dir(source: Source) -> Path | None:
    return Path(source).parent if isinstance(source, (str, Path)) and Path(source).is_file() else None


def _opened(name: str, record: Record, images: list, base_dir: Path | None, cache_dir: Path | None) -> list:
    return [open_image(v, f"{name}, {record.where}, image {k}", base_dir, cache_dir) for k, v in enumerate(images)]


def check_vision_prompts(source: Source, input_key: str = "input", label_key: str | None = None,
                         image_key: str | None = None, max_images: int = 1, cache_dir: Path | None = None,
                         **options) -> int:
    """Every check `load_vision_prompts` makes, without a processor: the records, their keys, the
    number of images and placeholders, and every image opened and decoded. Returns the number of
    prompts. `options`: load_prompts' max_samples, shuffle_seed, split, config, data_dir."""
    name, kept = _vision_records(source, input_key, label_key, image_key, max_images, options)
    for _, record, _, images in sorted(kept, key=lambda kept_one: kept_one[0]):  # the first bad one in file order
        _opened(name, record, images, _base_dir(source), cache_dir)
    return len(kept)


def load_vision_prompts(source: Source, processor, input_key: str = "input", label_key: str | None = None,
                        image_key: str | None = None, max_images: int = 1, cache_dir: Path | None = None,
                        **options) -> list[VisionExample]:
    """Read a prompt dataset with images: one VisionExample per kept record, its text rendered by
    the processor's chat template (the image placeholders in place), its images opened."""
    name, kept = _vision_records(source, input_key, label_key, image_key, max_images, options)
    out = []
    for i, record, messages, images in kept:
        opened = _opened(name, record, images, _base_dir(source), cache_dir)
        try:
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja / transformers raise many types
            raise DataError(f"{name}, {record.where}: the processor's chat template failed ({type(exc).__name__}: "
                            f"{first_line(exc)})") from exc
        label = label_value(record, label_key, "label_key", name) if label_key is not None else None
        # raw: the record as given (a string prompt stays a string: TRL's reward contract then passes strings)
        out.append(VisionExample(PromptExample(text=text, label=label, raw=dict(record.data), index=i), opened))
    return out


# Keys of a processor's output that are per token (the batch builds them), not image tensors.
# Per-token outputs of a processor, not image tensors: the forward derives them from the ids (PaliGemma's
# processor also returns training `labels`, the ids themselves).
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "labels")


def encode(processor, text: str, images: list) -> tuple[list[int], VisionInputs | None]:
    """(token ids with each image's tokens expanded, VisionInputs or None without images). Text without images
    is the tokenizer's (PaliGemma's processor refuses text alone)."""
    if not images:
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"], None
    out = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    ids = out["input_ids"][0].tolist()
    tensors = {k: v for k, v in out.items() if k not in TOKEN_KEYS}
    return ids, VisionInputs(tensors, len(images), tuple(images))


def tokenize_vision_prompts(examples: list[VisionExample], processor, max_len: int,
                            input_key: str | None = None) -> tuple[list[PromptItem], int]:
    """PromptItems (`vision` set) of the examples; prompts longer than `max_len` tokens, image
    tokens included, are skipped and counted."""
    items, skipped = [], 0
    for vx in examples:
        ex = vx.example
        try:
            ids, vision = encode(processor, ex.text, vx.images)
        except ValueError as exc:  # the processor's own checks (an image's aspect ratio, its placeholders)
            sizes = ", ".join(f"{w}x{h}" for w, h in (image.size for image in vx.images))
            raise DataError(f"record {ex.index}: {type(processor).__name__} refuses its image(s) of {sizes} pixels "
                            f"({first_line(exc)}); crop, pad or resize them, or drop the record") from exc
        if len(ids) > max_len:
            skipped += 1
            continue
        record = dict(ex.raw)
        items.append(PromptItem(ex.text, ids, ex.label, raw=record.get(input_key, ex.text), record=record,
                                vision=vision, images=vx.images or None))
    if not items:
        raise DataError(f"every prompt is longer than --data.prompt_max_len {max_len} tokens (image tokens "
                        "included); raise it")
    return items, skipped


def refuse_images_for_text_model(source: Source, input_key: str, image_key: str | None, model: str,
                                 **options) -> None:
    """DataError when a record holds images but the model is text-only (checked before it loads)."""
    name = source_name(source)
    _, kept = kept_records(source, input_key, None, apply_chat_template=True, **options)
    for _, record in sorted(kept, key=lambda kept_one: kept_one[0]):  # the first in file order
        if record_has_images(record, input_key, image_key):
            raise DataError(f"{name}, {record.where}: the record holds images but the model {model} is a text-only "
                            "model (its config has no vision_config); use a vision-language model or drop the "
                            "images")
