"""Tinker's image chunks on a vision-language base model: a `ModelInput` whose chunks are text
tokens and images (`ImageChunk`: the image's PNG or JPEG bytes and the number of tokens it
stands for, `expected_tokens`) becomes the model's token ids and the pixel tensors of its images.

Each image is decoded (data.images.open_image: at most MAX_IMAGE_PIXELS pixels, read from its
header before decoding) and put through the model's processor as its image placeholder alone
(`processor.image_token`), which the processor expands to the image's tokens and computes the
pixel tensors of (data.images.encode): for Qwen-VL, N `<|image_pad|>` tokens, one per 2 x 2 merged
patch. Those tokens take the chunk's place; the text around it is the client's, as
tinker-cookbook's Qwen-VL renderers write it (`<|vision_start|>` before the chunk and
`<|vision_end|>` after it in the text chunks). A chunk's `expected_tokens` must be that N (the
SDK counts a ModelInput's length, and the client its loss inputs, with it): a mismatch is refused
in one line. The images' tensors go to the forward concatenated in their order in the input, as
the processor makes them for a prompt holding several images.

A text chunk may not hold the model's image or video placeholder ids (the forward would take them
as slots for image features); an image for a text-only model, an image by reference
(`ImageAssetPointerChunk`, which the server would have to fetch) and audio (`DmelChunk`) are refused.
"""

from __future__ import annotations

from rlhfkit.data.images import VisionInputs, encode, open_image
from rlhfkit.errors import DataError
from rlhfkit.models.vision import concat_vision
from rlhfkit.rollout.vision import placeholder_ids
from rlhfkit.serving.tinker.wire import WireImage

FORMATS = ("png", "jpeg")


class ImageInputs:
    """Expands ModelInputs with images for a VLM's `processor` (None: a text-only model) and `config`."""

    def __init__(self, processor, config):
        self.processor = processor
        self.placeholders = set(placeholder_ids(config)) if processor is not None else set()

    def expand(self, chunks: list, where: str) -> tuple[list[int], VisionInputs | None]:
        """(token ids, the images' tensors or None) of `chunks`: ints (text tokens) and WireImages in
        order. DataError naming `where` and the chunk for an image the model cannot take."""
        tokens: list[int] = []
        images: list[VisionInputs] = []
        for k, item in enumerate(chunks):
            if isinstance(item, WireImage):
                ids, vision = self._image(item, f"{where}, image {len(images)}")
                tokens += ids
                images.append(vision)
            else:
                if item in self.placeholders:
                    raise DataError(f"{where}: token {item} (at {k}) is the model's image placeholder; send the image "
                                    "itself as an ImageChunk, which the server expands to its tokens")
                tokens.append(item)
        if not images:
            return tokens, None
        merged = VisionInputs(concat_vision(images), len(images), tuple(i for v in images for i in v.images))
        return tokens, merged

    def _image(self, chunk: WireImage, where: str) -> tuple[list[int], VisionInputs]:
        if self.processor is None:
            raise DataError(f"{where}: an image chunk, but the served model is a text-only model (its config has no "
                            "vision_config); serve a vision-language model for images")
        if chunk.format not in FORMATS:
            raise DataError(f"{where}: image format {chunk.format!r}; send png or jpeg")
        image = open_image(chunk.data, where)
        ids, vision = encode(self.processor, self.processor.image_token, [image])
        if vision is None or not vision.tensors or not self.placeholders & set(ids):
            raise DataError(f"{where}: the model's processor did not expand its image placeholder "
                            f"{self.processor.image_token!r} into image tokens; this model's images are not served")
        if chunk.expected_tokens is not None and chunk.expected_tokens != len(ids):
            w, h = image.size
            raise DataError(f"{where}: expected_tokens {chunk.expected_tokens}, but the model's processor makes "
                            f"{len(ids)} tokens of this {w}x{h} image; count them with the model's own image "
                            "processor (tinker-cookbook's renderer for this model does)")
        return ids, vision
