"""Render a conversation with tools through the tokenizer's chat template, token-in token-out.

`ToolTemplate(tokenizer, tools)` renders

- the prompt: the messages with the tool schemas in the template's `tools=`. A template that
  ignores `tools` (rendering with and without them gives the same text; SmolLM2's does) gets
  rlhfkit's default instead, said once in the log: the schemas in the system turn with the
  Hermes convention (`<tool_call>{"name", "arguments"}</tool_call>` to call, results in
  `<tool_response>` blocks of a user turn), so any chat model can learn to call tools;
- the tokens that follow a sampled turn (`delta`): the tool results (or an environment's
  observation) as the template renders those messages after an assistant turn, cut at the
  generation prompt of the next turn. Only these new tokens are appended to the episode: the
  sampled tokens are never re-tokenized;
- the check of every turn (`prefix_check`): the conversation rendered afresh from its messages
  and tokenized must start with the episode's tokens. When it does not, either the template
  re-rendered the history (Qwen3 drops the `<think>` of turns before the last user message;
  some templates re-serialise tool calls) -- "rerender" -- or the model sampled a
  tokenization the tokenizer would not produce for the same text -- "retokenized". Both are
  counted; the episode keeps the tokens it sampled (what the policy saw and is trained on), or,
  with `ToolExecutor(on_rerender="segment")`, goes on from the re-rendered tokens in a new segment.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rlhfkit.agents.tools.parse import (
    CALL_SYNTAX,
    DEFAULT_PARSER,
    TOOL_PARSERS,
    CallSyntax,
    detect_parser,
    parse_tool_calls,
    response_template,
    template_text,
)
from rlhfkit.agents.tools.schema import ToolCall
from rlhfkit.errors import ConfigError

log = logging.getLogger("rlhfkit")
_MARK = "rlhfkit-turn-mark-31d7"  # content of the stand-in assistant turn (see delta_text)
_PROBE = {"type": "function", "function": {"name": "rlhfkit_probe", "description": "probe",
                                           "parameters": {"type": "object", "properties": {}}}}
PROMPT_OK, RERENDER, RETOKENIZED = "ok", "rerender", "retokenized"


_EXAMPLE_VALUES = {"string": "...", "integer": 0, "number": 0, "boolean": True, "array": [], "object": {}}


def example_call(schema: dict) -> str:
    """The call the default prompt shows: the tool's real name and its required arguments (all of
    them when none is marked required) with a placeholder of each one's JSON type. A small model
    copies the example it is shown; a made-up `TOOL_NAME` it would copy verbatim."""
    fn = schema.get("function", schema)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    names = [n for n in params.get("required", props) if n in props]
    args = {n: _EXAMPLE_VALUES.get(props[n].get("type"), "...") for n in names}
    return json.dumps({"name": fn.get("name"), "arguments": args})


def default_tools_prompt(schemas: Sequence[dict]) -> str:
    """rlhfkit's system text for templates that ignore `tools` (Hermes-style tool calls); the
    example call is the first tool's (`example_call`)."""
    lines = "\n".join(json.dumps(s) for s in schemas)
    example = example_call(schemas[0]) if schemas else '{"name": "...", "arguments": {}}'
    return ("You can call tools. They are described by these JSON function schemas:\n<tools>\n"
            f"{lines}\n</tools>\nTo call a tool, write one block per call, for example:\n<tool_call>\n"
            f"{example}\n</tool_call>\n"
            "and end your turn. Each result comes back in a <tool_response> block. When you have "
            "the answer, reply without a tool call.")


def hermes_call(entry: dict) -> str:
    """An OpenAI `tool_calls` entry (arguments as a dict or JSON text) as the default prompt's
    `<tool_call>` block, so conversations given with `tool_calls` (few-shot examples, SFT
    traces) render the way the model is asked to write its calls."""
    fn = entry.get("function", entry)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the text it is
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"


def default_tools_messages(messages: Sequence[dict], schemas: Sequence[dict]) -> list[dict]:
    """`messages` in rlhfkit's default tool format, for chat templates that ignore `tools=`: the
    schemas join the system turn (`default_tools_prompt`), an assistant turn's `tool_calls` become
    `<tool_call>` blocks after its content and tool results `<tool_response>` blocks of a user
    turn. Plain messages any template renders: also the form of SFT traces for such models."""
    out: list[dict] = []
    for m in messages:
        if m.get("role") == "tool":
            block = f"<tool_response>\n{m.get('content', '')}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif m.get("role") == "assistant" and m.get("tool_calls"):
            text = m.get("content") or ""
            blocks = [hermes_call(c) for c in m["tool_calls"]]
            out.append({**{k: v for k, v in m.items() if k != "tool_calls"},
                        "content": "\n".join(([text] if text else []) + blocks)})
        else:
            out.append(dict(m))
    tools_text = default_tools_prompt(schemas)
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content', '')}\n\n{tools_text}"
    else:
        out.insert(0, {"role": "system", "content": tools_text})
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


