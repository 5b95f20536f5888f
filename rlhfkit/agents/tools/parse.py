"""Parse the tool calls out of a model's turn with transformers' response parsing.

`parse_tool_calls(text, tokenizer)` reads a decoded assistant turn (special tokens kept) with
`tokenizer.parse_response` and a response template: the tokenizer's own `response_template`
where it ships one, else the entry of `TOOL_PARSERS` its chat template points to (or the one
named by `parser=`, the `--agent.tool_parser` flag):

  hermes       Qwen2.5, Qwen3, Hermes and rlhfkit's default prompt for templates without
               tools: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more
  llama3_json  Llama 3.1+: `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` or as
               the whole turn), several separated by `;`
  qwen3_coder  Qwen3-Coder, Qwen3.5 and later, Nemotron 3: `<tool_call><function=NAME><parameter=KEY>
               VALUE</parameter>...</function></tool_call>`, the values cast by the tool schema's types
  glm45        GLM-4.5 and later: `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...
               </tool_call>`, the values cast by the tool schema's types
  mistral      Mistral before tokenizer v11: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
  mistral_v11  Mistral with tokenizer v11 and later (Mistral Small 3.2, Magistral, Devstral, Ministral 3):
               `[TOOL_CALLS]NAME[ARGS]{...}` per call (a `[CALL_ID]ID` before `[ARGS]` is skipped),
               reasoning in `[THINK]...[/THINK]`

A malformed call (bad JSON, no name, arguments that are not an object) is reported in the
returned errors, never raised: the other calls of the turn still count.

`CALL_SYNTAX` says how each parser's call opens and ends, for the endpoint's `tool_choice` (a forced
call's opening, with or without its name) and `parallel_tool_calls` false (where the first call ends).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlhfkit.agents.tools.schema import ToolCall
from rlhfkit.errors import ConfigError

_FUNCTION = {"type": "function", "function": "{content}"}
TOOL_PARSERS: dict[str, dict] = {
    "hermes": {
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"<\|im_start\|>assistant\n|^",
        "fields": {
            "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True,
                           "content": "json", "transform": _FUNCTION},
            "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>|$)", "content": "text"},
        },
    },
    "llama3_json": {
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n|^",
        "fields": {
            # a call opens the turn, follows the previous call's `;` or follows <|python_tag|> (as vLLM's
            # llama3_json parser reads it): a brace inside an answer ("\\boxed{5}") is text, not a call
            "tool_calls": {"open_pattern": r"(?:^\s*|(?<=\}\s*;)\s*|\s*<\|python_tag\|>\s*)(?=\{)",
                           "close_pattern": r"(?<=\})\s*(?:;|<\|eot_id\|>|<\|eom_id\|>|$)", "repeats": True,
                           "content": "json",
                           "transform": {"type": "function", "function": {"name": "{content.name}",
                                                                         "arguments": "{content.parameters}"}}},
            "content": {"close_pattern": r"\s*(?:<\|eot_id\|>|<\|eom_id\|>|$)", "content": "text"},
        },
    },
    "qwen3_coder": {  # vLLM's name for it
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"<\|im_start\|>assistant\n|^",
        "fields": {
            "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {"open_pattern": r"\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>",
                           "close_pattern": r"</function>\s*</tool_call>", "repeats": True, "content": "xml-inline",
                           "content_args": {
                               "tag_pattern": r"<parameter=(?P<key>[^>\n]+)>\n?(?P<value>.*?)\n?</parameter>"},
                           "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
            "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>|$)", "content": "text"},
        },
    },
    "glm45": {  # vLLM's name for it
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"<\|assistant\|>|^",
        "fields": {
            "reasoning_content": {"open_pattern": r"\s*<think>", "close": "</think>", "content": "text"},
            "tool_calls": {"open_pattern": r"\s*<tool_call>(?P<name>[^\n<]+)", "close": "</tool_call>",
                           "repeats": True, "content": "xml-inline",
                           "content_args": {"tag_pattern": r"<arg_key>(?P<key>.*?)</arg_key>\s*"
                                                           r"<arg_value>(?P<value>.*?)</arg_value>"},
                           "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
            "content": {"close_pattern": r"\s*(?:<\|user\|>|<\|observation\|>|<\|endoftext\|>|$)", "content": "text"},
        },
    },
    "mistral": {
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"\[/INST\]|^",
        "fields": {
            "tool_calls": {"open": "[TOOL_CALLS]", "close_pattern": r"(?<=\])\s*(?:</s>|$)", "content": "json",
                           "transform_each": True,
                           "transform": {"type": "function", "function": {"name": "{name}",
                                                                         "arguments": "{arguments}"}}},
            "content": {"close_pattern": r"\s*(?:</s>|$)", "content": "text"},
        },
    },
    "mistral_v11": {
        "defaults": {"role": "assistant"},
        "start_anchor_pattern": r"\[/INST\]|^",
        "fields": {
            "reasoning_content": {"open": "[THINK]", "close": "[/THINK]", "content": "text"},
            # each call runs from its [TOOL_CALLS]NAME[ARGS] to the next call or the end of the turn
            "tool_calls": {"open_pattern": r"\s*\[TOOL_CALLS\](?P<name>[^\[\]\s]+)(?:\[CALL_ID\][^\[]*)?\[ARGS\]",
                           "close_pattern": r"\s*(?=\[TOOL_CALLS\]|</s>|$)", "repeats": True, "content": "json",
                           "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
            "content": {"close_pattern": r"\s*(?:</s>|$)", "content": "text"},
        },
    },
}
DEFAULT_PARSER = "hermes"


@dataclass(frozen=True)
class CallSyntax:
    """How a parser's calls are written, for forcing one and for ending a turn after its first.

    opening: the text that opens a call, before its name; named: the opening with the name written
    (`str.format` fields `name`, and `name_json`: the name as a JSON string), cut where the model's own
    tokens begin (before the arguments' value, so a BPE tokenizer's " {" stays the model's); end: the
    text after which one call is complete (None: the format marks no end of a call, as Llama 3's
    `;`-separated JSON and Mistral's JSON list); end_is_next: `end` is the next call's opening (the cut
    goes before it); reasoning: the (open, close) markers of the turn's reasoning, where calls are drafts."""

    opening: str
    named: str
    end: str | None
    end_is_next: bool = False
    reasoning: tuple[str, str] | None = None

    def forced(self, name: str | None) -> str:
        """The text that forces a call: of the function `name`, or of any function (None)."""
        return self.opening if name is None else self.named.format(name=name, name_json=json.dumps(name))


_THINK = ("<think>", "</think>")
CALL_SYNTAX: dict[str, CallSyntax] = {
    "hermes": CallSyntax("<tool_call>\n", '<tool_call>\n{{"name": {name_json}, "arguments":', "</tool_call>",
                         reasoning=_THINK),
    "llama3_json": CallSyntax('{"name":', '{{"name": {name_json}, "parameters":', None),
    "qwen3_coder": CallSyntax("<tool_call>\n<function=", "<tool_call>\n<function={name}>\n", "</tool_call>",
                              reasoning=_THINK),
    "glm45": CallSyntax("<tool_call>", "<tool_call>{name}\n", "</tool_call>", reasoning=_THINK),
    "mistral": CallSyntax("[TOOL_CALLS]", '[TOOL_CALLS] [{{"name": {name_json}, "arguments":', None),  # as its template
    "mistral_v11": CallSyntax("[TOOL_CALLS]", "[TOOL_CALLS]{name}[ARGS]", "[TOOL_CALLS]", end_is_next=True,
                              reasoning=("[THINK]", "[/THINK]")),
}
# what transformers' parsing raises on text the model wrote; RecursionError: JSON nested past
# Python's recursion limit ("[[[[...") would otherwise end the run
_REFUSED = (ValueError, KeyError, TypeError, RecursionError)


def template_text(tokenizer) -> str:
    """The tokenizer's chat template source ("" without one; all of them for a dict of templates)."""
    t = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(t.values()) if isinstance(t, dict) else t


def detect_parser(tokenizer) -> str:
    """The `TOOL_PARSERS` name the tokenizer's chat template points to (hermes when it names none)."""
    text = template_text(tokenizer)
    if "[TOOL_CALLS]" in text:
        return "mistral_v11" if "[ARGS]" in text else "mistral"
    if "<function=" in text and "<parameter=" in text:
        return "qwen3_coder"
    if "<arg_key>" in text and "<arg_value>" in text:
        return "glm45"
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and "parameters" in text):
        return "llama3_json"
    return DEFAULT_PARSER


def response_template(tokenizer, parser: str | dict | None = None) -> dict:
    """The response template that parses this tokenizer's tool calls: `parser` (a TOOL_PARSERS
    name or a template dict), else the tokenizer's own `response_template`, else `detect_parser`."""
    if isinstance(parser, dict):
        return parser
    if parser is not None:
        if parser not in TOOL_PARSERS:
            raise ConfigError(f"--agent.tool_parser {parser!r} is unknown; valid: {', '.join(TOOL_PARSERS)}")
        return TOOL_PARSERS[parser]
    own = getattr(tokenizer, "response_template", None)
    return own if own is not None else TOOL_PARSERS[detect_parser(tokenizer)]


def parse_tool_calls(text: str, tokenizer, parser: str | dict | None = None, prefix: str = "",
                     tools: list[dict] | None = None) -> tuple[str, list[ToolCall], list[str]]:
    """(content, calls, errors) of one assistant turn `text` (decoded with special tokens kept).

    `prefix`: the prompt text before the turn (templates that pre-write part of the turn need
    it); `tools`: the tool schemas, whose parameter types cast the arguments ("7" -> 7 for an
    integer). Calls get ids call_0, call_1, ... in the order they appear. Never raises on what
    the model wrote: each malformed call is one line of `errors`.
    """
    schema = response_template(tokenizer, parser)
    try:
        parsed = tokenizer.parse_response(text, schema, prefix=prefix, tools=tools)
        raw, content = parsed.get("tool_calls") or [], parsed.get("content") or ""
        return (content, *_checked(list(enumerate(raw))))
    except _REFUSED:  # one region failed: parse the regions one by one
        return _by_region(text, schema, tools)


def _checked(raw: list[tuple[int, Any]]) -> tuple[list[ToolCall], list[str]]:
    """The well-formed calls of (index, parsed entry) pairs, and one error per other entry."""
    calls, errors = [], []
    for k, item in raw:
        fn = item.get("function", item) if isinstance(item, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments", fn.get("parameters", {})) if isinstance(fn, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                args = None
        if not isinstance(name, str) or not name:
            errors.append(f"tool call {k}: no function name (got {json.dumps(item, default=str)[:200]})")
        elif not isinstance(args, dict):
            errors.append(f"tool call {k} ({name}): arguments must be a JSON object")
        else:
            calls.append(ToolCall(name=name, arguments=args, id=f"call_{k}"))
    return calls, errors


def _by_region(text: str, schema: dict, tools: list[dict] | None) -> tuple[str, list[ToolCall], list[str]]:
    """The fallback when `parse_response` refuses the turn: each `tool_calls` region parsed on its
    own with the template's field (transformers' content parser), the rest as content."""
    from transformers.utils.chat_parsing.content_parsers import process_field
    from transformers.utils.chat_parsing.response_templates import (
        load_response_template,
    )

    tmpl = load_response_template(schema)
    text = tmpl.truncate_past_last_anchor(text) if tmpl.start_anchor_re.search(text) else text
    field, content_field = tmpl.fields["tool_calls"], tmpl.fields.get(tmpl.implicit or "content")
    raw, errors, pieces, at = [], [], [], 0
    while (m := field.open_re.search(text, at)) is not None:
        pieces.append(text[at:m.start()])
        close = field.close_re.search(text, m.end()) if field.close_re is not None else None
        body, at = (text[m.end():close.start()], close.end()) if close else (text[m.end():], len(text))
        try:
            value = process_field(body, field, m.groupdict())
            raw.extend(value if isinstance(value, list) else [value])
        except _REFUSED as exc:
            raw.append(None)
            errors.append(f"tool call {len(raw) - 1}: malformed ({str(exc).splitlines()[0][:160]}): {body[:200]!r}")
    pieces.append(text[at:])
    content = "".join(pieces)
    if content_field is not None and content_field.close_re is not None:
        end = content_field.close_re.search(content)
        content = content[:end.start()] if end else content
    calls, more = _checked([(k, r) for k, r in enumerate(raw) if r is not None])
    del tools  # argument casting needs the whole-turn parser; region parsing keeps the model's values
    return content.strip(), calls, errors + more
