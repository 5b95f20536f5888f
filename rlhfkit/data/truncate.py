"""Over-long prompts cut to --data.prompt_max_len tokens (--data.truncation left|right|middle), as verl's
`data.truncation` does, but cutting only the prompt's own text.

verl cuts the token ids of the rendered prompt: left keeps the last `max_len` tokens, right the first, middle
the first `max_len // 2` and the last `max_len - max_len // 2`. Cut that way, a chat prompt loses its
template's tokens (the opening `<|im_start|>system ...` on the left, the generation prompt
`<|im_start|>assistant` on the right). Here the tokens around the prompt's text (the chat template's, the
input template's, earlier messages) are kept, and the text's own tokens (the last user message of a chat)
are cut on the chosen side to the room left. A prompt whose text cannot be found in the rendered string
(a template that rewrites it), or whose kept tokens alone exceed `max_len`, is not cut: it is skipped
and counted, as without truncation.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.errors import ConfigError

TRUNCATION_SIDES = ("left", "right", "middle")
TRUNCATIONS = ("skip", "error", *TRUNCATION_SIDES)


def keep(ids: list[int], n: int, side: str) -> list[int]:
    """`n` of `ids`: left keeps the end, right the start, middle the start's n // 2 and the end's rest."""
    if len(ids) <= n:
        return list(ids)
    if n <= 0:
        return []
    if side == "left":
        return list(ids[len(ids) - n:])
    if side == "right":
        return list(ids[:n])
    head = n // 2
    return list(ids[:head]) + list(ids[len(ids) - (n - head):])


def _content(value: Any) -> str | None:
    """The prompt's own text in its record value: the string, or a message list's last user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for message in reversed(value):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else None
    return None


def content_span(text: str, value: Any) -> tuple[int, int] | None:
    """(start, end) characters of the prompt's own text (`value`, the record's) in the rendered `text`: its
    last occurrence (a template may strip it: then the stripped text's); None where it is not there."""
    content = _content(value)
    for part in (content, content.strip() if content else None):
        if part:
            start = text.rfind(part)
            if start >= 0:
                return start, start + len(part)
    return None


def truncate_ids(tokenizer, text: str, value: Any, max_len: int, side: str) -> list[int] | None:
    """The token ids of `text` in `max_len` tokens: the tokens around the prompt's own text kept, its own
    tokens cut on `side` (TRUNCATION_SIDES); None where it cannot be cut (see the module docstring)."""
    span = content_span(text, value)
    if span is None:
        return None
    no_offsets = ConfigError("--data.truncation left|right|middle needs a fast tokenizer (token offsets); use "
                             "--data.truncation skip")
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as exc:  # transformers 4's slow (Python) tokenizers
        raise no_offsets from exc
    if "offset_mapping" not in enc:  # transformers 5's Python tokenizers drop the argument
        raise no_offsets
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    inside = [i for i, (a, b) in enumerate(offsets) if span[0] <= a and b <= span[1] and b > a]
    if not inside:
        return None
    lo, hi = inside[0], inside[-1] + 1
    room = max_len - lo - (len(ids) - hi)
    if room < 1:
        return None
    return ids[:lo] + keep(ids[lo:hi], room, side) + ids[hi:]
