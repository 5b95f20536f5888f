"""Mistral 3's (Pixtral's) processor without torchvision.

transformers' `PixtralProcessor` module imports its torchvision image processor at import time, so
without torchvision the class cannot even be imported. Its image work is done by transformers' PIL
image processor (`PixtralImageProcessorPil`): each image is shrunk to fit `longest_edge` and its sides
rounded up to whole patches of `patch_size * spatial_merge_size` pixels; what is left to the processor
is the text: each image placeholder becomes one `image_token` per merged patch, row by row, each row
closed by `image_break_token` and the last one by `image_end_token` instead. `pixtral_processor_class()`
is a ProcessorMixin doing that with the same constructor settings; it keeps transformers' class name, so
a folder it saves loads with transformers' own processor where torchvision is installed.
"""

from __future__ import annotations

import functools


@functools.cache
def pixtral_processor_class() -> type:
    """A transformers ProcessorMixin named PixtralProcessor: image processor (PIL), tokenizer, chat template,
    and transformers' PixtralProcessor settings (patch_size, spatial_merge_size, the three image tokens)."""
    from transformers.processing_utils import ProcessorMixin

    def __init__(self, image_processor=None, tokenizer=None, patch_size: int = 16, spatial_merge_size: int = 1,
                 chat_template=None, image_token: str = "[IMG]", image_break_token: str = "[IMG_BREAK]",
                 image_end_token: str = "[IMG_END]", **kwargs):
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token
        self.image_token_id, self.image_break_token_id, self.image_end_token_id = (
            tokenizer.convert_tokens_to_ids(t) for t in (image_token, image_break_token, image_end_token))

    def image_token_ids(self) -> list[int]:
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images, **images_kwargs):
        # the image processor rounds each side up to whole merged patches, the tokens' pixel size
        return ProcessorMixin._process_images(self, images, **{**images_kwargs, "patch_size": _step(self)})

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        return image_placeholder(self, *image_inputs["image_sizes"][image_idx])

    def model_input_names(self) -> list[str]:
        return [*self.tokenizer.model_input_names, *self.image_processor.model_input_names, "image_sizes"]

    methods = {"__init__": __init__, "__module__": __name__, "image_token_ids": property(image_token_ids),
               "_process_images": _process_images, "replace_image_token": replace_image_token,
               "model_input_names": property(model_input_names),
               "text_kwargs": {"return_tensors": "pt"}, "images_kwargs": {"return_tensors": "pt"}}
    return type("PixtralProcessor", (ProcessorMixin,), methods)


def _step(processor) -> int:
    return processor.patch_size * processor.spatial_merge_size


def image_placeholder(processor, height: int, width: int) -> str:
    """The text one image of `height` x `width` pixels (as the image processor resized it) becomes: a row of
    width // step image tokens and a break token for each height // step rows (step = patch_size x
    spatial_merge_size, one language-model token), the last break an end token."""
    step = _step(processor)
    row = processor.image_token * (int(width) // step)
    rows = int(height) // step
    return (row + processor.image_break_token) * (rows - 1) + row + processor.image_end_token
