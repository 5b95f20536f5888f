"""A litellm agent loop (`litellm.acompletion` with the `openai/` prefix and `api_base`), for `rlhfkit train rl
--agent.func_path`.

Each tool call of the reply runs and its result goes back as a tool message until the model answers
without one. Reward: 1 when the answer holds the label. Rows: {"prompt": "What is 3 + 4?", "label": "7"}.
"""

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm's price list from the package, offline

import litellm  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def add(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc!r}"


async def agent(client, prompt, label, **row):
    messages = [{"role": "user", "content": f"{prompt} Use the add tool, then reply with the number only."}]
    for _ in range(3):
        reply = await litellm.acompletion(model="openai/policy", api_base=str(client.base_url),
                                          api_key=client.api_key, messages=messages, tools=TOOLS, max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0 if str(label) in (message.content or "") else 0.0
        for call in message.tool_calls:
            result = add(call.function.arguments) if call.function.name == "add" else "error: no such tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
