"""Image observations of multi-turn episodes with a vision-language policy (OpenRLHF's
`vlm_multiturn_agent.py` form): `step()` returns `environment_images` beside its feedback text,
which holds the model's image placeholder once per image.

`feedback_tokens` tokenizes such feedback through the policy's processor (each placeholder
expanded to its image's tokens) and returns the images' tensors; the executor appends the tokens
to the episode (masked from the loss) and merges the tensors into the episode's, so that the next
turn's prefill and the trainer's forward see every image of the episode in order. Feedback
without images is tokenized as for a text policy, and refused when it holds a placeholder token
(no image would fill it). `fit_feedback` cuts feedback to the response budget and the episode's
image budget (--data.max_images_per_prompt, the prompt's images counted): a cut through feedback
with images, or images past the limit, drop the feedback's images and their placeholder tokens
(the episode ends there, truncated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhfkit.data.images import VisionInputs, encode, open_image
from rlhfkit.errors import DataError, RewardError


def feedback_tokens(processor: Any, tokenizer, feedback: str, images: Sequence, placeholders: Sequence[int],
                    source: str) -> tuple[list[int], VisionInputs | None]:
    """(token ids of `feedback`, its images' VisionInputs or None); RewardError naming `source` for an
    image that does not open, placeholders and images that do not match, or images without a processor."""
    if not images:
        ids = list(tokenizer(feedback, add_special_tokens=False)["input_ids"]) if feedback else []
        if set(ids) & set(placeholders):
            raise RewardError(f"agent {source}: environment_feedback holds an image placeholder token but step() "
                              "returned no environment_images; return one image per placeholder")
        return ids, None
    if processor is None:
        raise RewardError(f"agent {source}: step() returned environment_images, which need a vision-language "
                          "policy; return text feedback only")
    try:
        opened = [open_image(v, f"agent {source}: environment_images[{k}]") for k, v in enumerate(images)]
    except DataError as exc:
        raise RewardError(str(exc)) from exc
    try:
        return encode(processor, feedback, opened)
    except ValueError as exc:  # the processor's check: placeholders and images differ in number
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise RewardError(f"agent {source}: environment_feedback and its {len(opened)} environment_images do not "
                          f"match ({first}); put the model's image placeholder in the feedback once per image") from exc


def fit_feedback(ids: list[int], vision: VisionInputs | None, room: int, placeholders: Sequence[int],
                 image_room: int | None = None) -> tuple[list[int], VisionInputs | None]:
    """`ids` and `vision` cut to `room` tokens and `image_room` images (None: any number): whole when
    they fit; else the first `room` tokens, and feedback with images loses them and its placeholder
    tokens (no image may be cut in part, nor some of the feedback's images kept)."""
    room = max(room, 0)
    images_fit = vision is None or image_room is None or vision.num_images <= image_room
    if len(ids) <= room and images_fit:
        return ids, vision
    if vision is not None:
        banned = set(placeholders)
        ids = [t for t in ids if t not in banned]
    return ids[:room], None
