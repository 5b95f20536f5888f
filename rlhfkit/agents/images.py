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

Agent files that drive the engine themselves (OpenRLHF's `execute`, execute.py) pass images the
way vLLM takes them, `llm_engine.generate(ids, sampling_params, multi_modal_data={"image": [...]})`:
`ImageEncoder` turns them into the image tensors the engine gets with the prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    opened = open_all(images, f"agent {source}: environment_images")
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


# ---------------------------------------------------------------- images through llm_engine.generate
def open_all(values: Any, where: str) -> list:
    """RGB PIL images of one image or a list of them (paths, bytes, PIL images); RewardError naming `where`."""
    values = [] if values is None else list(values) if isinstance(values, (list, tuple)) else [values]
    try:
        return [open_image(v, f"{where}[{k}]") for k, v in enumerate(values)]
    except DataError as exc:
        raise RewardError(str(exc)) from exc


def image_key(image) -> str:
    """SHA-256 of an opened image's mode, size and pixels: the same image, however it was loaded."""
    h = hashlib.sha256(f"{image.mode}{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


class ImageEncoder:
    """The image tensors of an engine call's `multi_modal_data` (OpenRLHF's agent files pass
    `{"image": [PIL images]}` to `llm_engine.generate` beside the prompt's token ids).

    The prompt's ids must hold each image's tokens expanded, as the processor writes them
    (`hf_tokenizer(text=[prompt], images=images)["input_ids"][0]`): their number is checked against
    what the images expand to, so the engine and the trainer's forward fill every image token. A
    list of images is encoded once (cached by their pixels); `max_images` (None: any) bounds one call's.
    """

    def __init__(self, processor: Any, source: str, max_images: int | None = None):
        self.processor, self.source, self.max_images = processor, source, max_images
        self._cache: dict[tuple[str, ...], tuple[VisionInputs, int]] = {}

    def __call__(self, ids: Sequence[int], data: Any,
                 placeholders: Sequence[int]) -> tuple[VisionInputs | None, tuple[str, ...]]:
        """(VisionInputs or None, the images' keys) of a call on `ids` with `data` (its multi_modal_data)."""
        wanted = sum(t in set(placeholders) for t in ids)
        data = data or {}
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise RewardError(f"agent {self.source}: multi_modal_data {type(data).__name__} with keys "
                              f"{sorted(data) if isinstance(data, dict) else '?'}; give {{'image': [images]}}")
        if not data.get("image"):
            if wanted:
                raise RewardError(f"agent {self.source}: llm_engine.generate got a prompt holding {wanted} image "
                                  "tokens and no images; pass multi_modal_data={'image': [images]}")
            return None, ()
        if self.processor is None:
            raise RewardError(f"agent {self.source}: llm_engine.generate got multi_modal_data images, which need a "
                              "vision-language policy")
        opened = open_all(data["image"], f"agent {self.source}: multi_modal_data['image']")
        if self.max_images is not None and len(opened) > self.max_images:
            raise RewardError(f"agent {self.source}: an engine call with {len(opened)} images, more than "
                              f"--data.max_images_per_prompt {self.max_images}; raise it")
        keys = tuple(image_key(im) for im in opened)
        if keys not in self._cache:
            self._cache[keys] = self._encode(opened, placeholders)
        vision, tokens = self._cache[keys]
        if tokens != wanted:
            raise RewardError(f"agent {self.source}: the prompt holds {wanted} image tokens, its {len(opened)} "
                              f"images take {tokens}; give the processor's ids (hf_tokenizer(text=[prompt], "
                              "images=images)), each image's tokens expanded")
        return vision, keys

    def _encode(self, opened: list, placeholders: Sequence[int]) -> tuple[VisionInputs, int]:
        """The images' tensors and how many image tokens they expand to (read off the processor's
        expansion of one placeholder per image, as its chat template writes it)."""
        messages = [{"role": "user", "content": [{"type": "image"} for _ in opened]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        ids, vision = encode(self.processor, text, opened)
        return vision, sum(t in set(placeholders) for t in ids)


@dataclass
class EpisodeImages:
    """The images of an episode that `agents.episode.agent_episode` drives through `llm_engine.generate`
    (OpenRLHF's default `execute` with `images`): the policy's processor, its image placeholder ids, the
    most images the episode may hold (None: any) and its images so far, which every call sends."""

    processor: Any
    placeholders: Sequence[int]
    max_images: int | None = None
    opened: list = field(default_factory=list)

    def prompt(self, text: str, images: Any, source: str) -> list[int]:
        """The prompt's ids, each of its images' tokens expanded by the processor."""
        self.opened = open_all(images, f"agent {source}: the prompt's images")
        try:
            return encode(self.processor, text, self.opened)[0]
        except ValueError as exc:  # the processor's check: placeholders and images differ in number
            raise RewardError(f"agent {source}: the prompt and its {len(self.opened)} images do not match "
                              f"({str(exc).splitlines()[0] if str(exc) else ''})") from exc

    def data(self) -> dict:
        """The keyword arguments of a `generate` call: the images so far as vLLM's multi_modal_data."""
        return {"multi_modal_data": {"image": list(self.opened)}} if self.opened else {}

    def feedback(self, tokenizer, text: str, images: Sequence, room: int, source: str) -> tuple[list[int], bool]:
        """(the feedback's ids, whether its images were dropped): cut to `room` tokens and the episode's
        image budget by `fit_feedback`; images that fit join the episode's."""
        opened = open_all(images, f"agent {source}: environment_images")
        ids, vision = feedback_tokens(self.processor, tokenizer, text, opened, self.placeholders, source)
        image_room = None if self.max_images is None else self.max_images - len(self.opened)
        ids, kept = fit_feedback(ids, vision, room, self.placeholders, image_room)
        if kept is not None:
            self.opened += opened
        return ids, vision is not None and kept is None
