"""OpenAI's Responses API on the endpoint (`POST .../v1/responses`), the OpenAI Agents SDK's default: the
request bodies below are the ones openai-agents 0.24 sent (logged at the server) for an agent with one
function tool, replayed here without the SDK. A tool call comes back as a function_call item, the
follow-up request (the call and its output as input items) continues the episode as ONE trajectory,
and a stream sends OpenAI's events with the whole response in the last one."""

import asyncio
import copy
import json
import time

import httpx
import pytest

from rlhfkit.agents.endpoint import EndpointExecutor, EndpointLimits, EndpointServer, Settings
from rlhfkit.agents.endpoint.responses import chat_request
from rlhfkit.agents.endpoint.wire import BadRequest
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.rollout.base import SamplingParams
from tests.unit.agents.conftest import ScriptedEngine, char_tokenizer

MULTIPLY = {"name": "multiply", "parameters": {
    "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
    "required": ["a", "b"], "title": "multiply_args", "type": "object", "additionalProperties": False},
    "strict": True, "type": "function", "description": "Multiply two integers."}
# openai-agents 0.24, Runner.run(Agent(instructions="Use the tool.", tools=[multiply], model="policy",
# model_settings=ModelSettings(max_tokens=100)), "What is 6 times 7?"): its two requests
FIRST = {"model": "policy", "include": [], "input": [{"content": "What is 6 times 7?", "role": "user"}],
         "instructions": "Use the tool.", "max_output_tokens": 100, "tools": [MULTIPLY]}
SECOND = {"model": "policy", "include": [], "input": [
    {"content": "What is 6 times 7?", "role": "user"},
    {"arguments": "{\"a\": 6, \"b\": 7}", "call_id": "call_dd018ddbe132", "name": "multiply", "type": "function_call",
     "id": "fc_4b31c0f095d1fa561dd8a7ef", "status": "completed"},
    {"call_id": "call_dd018ddbe132", "output": "42", "type": "function_call_output"}],
    "instructions": "Use the tool.", "max_output_tokens": 100, "tools": [MULTIPLY]}
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call><|im_end|>'


def calls_then_answers(context: str) -> str:
    return "The product is 42.<|im_end|>" if "<tool_response>\n42" in context else CALL


def test_a_responses_request_becomes_the_chat_request_of_the_same_conversation():
    chat = chat_request(SECOND)
    assert chat["messages"] == [
        {"role": "system", "content": "Use the tool."}, {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_dd018ddbe132", "type": "function",
                                                               "function": {"name": "multiply",
                                                                            "arguments": "{\"a\": 6, \"b\": 7}"}}]},
        {"role": "tool", "tool_call_id": "call_dd018ddbe132", "content": "42"}]
    assert chat["max_tokens"] == 100 and chat["tools"] == [{"type": "function", "function": {
        "name": "multiply", "parameters": MULTIPLY["parameters"], "description": "Multiply two integers."}}]
    # an assistant text item then two calls: one assistant message with the text and both calls
    turn = chat_request({"input": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Let me.", "annotations": []}]},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"}]})["messages"]
    assert [(m["content"], [c["id"] for c in m["tool_calls"]]) for m in turn] == [("Let me.", ["a", "b"])]
    for body, field in (({**FIRST, "previous_response_id": "resp_1"}, "previous_response_id"),
                        ({**FIRST, "tools": [{"type": "web_search"}]}, "tools"),
                        ({**FIRST, "input": [{"type": "item_reference", "id": "x"}]}, "input")):
        with pytest.raises(BadRequest, match=f"^{field}"):
            chat_request(body)


async def post(client, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{client.base_url}responses", json=body,
                               headers={"Authorization": f"Bearer {client.api_key}"})


