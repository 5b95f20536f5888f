"""SFT and preference data with images, for a vision-language model (docs/vision.md).

`VisionTextFormat` is `data.supervised.TextFormat` through the model's processor: the record's
prompt (or conversation) gets its images as in RL prompts (`data.images.messages_with_images`: the
image column fills the `{"type": "image"}` placeholders, inline parts carry their own, placeholders
are added to the first user message when there are none), the conversation is rendered by the
processor's chat template and cut into prompt and target turns as TextFormat cuts it, and each
piece is tokenized by the processor with the images whose placeholders it holds (each image
expanded to its tokens). The sample's `vision` holds the pixel tensors of all its images. In a
preference pair both sides carry the prompt's images.

`check_supervised_images` makes the image checks before any model loads: every image opens and
fits, and no record holds more than `max_images`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlhfkit.data.images import (
    VisionInputs,
    column_values,
    encode,
    image_column,
    inline_images,
    messages_with_images,
    open_image,
)
from rlhfkit.data.records import Source
from rlhfkit.data.supervised import TextFormat, TokenSample, select_records
from rlhfkit.errors import DataError

# Processors whose images must all sit in one rendered piece (the first user turn): PaliGemma's.
ONE_PIECE_PROCESSORS = ("PaliGemmaProcessor",)


class VisionTextFormat(TextFormat):
    """TextFormat over a VLM processor (module docstring); always renders with the chat template.

    image_key: the record's image column (None: `images`, else `image`); max_images: most images a
    record may hold; base_dir: where relative image paths are looked up first (the data file's folder)."""

    def __init__(self, processor, image_key: str | None = None, max_images: int = 1, base_dir: Path | None = None):
        self.processor, self.tokenizer, self.renderer = processor, processor.tokenizer, processor
        self.chat, self.template = True, None
        self.image_key, self.max_images, self.base_dir = image_key, max_images, base_dir
        self._queue: list = []
        self._parts: list[VisionInputs] = []
        self._seen, self._late = 0, False  # tokens of the pieces so far; whether images came after some

    def encode(self, prompt: Any, response: Any, where: str, all_turns: bool,
               record: dict | None = None, response_where: str | None = None) -> TokenSample:
        images = record_images(record or {}, self.image_key)
        messages, values = messages_with_images(prompt, images, where)
        if len(values) > self.max_images:
            raise DataError(f"{where}: {len(values)} images, more than --data.max_images_per_prompt "
                            f"{self.max_images}; raise it or drop images from the record")
        self._queue = [open_image(v, f"{where}, image {k}", self.base_dir) for k, v in enumerate(values)]
        self._parts, self._seen, self._late = [], 0, False
        sample = super().encode(messages, response, where, all_turns, response_where=response_where)
        if self._queue:
            raise DataError(f"{where}: the chat template rendered fewer image placeholders than the record's "
                            f"{len(values)} images")
        if (len(self._parts) > 1 or self._late) and self._one_piece():
            raise DataError(f"{where}: images after the conversation's first turn; "
                            f"{type(self.processor).__name__} lays out a prompt's images for one prompt and one "
                            "response (PaliGemma's prefix, Llama 3.2 Vision's per-token cross-attention mask): "
                            "keep the record's images in its first turn")
        if values:
            keys = sorted({k for part in self._parts for k in part.tensors})
            tensors = {k: torch.cat([p.tensors[k] for p in self._parts if k in p.tensors]) for k in keys}
            sample.vision = VisionInputs(tensors, len(values))
        return sample

    def _one_piece(self) -> bool:
        """Whether the processor's images hold in one rendered piece only: per-token tensors (Llama 3.2 Vision's
        cross_attention_mask covers the piece's tokens) or a prefix LM's processor (PaliGemma's writes each
        piece with images as a prefix of its own)."""
        per_token = any("cross_attention_mask" in part.tensors for part in self._parts)
        return per_token or type(self.processor).__name__ in ONE_PIECE_PROCESSORS

    def _ids(self, text: str) -> list[int]:
        """Token ids of one rendered piece; its image placeholders take the next images in order."""
        if not text:
            return []
        count = text.count(self.processor.image_token)
        images, self._queue = self._queue[:count], self._queue[count:]
        ids, vision = encode(self.processor, text, images)
        if vision is not None:
            self._parts.append(vision)
            self._late = self._late or self._seen > 0  # a piece with images after other tokens
        self._seen += len(ids)
        return ids


def record_images(record: dict, image_key: str | None) -> list:
    """The image values of a record's image column (none when it has no such column)."""
    column = image_column(record, image_key)
    return column_values(record.get(column)) if column else []


def check_supervised_images(source: Source, prompt_keys: tuple[str | None, ...], image_key: str | None,
                            max_images: int, max_samples: int | None = None, seed: int | None = None,
                            split: str = "train", config: str | None = None, data_dir: str | None = None) -> int:
    """Before models load: every image of each kept record (its image column and inline parts of the
    `prompt_keys` values) opens and fits, at most `max_images` per record. Returns the records checked."""
    rows = select_records(source, {}, max_samples, seed, split, config, data_dir)
    base = Path(source).parent if isinstance(source, (str, Path)) and Path(source).is_file() else None
    for _, record, name in sorted(rows, key=lambda row: row[0]):
        where = f"{name}, {record.where}"
        column = image_column(record.data, image_key)
        if image_key is not None and column not in record.data:
            raise DataError(f"{where}: no image column {image_key!r} (--data.image_key); the record has "
                            f"{', '.join(sorted(record.data))}")
        values = column_values(record.data.get(column)) if column else []
        inline = [image for key in prompt_keys if key for image in inline_images(record.data.get(key))]
        if len(values) + len(inline) > max_images:
            raise DataError(f"{where}: {len(values) + len(inline)} images, more than --data.max_images_per_prompt "
                            f"{max_images}; raise it or drop images from the record")
        for k, value in enumerate(values + inline):
            open_image(value, f"{where}, image {k}", base)
    return len(rows)
