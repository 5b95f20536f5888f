"""Structured outputs on the endpoint with the official `openai` SDK: `response_format` json_schema (and the SDK's
`chat.completions.parse` with a pydantic model, which sends a strict json_schema), json_object, and the Responses
API's `text.format` give replies whose content parses and validates, sampled by the HF engine on a tiny random
model at temperature 1, with the trainer's logprobs recorded; the forms it does not take are 400s in one line."""

import asyncio
import json
import sys

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("llguidance")

from rlhfkit.agents.endpoint import EndpointLimits, EndpointServer, Settings  # noqa: E402
from rlhfkit.agents.endpoint.wire import BadRequest, response_format  # noqa: E402
from rlhfkit.data.batch import collate  # noqa: E402
from rlhfkit.models import response_logprobs  # noqa: E402
from rlhfkit.rollout.base import SamplingParams  # noqa: E402
from rlhfkit.rollout.hf import HFEngine  # noqa: E402
from tests.unit.agents.conftest import ScriptedEngine, tiny_chat_model  # noqa: E402
from tests.unit.rollout.test_constrained_sampling import SCHEMA, matches  # noqa: E402

FORMAT = {"type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA, "strict": True}}
MSGS = [{"role": "user", "content": "Give n as JSON."}]
LIMITS = EndpointLimits(per_call=200, total=4000)


@pytest.fixture(scope="module")
def tiny_json():
    model, tok = tiny_chat_model()
    return model.eval(), tok


def serving(tok, engine):
    server = EndpointServer(tok, Settings(SamplingParams(max_new_tokens=200, temperature=1.0))).start()
    server.engine = engine
    return server


def client_of(server, e):
    return openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key, max_retries=0)


def test_response_format_replies_parse_and_validate_and_record_the_trainers_logprobs(tiny_json):
    from pydantic import BaseModel, ConfigDict

    class Count(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int

    model, tok = tiny_json
    with serving(tok, HFEngine(model, tok)) as server:
        e = server.open_episode(0, seed=4, limits=LIMITS)

        async def talk():
            async with client_of(server, e) as c:
                r = await c.chat.completions.create(model="policy", messages=MSGS, response_format=FORMAT, n=3)
                parsed = await c.chat.completions.parse(model="policy", messages=MSGS, response_format=Count)
                obj = await c.chat.completions.create(model="policy", messages=MSGS,
                                                      response_format={"type": "json_object"}, max_tokens=200)
                text = await c.chat.completions.create(model="policy", messages=MSGS, n=3,
                                                       response_format={"type": "text"})
                return r, parsed, obj, text

        r, parsed, obj, text = asyncio.run(talk())
        calls = server.close_episode(e.id).calls
    assert all(matches(ch.message.content) and ch.finish_reason == "stop" for ch in r.choices), r.choices
    assert isinstance(parsed.choices[0].message.parsed, Count)
    assert obj.choices[0].finish_reason == "length" or isinstance(json.loads(obj.choices[0].message.content), dict)
    assert not any(matches(ch.message.content) for ch in text.choices)  # the model as it is: no JSON
    batch = collate([_trajectory(c) for c in calls[:3]], pad_id=tok.pad_token_id)  # the json_schema call's samples
    logp, _ = response_logprobs(model, batch, temperature=1.0)
    for i, c in enumerate(calls[:3]):
        torch.testing.assert_close(torch.tensor(c.logprobs), logp[i][batch.loss_mask[i]], atol=1e-4, rtol=0)


def _trajectory(call):
    from rlhfkit.data.types import Trajectory

    n = len(call.sampled_ids)
    return Trajectory(prompt_ids=torch.tensor(call.prompt_ids), response_ids=torch.tensor(call.sampled_ids),
                      loss_mask=torch.ones(n, dtype=torch.bool), logprobs=torch.tensor(call.logprobs),
                      finish_reason=call.finish_reason, version=call.version)


def test_the_responses_apis_text_format_is_the_chat_paths_response_format(tiny_json):
    model, tok = tiny_json
    fmt = {"type": "json_schema", "name": "count", "schema": SCHEMA, "strict": True}
    with serving(tok, HFEngine(model, tok)) as server:
        e = server.open_episode(0, seed=9, limits=LIMITS)

        async def talk():
            async with client_of(server, e) as c:
                good = await c.responses.create(model="policy", input="Give n as JSON.", text={"format": fmt})
                with pytest.raises(openai.BadRequestError, match="text.format: the JSON schema cannot be sampled"):
                    await c.responses.create(model="policy", input="n?", text={"format": dict(fmt, schema={
                        "type": "object", "properties": {"n": {"$ref": "#/nowhere"}}})})
                return good

        good = asyncio.run(talk())
    assert matches(good.output_text), good.output_text


def test_forms_the_endpoint_does_not_take_are_400s_in_one_line(tok, monkeypatch):
    engine = ScriptedEngine(tok, lambda context: "ok<eos>")
    with serving(tok, engine) as server:
        e = server.open_episode(0, seed=1, limits=LIMITS)

        async def talk():
            async with client_of(server, e) as c:
                for fmt, said in ((FORMAT, "engine \\(ScriptedEngine\\) samples no structured outputs"),
                                  ({"type": "xml"}, "response_format: type 'xml'"),
                                  ("json_object", "response_format: 'json_object' is not an object"),
                                  ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs \\{name, schema"),
                                  ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
                                   "cannot be sampled under: Invalid type: objekt")):
                    with pytest.raises(openai.BadRequestError, match=said) as info:
                        await c.chat.completions.create(model="policy", messages=MSGS, response_format=fmt)
                    assert "\n" not in info.value.body["message"]
                return await c.chat.completions.create(model="policy", messages=MSGS, response_format={"type": "text"})

        assert asyncio.run(talk()).choices[0].message.content == "ok"
    monkeypatch.setitem(sys.modules, "llguidance", None)  # not installed
    with pytest.raises(BadRequest, match=r"pip install 'rlhfkit\[structured\]'"):
        response_format({"response_format": {"type": "json_object"}})
    assert response_format({"response_format": {"type": "text"}}) is None  # no llguidance needed


def test_a_json_reply_beside_tools_is_content_never_a_tool_call():
    """With tools and response_format, the reply is sampled under the format's grammar, which holds no call syntax:
    a Llama 3 reply of the schema {name, parameters} naming a tool stays the JSON content (read as Llama 3's JSON
    call, the client would get no content to parse)."""
    from tests.unit.agents.test_endpoint_toolchoice import FAMILIES, Endpoint

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
              "required": ["name", "parameters"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "fn", "schema": schema}}
    text = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    ep = Endpoint(FAMILIES["llama3_1"][0](), lambda context: text + "<|eot_id|>")
    for parallel in (True, False):
        [reply] = ep.chat(response_format=fmt, parallel_tool_calls=parallel)["choices"]
        assert reply["message"]["content"] == text and not reply["message"].get("tool_calls")
        assert reply["finish_reason"] == "stop"
    [call] = ep.chat()["choices"]  # without response_format the same text is Llama 3's call
    assert call["finish_reason"] == "tool_calls"
