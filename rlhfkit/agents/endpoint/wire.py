"""OpenAI's wire format for the endpoint: request fields -> sampling settings, messages -> the chat
template's form, samples -> `chat.completion` / `text_completion` bodies and their stream chunks.

Fields honoured: `messages` / `prompt` (a string, or a list of token ids), `n`, `max_tokens` /
`max_completion_tokens`, `temperature`, `top_p`, `top_k` (vLLM's extra), `seed` (rlhfkit serve), `stop`
(a string or a list), `logprobs` (chat: a bool, with `top_logprobs`; completions: an int), `stream`
(with `stream_options.include_usage`), `tools`, `tool_choice` and `parallel_tool_calls` (toolchoice.py:
"required" and a named function force a call's opening, false cuts a reply before its second call). Beside
OpenAI's fields every choice carries `token_ids` (the sampled ids) and the body, or a stream's first
chunk, `prompt_token_ids` (vLLM's names for the same thing).

Departures: each token's logprob is the sampled token's alone; `top_logprobs` lists are empty (the
engine does not keep the others). A stream sends the whole text in one chunk once sampling ends.
A forced call's opening is forced, not its arguments (no constrained decoding); Llama 3's and Mistral's
older JSON calls mark no end of a call, so `parallel_tool_calls` false keeps their first call in the reply
and every sampled token (toolchoice.py).

`response_format` (rollout/constrained.py, the `structured` extra): {"type": "json_object"} samples any JSON
object, {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} JSON valid under the schema,
{"type": "text"} as it is. The engine samples under the schema's grammar (llguidance, as vLLM's guidance
backend), so the reply's content parses with `json.loads` and validates, unless `max_tokens` cut it first
(finish reason "length"). Departures: the schema is enforced whether `strict` is true or not (OpenAI refuses
a strict schema that leaves properties optional); the whole sampled reply is constrained (a reasoning
template's thinking too; no tool calls can be written: a forced `tool_choice` with it is a 400, and beside
`tools` the reply is content, never read as a call); the recorded
logprobs are the model's own, before the grammar's mask. A schema llguidance refuses, another `type`, or no
llguidance installed (`pip install 'rlhfkit[structured]'`): 400 in one line.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.rollout import constrained
from rlhfkit.rollout.constrained import Constraint

_TEXT_PARTS = ("text", "input_text")
MAX_N = 64  # the most samples (`n`) one request may ask for


class BadRequest(ValueError):
    """A request whose fields are not of OpenAI's form (the message names the field)."""


@dataclass(frozen=True)
class Sampling:
    """What a request asks of sampling (None: the endpoint's default)."""

    n: int
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    stop: tuple[str, ...]
    logprobs: bool
    stream: bool
    seed: int | None = None
    constraint: Constraint | None = None  # response_format's (None: text)


def _number(body: dict, name: str, kind: type, low: float, high: float | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise BadRequest(f"{name}={value!r:.40}; give {'an int' if kind is int else 'a float'}")
    if value < low or (high is not None and value > high):
        raise BadRequest(f"{name}={value} is out of range [{low}, {high if high is not None else 'inf'}]")
    return kind(value)


def sampling(body: dict, chat: bool) -> Sampling:
    """The sampling fields of a request body; `BadRequest` names a field that is not of their form."""
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop: give a non-empty string or a list of them")
    stop = tuple(stop)
    n = _number(body, "n", int, 1, MAX_N) or 1
    asked = body.get("max_completion_tokens")
    asked = body.get("max_tokens") if asked is None else asked  # clients that send both, one of them null
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise BadRequest(f"max_tokens={asked!r:.40}; give a positive integer")
    if chat:
        logprobs = bool(body.get("logprobs") or False)
    else:
        logprobs = _number(body, "logprobs", int, 0, 20) is not None
    top_k = _number(body, "top_k", int, -1)
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest("stream_options: give an object such as {\"include_usage\": true}")
    return Sampling(n, asked, _number(body, "temperature", float, 0.0, 2.0), _number(body, "top_p", float, 0.0, 1.0),
                    None if top_k in (None, 0) else top_k, stop, logprobs, bool(body.get("stream") or False),
                    _number(body, "seed", int, -(2**63), 2**63 - 1), response_format(body))


def response_format(body: dict) -> Constraint | None:
    """The constraint of a request's `response_format`: None for {"type": "text"} (or none given), any JSON
    object for {"type": "json_object"}, JSON of the schema for {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}; `BadRequest` in one line for another form, a schema llguidance refuses, or no
    llguidance installed."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        c = Constraint.json_object()
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict) or not isinstance(spec.get("name", ""), str):
            raise BadRequest("response_format: json_schema needs {name, schema: a JSON schema object, strict}")
        c = Constraint.json_schema(schema)
    else:
        given = f"type {kind!r:.40}" if isinstance(fmt, dict) else f"{fmt!r:.40} is not an object"
        raise BadRequest(f"response_format: {given}; give {{\"type\": \"text\"}}, "
                         "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {...}}")
    try:
        constrained.check(c)
    except constrained.ConstraintError as exc:
        raise BadRequest(f"response_format: {exc}") from exc
    return c


def content_text(content: Any) -> str:
    """A message's content as text (None: ""; a list of parts: their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in _TEXT_PARTS:
                raise BadRequest("messages: only text content parts are served to a text-only policy (image_url "
                                 "parts need a vision-language one)")
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise BadRequest(f"messages: content of type {type(content).__name__}; give a string or a list of text parts")


def _arguments(raw: Any) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        out = json.loads(raw) if isinstance(raw, str) and raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw}
    return out if isinstance(out, dict) else {"_raw": raw}


