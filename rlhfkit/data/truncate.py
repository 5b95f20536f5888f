"""Over-long prompts cut to --data.prompt_max_len tokens (--data.truncation left|right|middle), as verl's
`data.truncation` does, but cutting only the prompt's own text.

verl cuts the token ids of the rendered prompt: left keeps the last `max_len` tokens, right the first, middle
the first `max_len // 2` and the last `max_len - max_len // 2`. Cut that way, a chat prompt loses its
template's tokens (the opening `<|im_start|>system ...` on the left, the generation prompt
`<|im_start|>assistant` on the right). Here the tokens around the prompt's text (the chat template's, the
input template's, earlier messages) are kept, and the text's own tokens (the last user message of a chat)
are cut on the chosen side to the room left. The text is located by rendering the prompt again with a mark
in its place (`content_span`). A prompt whose text cannot be found in the rendered string (a template that
rewrites it, or one that holds it twice), or whose kept tokens alone exceed `max_len`, is not cut: it is
skipped and counted, as without truncation.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.errors import ConfigError

TRUNCATION_SIDES = ("left", "right", "middle")


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


def _last_user(value: Any) -> int | None:
    """The index of a message list's last user message, None where there is none or its content is not text."""
    if isinstance(value, list):
        for i in range(len(value) - 1, -1, -1):
            message = value[i]
            if isinstance(message, dict) and message.get("role") == "user":
                return i if isinstance(message.get("content"), str) else None
    return None


def _content(value: Any) -> str | None:
    """The prompt's own text in its record value: the string, or a message list's last user message."""
    if isinstance(value, str):
        return value
    i = _last_user(value)
    return None if i is None else value[i]["content"]


_MARK = "\x00rlhfkit-prompt-text\x00"


def _render_marked(value: Any, tokenizer: Any, input_template: str | None) -> str | None:
    """`value` rendered as data.prompts renders it (a string by `input_template`; else by the chat template with
    the generation prompt, a string as one user message) with a mark for the prompt's own text; None where it
    cannot be rendered so."""
    try:
        if isinstance(value, str) and input_template is not None:
            return input_template.format(_MARK)
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
        i = _last_user(messages)
        if i is None:
            return None
        marked = [*messages[:i], {**messages[i], "content": _MARK}, *messages[i + 1:]]
        rendered = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja, transformers, str.format raise many types: then the text is searched
        return None
    return rendered if isinstance(rendered, str) else None


def content_span(text: str, value: Any, tokenizer: Any = None,
                 input_template: str | None = None) -> tuple[int, int] | None:
    """(start, end) characters of the prompt's own text (`value`, the record's) in the rendered `text`.

    `value` is rendered again with a mark for its text (`tokenizer`'s chat template, `input_template`): where
    that gives `text` around the mark, the span is exactly between the two (the template's own text may hold the
    prompt's words: a user message "an" is also in the generation prompt "assistant"); a template that loses
    the mark or holds it twice rewrites or repeats the text: None. Where it cannot be rendered, or its frame is
    not `text`'s, the text is searched (a template may strip it: then the stripped text), and only a single
    occurrence is taken; None where it is not there or is there more than once."""
    content = _content(value)
    if not content:
        return None
    if isinstance(value, str) and input_template is None and text == content:
        return 0, len(text)  # a string rendered as it is
    marked = _render_marked(value, tokenizer, input_template)
    if marked is not None:
        if marked.count(_MARK) != 1:
            return None
        before, after = marked.split(_MARK)
        end = len(text) - len(after)
        if text.startswith(before) and text.endswith(after) and len(before) <= end:
            return (len(before), end) if text[len(before):end] in (content, content.strip()) else None
    for part in (content, content.strip()):
        if part and text.count(part) == 1:
            start = text.find(part)
            return start, start + len(part)
    return None


def truncate_ids(tokenizer, text: str, value: Any, max_len: int, side: str,
                 input_template: str | None = None) -> list[int] | None:
    """The token ids of `text` in `max_len` tokens: the tokens around the prompt's own text kept, its own
    tokens cut on `side` (TRUNCATION_SIDES); None where it cannot be cut (see the module docstring).
    `input_template`: the one that rendered a string prompt (locates its text exactly)."""
    span = content_span(text, value, tokenizer, input_template)
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