def test_the_agents_sdk_requests_get_a_function_call_and_the_episode_stays_one_trajectory():
    tok = char_tokenizer()
    seen = {}

    async def agent(client, prompt, label, **row):
        first = (await post(client, FIRST)).json()
        seen["first"] = first
        [call] = first["output"]
        second = copy.deepcopy(SECOND)  # the SDK sends the reply's call back with its call_id and id
        second["input"][1].update(call_id=call["call_id"], id=call["id"])
        second["input"][2]["call_id"] = call["call_id"]
        reply = (await post(client, second)).json()
        seen["second"] = reply
        return float(reply["output"][0]["content"][0]["text"] == "The product is 42.")

    ex = EndpointExecutor(agent)
    trajs = ex.run(ScriptedEngine(tok, calls_then_answers), tok, [_Prompt("6*7?")], SamplingParams(max_new_tokens=100),
                   TokenBudget(100, 400, 3), seeds=[0])
    first = seen["first"]
    assert first["object"] == "response" and first["status"] == "completed"
    assert first["output"][0]["type"] == "function_call" and first["output"][0]["name"] == "multiply"
    assert json.loads(first["output"][0]["arguments"]) == {"a": 6, "b": 7} and first["output"][0]["call_id"]
    assert first["usage"]["input_tokens"] == len(first["prompt_token_ids"])
    assert seen["second"]["output"][0]["type"] == "message"
    assert ex.pop_metrics()["endpoint/splits"] == 0
    [traj] = trajs
    assert traj.info["agent_reward"] == 1.0
    sampled = tok.decode(traj.response_ids[traj.loss_mask].tolist(), skip_special_tokens=False)
    assert sampled == CALL + "The product is 42.<|im_end|>"


class _Prompt:
    def __init__(self, text):
        self.text, self.raw, self.label, self.record = text, text, None, {}
        self.ids = []


def test_a_streamed_response_sends_openais_events_and_the_whole_response_last():
    tok = char_tokenizer()
    settings = Settings(SamplingParams(max_new_tokens=100), honor_sampling=True)
    limits = EndpointLimits(per_call=100, context=4000)
    with EndpointServer(tok, settings, serve_key="k", serve_limits=limits) as server:
        server.engine = ScriptedEngine(tok, calls_then_answers)

        async def go():
            async with httpx.AsyncClient(timeout=30) as http:
                return await http.post(f"{server.base}/v1/responses", json={**FIRST, "stream": True},
                                       headers={"Authorization": "Bearer k"})
        reply = asyncio.run(go())
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(block.split("data: ", 1)[1]) for block in reply.text.strip().split("\n\n")]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(7))
    [item] = events[-1]["response"]["output"]
    assert item["type"] == "function_call" and json.loads(item["arguments"]) == {"a": 6, "b": 7}


