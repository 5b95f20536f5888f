"""`tool_choice` and `parallel_tool_calls` of a chat request, enforced on the tokens, as OpenAI and vLLM mean them.

- "auto" (or absent) and "none" as before: the model is sampled as it is; "none" reads no calls.
- a named function (`{"type": "function", "function": {"name": X}}`; the Responses API's
  `{"type": "function", "name": X}`): the call's opening with X written (the parser's `CallSyntax.named`,
  e.g. `<tool_call>\\n{"name": "X", "arguments":` for Hermes) is appended to the prompt's token ids after
  the generation prompt, and the model samples the rest. "required": the opening without a name
  (`<tool_call>\\n`), so the model writes some call. The forced tokens are the prompt's (the reply's
  `prompt_token_ids`, the recorded call's prompt: loss mask 0); the reply's `token_ids` and the trained
  tokens are the sampled ones alone; the reply's text and `tool_calls` are parsed from the forced text
  and the sampled text together. A template that opens the turn in reasoning gets it closed first (the
  forced call comes without reasoning, as the opening would otherwise be a draft). The opening fixes
  the call's start only: a model that writes a malformed call gets no `tool_calls` (its text comes back).
  A template with no known call syntax (a response template of its own, a format no parser reads): 400.
- `parallel_tool_calls` false: a sample that opens a second call is cut after the token that completes its
  first (Hermes, Qwen3-Coder and GLM: `</tool_call>`; Mistral v11: before the next `[TOOL_CALLS]`), so its
  text and tokens agree; its finish reason is "tool_calls". A sample of one call is kept whole (its end of
  turn trains). Llama 3's JSON calls (`;`-separated) and Mistral's older JSON list mark no end of a call:
  their reply keeps the first call only, while the tokens keep what was sampled (the context the next turn
  continues from holds the other calls).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.agents.endpoint.wire import BadRequest
from rlhfkit.agents.tools.parse import CALL_SYNTAX
from rlhfkit.agents.tools.render import ToolTemplate

_FORMS = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'


@dataclass(frozen=True)
class ToolChoice:
    """What a request asks of tool calls: parse them (`parse`), force one (`force`: a call of function
    `name`, or of any function when None) and whether a turn may hold several (`parallel`)."""

    parse: bool
    force: bool = False
    name: str | None = None
    parallel: bool = True


def read(body: dict) -> ToolChoice:
    """The `tool_choice` and `parallel_tool_calls` of a chat request; `BadRequest` names a field of the wrong
    form, a forced call without tools and a function the tools do not hold."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest(f"parallel_tool_calls={parallel!r:.40}; give true or false")
    parallel = parallel is not False
    if choice is None or choice == "auto":
        return ToolChoice(bool(tools), parallel=parallel)
    if choice == "none":
        return ToolChoice(False, parallel=parallel)
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if choice != "required" and not (isinstance(name, str) and name):
        raise BadRequest(f"tool_choice={choice!r:.60}; give {_FORMS}")
    if not tools:
        raise BadRequest(f"tool_choice={choice!r:.60} asks for a tool call, but the request has no tools; "
                         "send tools or tool_choice \"auto\"")
    if name is not None and name not in [t["function"]["name"] for t in tools]:
        raise BadRequest(f"tool_choice names function {name!r:.60}, which is not among the request's tools")
    return ToolChoice(True, True, name, parallel)


def forced_text(tt: ToolTemplate, choice: ToolChoice) -> str:
    """The text appended to the prompt for `choice` ("" when nothing is forced); `BadRequest` when the
    template's calls have no known syntax."""
    if not choice.force:
        return ""
    if tt.call_syntax() is None:
        why = ("the tokenizer's own response_template" if tt.parser is not None
               or getattr(tt.tokenizer, "response_template", None) is not None
               else "a format no parser reads, parsed as hermes")
        raise BadRequest(f"tool_choice: the chat template's tool calls are in {why}, so rlhfkit cannot force one; "
                         "send tool_choice \"auto\", or (in training) set --agent.tool_parser to the model's format: "
                         f"{', '.join(CALL_SYNTAX)}")
    return tt.forced_call(choice.name)


def first_call_end(tokens: Sequence[int], tokenizer: Any, tt: ToolTemplate, forced: str) -> int | None:
    """How many of the sampled `tokens` hold the turn up to the end of its first call (the forced text
    `forced` before them); None when the turn has no second call to cut off or its parser marks no end of a call."""
    syntax = tt.call_syntax()
    if syntax is None or syntax.end is None or not tokens:
        return None

    def text(k: int) -> str:
        return forced + tokenizer.decode(list(tokens[:k]), skip_special_tokens=False)

    whole = text(len(tokens))
    start = 0
    if not forced and syntax.reasoning is not None and syntax.reasoning[1] in whole:
        # calls drafted in the reasoning do not count; a forced call opens after it (what it holds is its own)
        start = whole.index(syntax.reasoning[1]) + len(syntax.reasoning[1])
    opened = whole.find(syntax.opening, start)
    if opened < 0:
        return None
    after = opened + len(syntax.opening)
    if syntax.end_is_next:  # the next opening the model wrote itself (a cut before it keeps a sampled token)
        after = max(after, len(forced) + 1)
    end = whole.find(syntax.end, after)
    if end < 0 or (not syntax.end_is_next and whole.find(syntax.opening, end + len(syntax.end)) < 0):
        return None  # one call (what follows it, the turn's end included, is kept)
    cut = end if syntax.end_is_next else end + len(syntax.end)  # the turn's text up to `cut` is kept
    low, high = 0, len(tokens)  # binary search on the decoded length, which grows with k
    while low < high:
        mid = (low + high) // 2
        if (len(text(mid + 1)) <= cut) if syntax.end_is_next else (len(text(mid)) < cut):
            low = mid + 1
        else:
            high = mid
    return low if low < len(tokens) else None
