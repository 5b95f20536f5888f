"""Chat requests with images, for a vision-language policy: OpenAI's (and vLLM's) image content parts.

A message's content may hold `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`
parts beside `{"type": "text", "text": ...}` parts. The image is decoded from its data: URL (any
format PIL reads: PNG, JPEG, ...); an http(s) URL is refused (the trainer fetches nothing from the
network), as is an image that does not decode or has more than MAX_IMAGE_PIXELS pixels. Each image
is known by the SHA-256 of its bytes: a later call that repeats a conversation repeats its images.

The messages are rendered by the processor's chat template (an image part as `{"type": "image"}`, its
placeholder) and the processor expands each placeholder to the image's tokens and computes its tensors
(`VisionInputs`, as data.images.encode does for dataset prompts). A call that continues an earlier one
gets that call's image tensors with the new messages' images after them (`merge_vision`), as the
multi-turn executor merges an episode's feedback images.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.agents.endpoint.wire import BadRequest
from rlhfkit.agents.tools.render import ToolTemplate
from rlhfkit.data.images import VisionInputs, data_url_bytes, encode, open_image
from rlhfkit.errors import DataError
from rlhfkit.rollout.vision import merge_vision

TEXT_PARTS = ("text", "input_text")


class RefusedImage(BadRequest):
    """An image part the endpoint does not serve; `counter` names the endpoint's refusal counter."""

    def __init__(self, message: str, counter: str = "refused_image"):
        super().__init__(message)
        self.counter = counter


def decode_image_url(url: Any, where: str):
    """(RGB PIL image, SHA-256 of its bytes) of a data: URL; `RefusedImage` for any other URL or bad data."""
    if not isinstance(url, str):
        raise BadRequest(f"{where}: image_url.url must be a string")
    if url.startswith(("http://", "https://")):
        raise RefusedImage(f"{where}: image URL {url[:60]!r} refused: the trainer fetches no images from the "
                           "network; send the image inline as a data:image/...;base64 URL", "refused_image_url")
    try:
        raw = data_url_bytes(url, where)
        image = open_image(raw, where)
    except DataError as exc:
        raise RefusedImage(str(exc)) from exc
    return image, hashlib.sha256(raw).hexdigest()


@dataclass
class ImageParts:
    """The images of one request, in order, as its messages' content is read (`content`)."""

    placeholders: tuple[str, ...] = ()  # the model's image tokens as text: refused in text parts
    images: list = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    def content(self, content: Any) -> Any:
        """A message's content as the chat template takes it: a string when it holds no image, else
        a list of text parts and `{"type": "image", "sha256": KEY}` parts (the key tells images apart)."""
        if content is None or isinstance(content, str):
            self.check_text(content or "")
            return content or ""
        if not isinstance(content, list):
            raise BadRequest(f"messages: content of type {type(content).__name__}; give a string or a list of "
                             "text and image_url parts")
        parts = []
        for p in content:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind in TEXT_PARTS:
                text = str(p.get("text", ""))
                self.check_text(text)
                parts.append({"type": "text", "text": text})
            elif kind == "image_url":
                ref = p.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
                image, key = decode_image_url(url, f"messages: image {len(self.images)}")
                self.images.append(image)
                self.keys.append(key)
                parts.append({"type": "image", "sha256": key})
            else:
                raise BadRequest(f"messages: content part of type {kind!r}; give text or image_url parts")
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts


    def check_text(self, text: str) -> None:
        hit = next((t for t in self.placeholders if t in text), None)
        if hit is not None:
            raise BadRequest(f"messages: text holds the model's image token {hit!r}; send images as image_url parts")


def bare(messages: list[dict]) -> list[dict]:
    """The messages as the chat template sees them: image parts without their keys."""
    return [dict(m, content=[{"type": "image"} if p["type"] == "image" else p for p in m["content"]])
            if isinstance(m.get("content"), list) else m for m in messages]


class VisionTemplate:
    """The processor's chat template over messages with image parts: a whole prompt, or the tokens
    (and images) that follow a sampled turn for new messages, images expanded by the processor. The
    text is rendered by a `ToolTemplate` whose renderer is the processor (with the request's tools)."""

    def __init__(self, processor):
        self.processor = processor
        tok = processor.tokenizer
        names = [getattr(processor, n, None) for n in ("image_token", "video_token")]
        self.placeholder_texts = tuple(t for t in names if isinstance(t, str) and t)
        self.placeholder_ids = {int(tok.convert_tokens_to_ids(t)) for t in self.placeholder_texts}

    def prompt(self, tt: ToolTemplate, messages: list[dict], images: list) -> tuple[list[int], VisionInputs | None]:
        return self.encode(tt.render(bare(messages)), images)

    def encode(self, text: str, images: list) -> tuple[list[int], VisionInputs | None]:
        try:
            return encode(self.processor, text, images)
        except ValueError as exc:  # the processor's check: placeholders and images differ in number
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise BadRequest(f"messages: the text and its {len(images)} image(s) do not match ({first}); do not "
                             "write the model's image tokens in text, send image_url parts") from exc

    def delta(self, tt: ToolTemplate, action_ids: list[int], stopped: bool, new_messages: list[dict], images: list,
              vision: VisionInputs | None) -> tuple[list[int], VisionInputs | None]:
        """(ids after the sampled turn `action_ids`, the images of the whole context): as
        ToolTemplate.delta, the new messages' images expanded and put after the earlier `vision`."""
        text = tt.delta_text(bare(new_messages))
        if stopped and action_ids:
            end = self.processor.tokenizer.decode([action_ids[-1]], skip_special_tokens=False)
            if end and text.startswith(end):
                text = text[len(end):]
        ids, new = self.encode(text, images)
        return ids, merge_vision(vision, new)