def unknown_call_format(tokenizer) -> bool:
    """Whether neither the tokenizer's response_template nor the chat template's text names a known
    call format (the parser then falls back to Hermes, whose `<tool_call>` the template never shows)."""
    return (getattr(tokenizer, "response_template", None) is None and detect_parser(tokenizer) == DEFAULT_PARSER
            and "<tool_call>" not in template_text(tokenizer))


def template_uses_tools(tokenizer) -> bool:
    """Whether the chat template renders `tools=` (the same text with and without them: no)."""
    msgs = [{"role": "user", "content": "x"}]
    plain = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tokenizer.apply_chat_template(msgs, tools=[_PROBE], tokenize=False, add_generation_prompt=True) != plain


class ToolTemplate:
    """A tokenizer's chat template with a fixed set of tool schemas (see the module docstring).

    Args:
      tokenizer: a tokenizer with a chat template.
      schemas: the tools' OpenAI function schemas (`ToolSet.schemas`); empty: no tools.
      parser: the tool-call parser (a `TOOL_PARSERS` name or a response template), None: detected.
      template_kwargs: extra variables of the template (e.g. enable_thinking=False for Qwen3).
      renderer: whose chat template renders the messages: a vision-language model's processor (its
        template renders `{"type": "image"}` parts as the model's image placeholders); None: the tokenizer.
        The tokenizer still encodes the rendered text and decodes the sampled turns.
    """

    def __init__(self, tokenizer, schemas: Sequence[dict] = (), parser: str | dict | None = None,
                 renderer: Any = None, **template_kwargs: Any):
        self.renderer = renderer if renderer is not None else tokenizer
        if not template_text(self.renderer):
            raise ConfigError("tool calling needs a tokenizer with a chat template; this one has none")
        self.tokenizer, self.schemas, self.kwargs = tokenizer, list(schemas), template_kwargs
        self._opening: str | None = None  # turn_opening(), once read
        self._generation: str | None = None  # generation_prompt(), once read
        self.native = not self.schemas or template_uses_tools(self.renderer)
        # the default prompt teaches the Hermes format: parse it unless told otherwise
        self.parser = parser if (parser is not None or self.native) else "hermes"
        if not self.native:
            log.info("tools: the chat template ignores tools=; rlhfkit puts the tool schemas in the system turn "
                     "and parses Hermes-style <tool_call>{json}</tool_call> calls")
        elif self.schemas and parser is None and unknown_call_format(tokenizer):
            log.warning("tools: the chat template renders tools= but teaches a tool-call format rlhfkit does not "
                        "read (none of %s); calls are parsed as Hermes <tool_call>{json}</tool_call>, which this "
                        "model may never write: set --agent.tool_parser or the tokenizer's response_template",
                        ", ".join(TOOL_PARSERS))

    # ------------------------------------------------------------------ rendering
    def messages(self, messages: Sequence[dict]) -> list[dict]:
        """The messages as the template gets them (without native tools: `default_tools_messages`)."""
        return [dict(m) for m in messages] if self.native else default_tools_messages(messages, self.schemas)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The conversation's text through the chat template (with the tools)."""
        tools = self.schemas if (self.native and self.schemas) else None
        return self.renderer.apply_chat_template(self.messages(messages), tools=tools, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        """The token ids of the prompt: the messages rendered with the tools and the generation prompt."""
        return self.encode(self.render(messages))

    def delta_text(self, new_messages: Sequence[dict]) -> str:
        """The text the template puts after an assistant turn's content when `new_messages` follow
        it, up to and including the next generation prompt. Read off a stand-in conversation (a
        user turn, an assistant turn with a marker), so it does not depend on the episode's history."""
        stand_in = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
        text = self.render(stand_in + list(new_messages))
        if _MARK not in text:
            raise ConfigError("the chat template dropped an assistant turn followed by tool results; rlhfkit "
                              "cannot tell which tokens follow a turn (set a template that renders it)")
        return text[text.rindex(_MARK) + len(_MARK):]

    def delta(self, action_ids: Sequence[int], stopped: bool, new_messages: Sequence[dict]) -> list[int]:
        """The token ids to append after a sampled turn `action_ids` for `new_messages`: the
        template's end of the assistant turn (less the stop token the model sampled, when it
        stopped on one), the new messages and the next generation prompt."""
        text = self.delta_text(new_messages)
        if stopped and action_ids:
            end = self.tokenizer.decode([action_ids[-1]], skip_special_tokens=False)
            if end and text.startswith(end):
                text = text[len(end):]
        return self.encode(text)

    def parse(self, action_ids: Sequence[int], prefix: str | None = None) -> tuple[str, list[ToolCall], list[str]]:
        """(content, calls, errors) of a sampled turn (see parse_tool_calls). `prefix`: the text before
        the turn; None: the generation prompt (`turn_opening`), so that a turn the template opens in
        `<think>` (Qwen3.5) starts in the reasoning, whose drafted calls do not run."""
        text = self.tokenizer.decode(list(action_ids), skip_special_tokens=False)
        prefix = self.turn_opening() if prefix is None else prefix
        return parse_tool_calls(text, self.tokenizer, self.parser, prefix=prefix, tools=self.schemas or None)

    def turn_opening(self) -> str:
        """The generation prompt when the parser's start anchor finds the assistant turn's start in it
        (the parser then reads what the template pre-writes of the turn, e.g. `<think>\\n`); else ""."""
        if self._opening is None:
            from transformers.utils.chat_parsing.response_templates import load_response_template

            opening = self.generation_prompt()
            anchor = load_response_template(response_template(self.tokenizer, self.parser)).start_anchor_re
            found = anchor is not None and any(m.end() > m.start() for m in anchor.finditer(opening))
            self._opening = opening if found else ""
        return self._opening

    def generation_prompt(self) -> str:
        """The text the template writes to open an assistant turn ("" when it cannot be told apart)."""
        if self._generation is None:
            user = [{"role": "user", "content": "u"}]
            prompt, bare = self.render(user), self.render(user, add_generation_prompt=False)
            self._generation = prompt[len(bare):] if prompt.startswith(bare) else ""
        return self._generation

    def call_syntax(self) -> CallSyntax | None:
        """How this template's calls are written (`CALL_SYNTAX` of its parser); None for a response template of
        the tokenizer's own or given as a dict, and for a chat template teaching a format no parser reads."""
        if isinstance(self.parser, str):
            return CALL_SYNTAX.get(self.parser)
        if self.parser is not None or getattr(self.tokenizer, "response_template", None) is not None:
            return None
        return None if unknown_call_format(self.tokenizer) else CALL_SYNTAX[detect_parser(self.tokenizer)]

    def forced_call(self, name: str | None) -> str:
        """The text that opens a call of function `name` (None: of any function) right after the generation
        prompt; a turn the template opens in reasoning (Qwen3.5's `<think>\\n`) gets it closed first, or the
        call would be a draft. ValueError when `call_syntax` is None."""
        syntax = self.call_syntax()
        if syntax is None:
            raise ValueError("no known call syntax")
        text = syntax.forced(name)
        if syntax.reasoning is not None:
            opening, (start, close) = self.generation_prompt(), syntax.reasoning
            if opening.count(start) > opening.count(close):
                text = close + "\n\n" + text
        return text

    def prefix_check(self, messages: Sequence[dict], ids: Sequence[int],
                     encode: Callable[[str], list[int]] | None = None) -> str:
        """PROMPT_OK when `messages` rendered afresh (with the generation prompt) tokenize to
        exactly `ids`; RERENDER when the text differs (the template re-rendered the history);
        RETOKENIZED when the text is the same but the sampled tokens are not its tokenization.
        `encode`: text to ids when it is not the tokenizer's (a processor expanding image tokens)."""
        return self.rendered_check(messages, ids, encode)[0]

    def rendered_check(self, messages: Sequence[dict], ids: Sequence[int],
                       encode: Callable[[str], list[int]] | None = None) -> tuple[str, list[int]]:
        """(`prefix_check`'s answer, the token ids of `messages` rendered afresh, by `encode` when given)."""
        text = self.render(messages)
        rendered = (encode or self.encode)(text)
        if rendered == list(ids):
            return PROMPT_OK, rendered
        sampled = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return (RETOKENIZED if sampled == text else RERENDER), rendered