CALLED = [{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
HOSTILE = [  # (fields of FIRST replaced, the field the 400 names first)
    ({"instructions": 5}, "instructions"), ({"instructions": [1]}, "instructions"), ({"input": 5}, "input"),
    ({"input": ["hi"]}, "input"), ({"input": [{"role": 5, "content": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": {"a": 1}}]}, "input"),
    ({"input": [*CALLED, {"type": "function_call_output", "call_id": "nope", "output": "42"}]}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "42"}, *CALLED]}, "input"),
    ({"input": [*CALLED, {"type": "function_call_output", "call_id": 7, "output": "42"}]}, "input"),
    ({"input": [*CALLED, {"type": "function_call_output", "output": "42"}]}, "input"),
    ({"input": [{**CALLED[1], "call_id": {"a": 1}}]}, "input"),
    ({"input": [{**CALLED[1], "name": 5}]}, "input"),  # the chat path's check, under the Responses name
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input"),
    ({"tools": "x"}, "tools"), ({"tools": [5]}, "tools"), ({"tools": [{**MULTIPLY, "parameters": "x"}]}, "tools"),
    ({"max_output_tokens": "5"}, "max_output_tokens"), ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"), ({"top_p": 5}, "top_p"), ({"n": 2}, "n"), ({"seed": "x"}, "seed"),
    ({"previous_response_id": "r"}, "previous_response_id"), ({"conversation": {"id": "c"}}, "conversation")]


def test_hostile_responses_requests_are_400s_naming_their_field_and_the_episode_goes_on():
    """Malformed items, wrong types, an output for a call the input does not hold, an unpaired surrogate, a
    huge instructions text: each a 400 whose message starts with the Responses field (never the chat path's
    `messages` / `max_tokens`, never a 500); the episode then answers a good request and, once closed, 410."""
    tok = char_tokenizer()
    settings = Settings(SamplingParams(max_new_tokens=100), honor_sampling=True)
    with EndpointServer(tok, settings) as server:
        server.engine = ScriptedEngine(tok, calls_then_answers)
        e = server.open_episode(0, 1, EndpointLimits(per_call=100, context=4000))
        with httpx.Client(base_url=server.url(e), headers={"Authorization": f"Bearer {e.key}"}, timeout=30) as h:
            for fields, name in HOSTILE:
                r = h.post("/responses", json={**FIRST, **fields})
                assert r.status_code == 400 and r.json()["error"]["message"].startswith(name), (fields, r.text)
            lone = h.post("/responses", content=b'{"input": "a\\ud800"}')
            huge = h.post("/responses", json={**FIRST, "instructions": "x" * 10_000})
            unicode = h.post("/responses", json={**FIRST, "instructions": "Nutze das Werkzeug \u2603 \U0001F600"})
            server.close_episode(e.id)
            ended = h.post("/responses", json=FIRST)
        m = server.registry.pop_metrics()
    assert lone.status_code == 400 and "surrogate" in lone.json()["error"]["message"]
    assert huge.status_code == 400 and "no room in the episode's context of 4000 tokens" in huge.text
    assert unicode.status_code == 200 and unicode.json()["output"][0]["type"] == "function_call"
    assert ended.status_code == 410
    assert "endpoint/server_error" not in m and len(e.calls) == 1


def test_a_request_cancelled_while_sampling_keeps_nothing_so_its_retry_is_no_split():
    """An agent gives up on a streamed request while it samples (a client timeout), then sends it again and
    goes on: the cancelled call's sample, which the agent never saw, is not recorded (it would train as a
    segment of its own), so the episode is ONE trajectory of the calls the agent did see."""
    tok = char_tokenizer()

    def slow(context: str) -> str:
        time.sleep(0.3)
        return calls_then_answers(context)

    async def agent(client, prompt, label, **row):
        async def streamed():
            async with httpx.AsyncClient(timeout=30) as http, http.stream(
                    "POST", f"{client.base_url}responses", json={**FIRST, "stream": True},
                    headers={"Authorization": f"Bearer {client.api_key}"}) as r:
                async for _ in r.aiter_text():
                    pass
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(streamed(), 0.05)
        await asyncio.sleep(0.5)  # the cancelled call finishes sampling meanwhile
        [call] = (await post(client, FIRST)).json()["output"]
        second = copy.deepcopy(SECOND)
        second["input"][1].update(call_id=call["call_id"], id=call["id"])
        second["input"][2]["call_id"] = call["call_id"]
        return float((await post(client, second)).status_code == 200)

    ex = EndpointExecutor(agent)
    [traj] = ex.run(ScriptedEngine(tok, slow), tok, [_Prompt("6*7?")], SamplingParams(max_new_tokens=100),
                    TokenBudget(100, 400, 3), seeds=[0])
    m = ex.pop_metrics()
    assert m["endpoint/splits"] == 0 and m["endpoint/discarded_client_gone"] == 1 and traj.info["agent_reward"] == 1.0
    sampled = tok.decode(traj.response_ids[traj.loss_mask].tolist(), skip_special_tokens=False)
    assert sampled == CALL + "The product is 42.<|im_end|>"
