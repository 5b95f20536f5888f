"""OpenAI's Responses API (`POST /v1/responses`) over the chat completions of the endpoint.

The OpenAI Agents SDK's default model speaks it. A request becomes a chat completion request and
is served by the chat path (so a conversation that continues an earlier call stays one trajectory):
`instructions` -> a system message; `input` (a string, or a list of items) -> messages, where message
items keep their role and text, consecutive `function_call` items become one assistant message's
`tool_calls` (joined to the assistant message item just before them), and `function_call_output`
items become tool messages; `tools` of type function -> chat tools; `max_output_tokens`,
`temperature`, `top_p`, `tool_choice` (`{type: function, name}` as the chat path's named function: its
call is forced, toolchoice.py), `parallel_tool_calls`, `stream` keep their meaning. The reply is
a `response` object: a `message` item with the text (when there is any) and a `function_call` item per
tool call (`call_id` is the chat reply's tool-call id), `status` "incomplete" when the token budget cut
it; with `stream`, the events OpenAI sends for it (created, each item added / its text or arguments /
done, completed), all at once after sampling. Beside OpenAI's fields the response carries
`prompt_token_ids` and `token_ids` (vLLM's names).

Not served (400): `previous_response_id` and `conversation` (the endpoint keeps no responses; send the
whole input), tools other than functions (web search, file search, ...), `n`, a `function_call_output`
whose `call_id` no `function_call` item before it has. Refusals of the chat path name the Responses
fields (`input`, `max_output_tokens`, `text.format`). `text.format` is the chat path's `response_format`
({type: json_schema, name, schema, strict} with the schema's fields in the format; wire.py): the reply's
text is JSON of the schema, sampled under its grammar. `reasoning` is not enforced.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from rlhfkit.agents.endpoint.episodes import Episode, Refused
from rlhfkit.agents.endpoint.wire import BadRequest

_CARRIED = ("temperature", "top_p", "tool_choice", "parallel_tool_calls", "stream", "seed", "top_k")
_TEXT_PARTS = ("input_text", "output_text", "text")
# the chat path's field names in its refusals, as a Responses request names them
_OWN_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
_CHAT_NAME = re.compile(r"^(messages|max_tokens|response_format)\b")


async def serve(completions, e: Episode, body: dict, gone=None) -> dict:
    """The `response` object for Responses request `body` of episode `e`, served by `completions.chat`
    (handlers.Completions: its checks, the episode's trajectory; `gone` as there); its refusals name the
    request's fields."""
    try:
        return response_body(await completions.chat(e, chat_request(body), gone), body)
    except BadRequest as exc:
        raise BadRequest(_own_names(str(exc))) from exc
    except Refused as exc:
        raise Refused(exc.status, exc.counter, _own_names(exc.message)) from exc


def _own_names(message: str) -> str:
    return _CHAT_NAME.sub(lambda m: _OWN_NAMES[m.group(1)], message)


def _text(content: Any, field: str = "input") -> Any:
    """A message item's content (of request field `field`) as chat content: a string as it is; text parts
    joined; image parts as chat image_url parts (for a vision-language policy)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(f"{field}: content of type {type(content).__name__}; give a string or a list of parts")
    parts = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(p.get("text", ""))})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(p.get("refusal", ""))})
        else:
            raise BadRequest(f"{field}: a content part of type {kind!r}; give input_text, output_text or input_image")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _function_tool(tool: Any) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise BadRequest(f"tools: a tool of type {kind!r}; this endpoint serves function tools only "
                         "({type: function, name, parameters})")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _messages(body: dict) -> list[dict]:
    """The chat messages of a Responses request's `instructions` and `input`."""
    out: list[dict] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": _text(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("input: give a string or a non-empty list of items")
    calls: set[str] = set()  # the call ids of the function_call items so far
    for item in items:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if not isinstance(item.get("role"), str):
                raise BadRequest("input: a message item without a role; give user, assistant, system or developer")
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"id": _call_id(item), "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments") or "{}"}}
            calls.add(call["id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the same turn's text, or its other calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output, answered = item.get("output"), _call_id(item)
            if answered not in calls:
                raise BadRequest(f"input: a function_call_output with call_id {answered!r:.60}, which no function_call "
                                 "item before it has; send the call with its output")
            out.append({"role": "tool", "tool_call_id": answered,
                        "content": output if isinstance(output, str) else _text(output)})
        elif kind == "reasoning":
            continue  # a reasoning item the client sends back: the chat template renders no reasoning
        else:
            raise BadRequest(f"input: an item of type {kind!r}; give message, function_call or "
                             "function_call_output items")
    return out


def _call_id(item: dict) -> str:
    """The call_id of a function_call or function_call_output item (a function_call may give only its id)."""
    given = item.get("call_id") or (item.get("id") if item["type"] == "function_call" else None)
    if not isinstance(given, str) or not given:
        raise BadRequest(f"input: a {item['type']} item's call_id={given!r:.40}; give the call's id (a string)")
    return given


def chat_request(body: dict) -> dict:
    """The chat completion request that serves a Responses request `body`."""
    for name in ("previous_response_id", "conversation"):
        if body.get(name):
            raise BadRequest(f"{name}: this endpoint keeps no responses; send the whole conversation in input")
    if body.get("n") not in (None, 1):
        raise BadRequest("n: the Responses API samples one reply")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools: give a list of function tools")
    chat: dict[str, Any] = {"messages": _messages(body), "model": body.get("model")}
    if tools:
        chat["tools"] = [_function_tool(t) for t in tools]
    for name in _CARRIED:
        if body.get(name) is not None:
            chat[name] = _tool_choice(body[name]) if name == "tool_choice" else body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def _text_format(text: Any) -> Any:
    """The chat `response_format` of a Responses request's `text` ({format: {type: text | json_object |
    json_schema, name, schema, strict}}: the json_schema fields sit in the format itself)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("text: give an object such as {\"format\": {\"type\": \"json_schema\", \"name\": ..., "
                         "\"schema\": {...}}}")
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if k in fmt}}
    return fmt


def response_body(chat: dict, request: dict) -> dict:
    """The `response` object of a chat completion reply `chat` (one choice) to Responses request `request`."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "role": "assistant",
                       "status": "completed", "content": [{"type": "output_text", "text": message["content"],
                                                           "annotations": [], "logprobs": []}]})
    for call in message.get("tool_calls") or ():
        output.append({"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "model": chat["model"], "output": output, "instructions": request.get("instructions"),
        "tools": request.get("tools") or [], "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": bool(request.get("parallel_tool_calls", True)),
        "max_output_tokens": request.get("max_output_tokens"), "temperature": request.get("temperature"),
        "top_p": request.get("top_p"), "metadata": request.get("metadata") or {}, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "prompt_token_ids": chat["prompt_token_ids"], "token_ids": choice["token_ids"],
    }


def _item_events(item: dict, k: int) -> list[dict]:
    """The events of output item `item` at index `k`, from added to done."""
    added = {**item, "status": "in_progress"}
    if item["type"] == "message":
        added["content"] = []
        part, text = item["content"][0], item["content"][0]["text"]
        at = {"item_id": item["id"], "output_index": k, "content_index": 0}
        middle = [{"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
                  {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []},
                  {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
                  {"type": "response.content_part.done", **at, "part": part}]
    else:
        added["arguments"] = ""
        at = {"item_id": item["id"], "output_index": k}
        middle = [{"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
                  {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"],
                   "name": item["name"]}]
    return [{"type": "response.output_item.added", "output_index": k, "item": added}, *middle,
            {"type": "response.output_item.done", "output_index": k, "item": item}]


def stream_events(response: dict) -> list[str]:
    """The response as server-sent events, as OpenAI streams one (each with its sequence number)."""
    start = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    for k, item in enumerate(response["output"]):
        events += _item_events(item, k)
    end = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": end, "response": response})
    return [f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n" for i, e in enumerate(events)]
