"""The chat completion requests that agent libraries sent (logged at the server, in
tests/fixtures/client_requests.json: langchain-openai, litellm, the OpenAI Agents SDK, smolagents), replayed
without the libraries: each first request gets the tool call back in the shape the library reads (a
`tool_calls` entry with an id, or stream chunks that carry it), and each follow-up (the call and its result
sent back as the library writes them) continues the episode as ONE trajectory."""

import json
from pathlib import Path

import httpx

from rlhfkit.agents.endpoint import EndpointExecutor
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.rollout.base import SamplingParams
from tests.unit.agents.conftest import ScriptedEngine, char_tokenizer

REQUESTS = json.loads((Path(__file__).parents[2] / "fixtures" / "client_requests.json").read_text())
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call><|im_end|>'
ANSWER = "The product is 42.<|im_end|>"


FORCED = "<tool_call>\n"  # the opening tool_choice "required" (smolagents) appends to the prompt


def calls_then_answers(context: str) -> str:
    """The answer after the tool's result, else the call: its rest when the prompt ends in its forced opening."""
    return ANSWER if "<tool_response>\n42" in context else CALL.removeprefix(FORCED if context.endswith(FORCED) else "")


class _Prompt:
    def __init__(self, text):
        self.text, self.raw, self.label, self.record, self.ids = text, text, None, {}, []


async def post(client, body: dict) -> dict:
    """The reply to `body`: the JSON body, or a stream's chunks folded into one message as clients fold them."""
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{client.base_url}chat/completions", json=body,
                                headers={"Authorization": f"Bearer {client.api_key}"})
    assert reply.status_code == 200, reply.text
    if not body.get("stream"):
        return reply.json()["choices"][0]
    message, finish = {"content": "", "tool_calls": []}, None
    for block in reply.text.strip().split("\n\n"):
        data = block.removeprefix("data: ")
        if data == "[DONE]":
            break
        for choice in json.loads(data)["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                assert call["index"] == len(message["tool_calls"]) and call["id"] and call["type"] == "function"
                message["tool_calls"].append(call)
            finish = choice["finish_reason"] or finish
    return {"message": message, "finish_reason": finish}


def with_call_id(body: dict, call_id: str) -> dict:
    """`body` with the tool-call id of the logged run replaced by this run's (as the library sends it back)."""
    text = json.dumps(body)
    old = next(c["id"] for m in body["messages"] for c in m.get("tool_calls") or ())
    return json.loads(text.replace(old, call_id))


def run(name: str) -> tuple[list, dict, list]:
    tok = char_tokenizer()
    replies = []

    async def agent(client, prompt, label, **row):
        first = await post(client, REQUESTS[name][0])
        replies.append(first)
        if len(REQUESTS[name]) > 1:
            [call] = first["message"]["tool_calls"]
            replies.append(await post(client, with_call_id(REQUESTS[name][1], call["id"])))
        return 1.0

    ex = EndpointExecutor(agent, max_context=8000)
    trajs = ex.run(ScriptedEngine(tok, calls_then_answers), tok, [_Prompt("6*7?")], SamplingParams(max_new_tokens=200),
                   TokenBudget(200, 800, 3), seeds=[0])
    trained = [tok.decode(t.response_ids[t.loss_mask].tolist(), skip_special_tokens=False) for t in trajs]
    return replies, ex.pop_metrics(), trained


def test_each_librarys_tool_call_comes_back_and_its_follow_up_continues_the_episode():
    for name, bodies in REQUESTS.items():
        replies, metrics, trained = run(name)
        first = replies[0]
        assert first["finish_reason"] == "tool_calls", name
        [call] = first["message"]["tool_calls"]
        assert call["function"]["name"] == "multiply" and json.loads(call["function"]["arguments"]) == {"a": 6, "b": 7}
        assert not first["message"]["content"], name  # no text beside the call (None, or "" in a stream)
        if len(bodies) > 1:
            assert replies[1]["message"]["content"] == "The product is 42." and not replies[1]["message"]["tool_calls"]
            assert metrics["endpoint/splits"] == 0 and trained == [CALL + ANSWER], name
        else:  # smolagents asks for a call (tool_choice "required"): its opening is the prompt's, not trained
            forced = FORCED if bodies[0].get("tool_choice") == "required" else ""
            assert trained == [CALL.removeprefix(forced)], name