def _tool_call(call: Any) -> dict:
    """An assistant message's tool call as the chat template takes it (arguments as a dict)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name", ""), str):
        raise BadRequest("messages: each of tool_calls is {id, type: function, function: {name, arguments}}, got "
                         f"{json.dumps(call, default=str)[:60]}")
    return {"id": call.get("id", ""), "type": "function",
            "function": {"name": function.get("name", ""), "arguments": _arguments(function.get("arguments"))}}


def template_messages(messages: Any, content: Callable[[Any], Any] = content_text) -> list[dict]:
    """Messages as a chat template takes them: their content through `content` (text; with a
    vision-language policy, text and image parts: vision.ImageParts), tool-call arguments as dicts."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: give a non-empty list of {role, content} objects")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("messages: each message is an object with a role")
        msg = {"role": m["role"], "content": content(m.get("content"))}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise BadRequest(f"messages: tool_calls of type {type(calls).__name__}; give a list")
            msg["tool_calls"] = [_tool_call(c) for c in calls]
        for k in ("tool_call_id", "name"):
            if m.get(k) is not None:
                msg[k] = m[k]
        out.append(msg)
    return out


def normal(message: dict) -> tuple:
    """A message reduced to what a chat template renders (for telling whether a conversation
    continues an earlier call's): role, content, tool calls (name and arguments), tool_call_id."""
    calls = tuple((c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                  for c in message.get("tool_calls") or ())
    content = message.get("content") or ""
    if isinstance(content, list):  # text and image parts (an image by its key)
        content = tuple((p["type"], p.get("text", p.get("sha256"))) for p in content)
    return message["role"], content, calls, message.get("tool_call_id")


def tool_call_entries(calls: Sequence[Any]) -> list[dict]:
    """Parsed `ToolCall`s as a reply's `tool_calls` (fresh ids, arguments as JSON text)."""
    return [{"id": f"call_{secrets.token_hex(6)}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]


@dataclass
class Choice:
    """One sample as the reply shows it."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    finish_reason: str  # stop, length or tool_calls
    tool_calls: list[dict] | None = None


def _logprobs_chat(c: Choice) -> dict:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(c.tokens, c.logprobs)], "refusal": None}


def _logprobs_text(c: Choice) -> dict:
    offsets, at = [], 0
    for t in c.tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": c.tokens, "token_logprobs": c.logprobs, "top_logprobs": [{} for _ in c.tokens],
            "text_offset": offsets}


def _message(c: Choice) -> dict:
    return {"role": "assistant", "content": c.text if (c.text or not c.tool_calls) else None,
            "tool_calls": c.tool_calls or None}


def completion_body(chat: bool, model: str, prompt_ids: list[int], choices: list[Choice], logprobs: bool) -> dict:
    """The whole reply of a chat or text completion."""
    out = []
    for i, c in enumerate(choices):
        entry: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason, "token_ids": c.token_ids}
        if chat:
            entry["message"] = _message(c)
            entry["logprobs"] = _logprobs_chat(c) if logprobs else None
        else:
            entry["text"] = c.text
            entry["logprobs"] = _logprobs_text(c) if logprobs else None
        out.append(entry)
    sampled = sum(len(c.token_ids) for c in choices)
    return {"id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": out, "prompt_token_ids": prompt_ids,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": sampled,
                      "total_tokens": len(prompt_ids) + sampled}}


def stream_events(body: dict, chat: bool, include_usage: bool = False) -> list[str]:
    """The reply as server-sent events: per choice its text (and tool calls) in one chunk, then its
    finish reason; with `include_usage` (the request's stream_options) a last chunk of no choices and the
    usage, as OpenAI sends it; then [DONE]. The first chunk carries `prompt_token_ids`."""
    events = []
    base = {k: body[k] for k in ("id", "created", "model")}
    kind = "chat.completion.chunk" if chat else "text_completion"
    for ch in body["choices"]:
        if chat:
            msg = ch["message"]
            delta: dict[str, Any] = {"role": "assistant", "content": msg["content"]}
            if msg["tool_calls"]:
                delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(msg["tool_calls"])]
            first = {"index": ch["index"], "delta": delta, "logprobs": ch["logprobs"], "finish_reason": None,
                     "token_ids": ch["token_ids"]}
            last = {"index": ch["index"], "delta": {}, "logprobs": None, "finish_reason": ch["finish_reason"]}
        else:
            first = {"index": ch["index"], "text": ch["text"], "logprobs": ch["logprobs"], "finish_reason": None,
                     "token_ids": ch["token_ids"]}
            last = {"index": ch["index"], "text": "", "logprobs": None, "finish_reason": ch["finish_reason"]}
        for choice in (first, last):
            events.append({**base, "object": kind, "choices": [choice]})
    events[0]["prompt_token_ids"] = body["prompt_token_ids"]
    if include_usage:
        events.append({**base, "object": kind, "choices": [], "usage": body["usage"]})
    return [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
