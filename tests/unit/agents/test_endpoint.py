"""The OpenAI-compatible endpoint with the official `openai` SDK on the tiny model: chat and text
completions, streaming, logprobs, n, stop, concurrent episodes batched into one engine call; the
recorded ids are the engine's sampled ids (the same seed replayed) and the logprobs equal the
trainer's forward; the runner turns a kept history into one trajectory and a rewritten one into
segments. Hostile agents are in test_endpoint_hostile.py."""

import asyncio
import json

import pytest
import torch

openai = pytest.importorskip("openai")

from rlhfkit.agents.endpoint import (
    EndpointExecutor,
    EndpointLimits,
    EndpointServer,
    Settings,
)
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.data.batch import collate
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0)


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_model_and_tokenizer(seed=3)
    return model, tok


class CountingEngine(HFEngine):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = []

    def generate(self, prompts, params, generator=None, group_ids=None, seeds=None):
        self.calls.append(len(prompts))
        return super().generate(prompts, params, generator, group_ids, seeds)


class P:
    def __init__(self, tok, text, label=None, record=None):
        self.text, self.raw, self.label, self.record = text, text, label, record or {}
        self.ids = tok(text, add_special_tokens=False)["input_ids"]


def serve(tok, engine, **kw):
    server = EndpointServer(tok, Settings(PARAMS), **kw).start()
    server.engine = engine
    return server


def client_of(server, e):
    return openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key, max_retries=0)


def replay_seed(seed: int, k: int) -> int:
    gen = torch.Generator().manual_seed(seed)
    return [int(torch.randint(0, 2**62, (1,), generator=gen)) for _ in range(k + 1)][k]


def test_chat_records_the_engines_own_samples_and_the_trainers_logprobs(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok)
    with serve(tok, engine) as server:
        e = server.open_episode(0, seed=11, limits=EndpointLimits(per_call=6, total=40))

        async def talk():
            async with client_of(server, e) as c:
                msgs = [{"role": "user", "content": "2+2?"}]
                r = await c.chat.completions.create(model="policy", messages=msgs, logprobs=True, n=2)
                msgs.append({"role": "assistant", "content": r.choices[1].message.content})
                msgs.append({"role": "user", "content": "sure?"})
                r2 = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
                return r, r2

        r, r2 = asyncio.run(talk())
        calls = server.close_episode(e.id).calls
    assert len(calls) == 3 and len(r.choices) == 2
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert calls[0].prompt_ids == prompt_ids == r.model_extra["prompt_token_ids"]
    # the engine's samples: the same call replayed with the episode's first seed
    again = engine.generate([prompt_ids], SamplingParams(max_new_tokens=6, n=2), seeds=[replay_seed(11, 0)])
    for j in range(2):
        assert calls[j].sampled_ids == again[j].response_ids.tolist() == r.choices[j].model_extra["token_ids"]
        assert r.choices[j].message.content == tok.decode(calls[j].sampled_ids, skip_special_tokens=True)
        lps = [x.logprob for x in r.choices[j].logprobs.content]
        torch.testing.assert_close(torch.tensor(lps), again[j].logprobs, atol=1e-6, rtol=0)
    # the second call continues choice 1 token for token: its prompt = call 1's prompt + sampled ids + feedback
    assert calls[2].prompt_ids[:len(prompt_ids) + len(calls[1].sampled_ids)] == prompt_ids + calls[1].sampled_ids
    assert len(calls[2].sampled_ids) <= 3
    # logprobs equal the trainer's forward over the recorded ids
    from rlhfkit.agents.endpoint import stitch
    trajs = stitch(calls[1:], 0, 0, {}).trajectories
    assert len(trajs) == 1
    batch = collate(trajs, pad_id=tok.pad_token_id)
    logp, _ = response_logprobs(model, batch, temperature=1.0)
    torch.testing.assert_close(trajs[0].logprobs[trajs[0].loss_mask], logp[0][batch.loss_mask[0]], atol=1e-4, rtol=0)


def test_text_completions_stream_stop_and_token_id_prompts(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok)
    with serve(tok, engine) as server:
        e = server.open_episode(0, seed=5, limits=EndpointLimits(per_call=6, total=60))
        twin = server.open_episode(1, seed=5, limits=EndpointLimits(per_call=6, total=60))  # the same seed

        async def talk():
            async with client_of(server, e) as c, client_of(server, twin) as c2:
                whole = await c.completions.create(model="policy", prompt="ab", max_tokens=6, logprobs=1)
                chunks = [ch async for ch in await c.completions.create(model="policy", prompt=[5, 6, 7], max_tokens=6,
                                                                        stream=True)]
                stop_at = whole.choices[0].text[1:3]
                cut = await c2.completions.create(model="policy", prompt="ab", max_tokens=6, stop=[stop_at])
                return whole, chunks, cut, stop_at

        whole, chunks, cut, stop_at = asyncio.run(talk())
        calls = server.close_episode(e.id).calls + server.close_episode(twin.id).calls
    assert whole.choices[0].logprobs.tokens == [tok.decode([t]) for t in calls[0].sampled_ids]
    torch.testing.assert_close(torch.tensor(whole.choices[0].logprobs.token_logprobs), torch.tensor(calls[0].logprobs))
    assert calls[1].prompt_ids == [5, 6, 7]
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == tok.decode(calls[1].sampled_ids, skip_special_tokens=True)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")
    # stop: the reply stops before the string; the recorded tokens end with the one completing it
    assert len(stop_at) == 2 and cut.choices[0].text == whole.choices[0].text[:1]
    assert cut.choices[0].finish_reason == "stop"
    assert stop_at in tok.decode(calls[2].sampled_ids) and stop_at not in tok.decode(calls[2].sampled_ids[:-1])


def test_concurrent_episodes_are_batched_into_one_engine_call(tiny):
    model, tok = tiny
    engine = CountingEngine(model, tok)
    with serve(tok, engine, batch_window=5.0) as server:
        eps = [server.open_episode(i, seed=i, limits=EndpointLimits(per_call=4, total=8)) for i in range(4)]

        async def one(e):
            async with client_of(server, e) as c:
                await c.chat.completions.create(model="p", messages=[{"role": "user", "content": f"q{e.group_id}"}])

        async def all_():
            await asyncio.gather(*(one(e) for e in eps))

        asyncio.run(all_())
        # every open episode asked: generated at once, not after the 5 s window
        assert engine.calls == [4]
        alone = [server.close_episode(e.id).calls[0] for e in eps]
    for i, call in enumerate(alone):  # a sample does not depend on the batch it was generated in
        solo = engine.generate([call.prompt_ids], SamplingParams(max_new_tokens=4), seeds=[replay_seed(i, 0)])[0]
        assert call.sampled_ids == solo.response_ids.tolist()


async def keeps_history(client, prompt, label, **row):
    msgs = [{"role": "user", "content": prompt}]
    for _ in range(2):
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "more"}]
    return {"reward": float(row["weight"]), "extra_logs": {"turns": 2}}


async def rewrites_history(client, prompt, label, **row):
    r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
    summary = f"earlier you said {len(r.choices[0].message.content)} chars"
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": summary}])
    return 1.0


def test_runner_kept_history_is_one_trajectory_and_a_rewrite_splits(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok)
    prompts = [P(tok, "hi", record={"weight": 2}), P(tok, "yo", record={"weight": 3})]
    budget = TokenBudget(5, 30, 2)
    kept = EndpointExecutor(keeps_history)
    trajs = kept.run(engine, tok, prompts, SamplingParams(max_new_tokens=5, n=2), budget, seeds=[1, 2])
    assert len(trajs) == 4 and [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert [t.info["agent_reward"] for t in trajs] == [2.0, 2.0, 3.0, 3.0]
    assert all(t.info["turns"] == 2 and t.loss_mask[0] and not t.loss_mask.all() for t in trajs)
    m = kept.pop_metrics()
    assert m["endpoint/splits"] == 0 and m["endpoint/calls"] == 8 and m["agent/episodes"] == 4
    split = EndpointExecutor(rewrites_history)
    trajs = split.run(engine, tok, prompts[:1], SamplingParams(max_new_tokens=5, n=1), budget, seeds=[1])
    assert len(trajs) == 2 and split.pop_metrics()["endpoint/splits"] == 1
    assert all(t.loss_mask.all() for t in trajs)  # each segment trains only what its call sampled
    assert trajs[0].info["episode"] == trajs[1].info["episode"]


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'


def calls_then_answers(context: str) -> str:
    return "the sum is 7<|im_end|>" if "<tool_response>\n7" in context else CALL


def test_tools_come_back_as_tool_calls_and_the_episode_stays_one_trajectory(scripted):
    from tests.unit.agents.conftest import char_tokenizer

    tok = char_tokenizer()
    engine = scripted(tok, calls_then_answers)

    async def agent(client, prompt, label, **row):
        msgs = [{"role": "user", "content": prompt}]
        first = await client.chat.completions.create(model="p", messages=msgs, tools=TOOLS, max_tokens=80)
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and msg.content in (None, "")
        [call] = msg.tool_calls
        args = json.loads(call.function.arguments)
        msgs += [msg.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
        second = await client.chat.completions.create(model="p", messages=msgs, tools=TOOLS, max_tokens=80)
        plain = await client.chat.completions.create(model="p", messages=msgs[:1], tools=TOOLS, tool_choice="none",
                                                     max_tokens=80)
        return {"reward": float(second.choices[0].message.content == "the sum is 7"),
                "extra_logs": {"plain_has_no_calls": float(plain.choices[0].message.tool_calls is None)}}

    ex = EndpointExecutor(agent)
    trajs = ex.run(engine, tok, [P(tok, "3+4?")], SamplingParams(max_new_tokens=80), TokenBudget(80, 300, 3), seeds=[0])
    assert ex.pop_metrics()["endpoint/splits"] == 1  # the tool_choice="none" call started from the first prompt
    main, plain = trajs
    assert main.info["agent_reward"] == 1.0 and main.info["extra_logs"]["plain_has_no_calls"] == 1.0
    text = tok.decode(main.response_ids.tolist(), skip_special_tokens=False)
    masked = tok.decode(main.response_ids[~main.loss_mask].tolist(), skip_special_tokens=False)
    # the sampled call text is kept as sampled (the template alone would drop it); the tool result is masked
    assert text.startswith(CALL) and "<tool_response>\n7\n</tool_response>" in masked
    assert tok.decode(main.response_ids[main.loss_mask].tolist(), skip_special_tokens=False) == (
        CALL + "the sum is 7<|im_end|>")
    assert tok.decode(plain.response_ids.tolist(), skip_special_tokens=False) == CALL


def test_serve_streams_as_openai_does_and_samples_a_requests_seed(tiny):
    """A stream's chunks each hold a choice, as OpenAI's do (a loop over `chunk.choices[0]` works); the usage
    chunk (no choices) comes only with stream_options include_usage. `rlhfkit serve` samples a request's seed:
    the same seed, the same tokens (vLLM's behaviour), at temperature 1."""
    model, tok = tiny
    settings = Settings(PARAMS, honor_sampling=True)
    with EndpointServer(tok, settings, serve_key="k", serve_limits=EndpointLimits(per_call=6, total=6)) as server:
        server.engine = HFEngine(model, tok)
        ask = [{"role": "user", "content": "hi"}]

        async def talk():
            async with openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="k", max_retries=0) as c:
                plain = [ch async for ch in await c.chat.completions.create(model="p", messages=ask, stream=True)]
                usage = [ch async for ch in await c.chat.completions.create(
                    model="p", messages=ask, stream=True, stream_options={"include_usage": True})]
                seeded = [await c.chat.completions.create(model="p", messages=ask, seed=s, temperature=1.0)
                          for s in (11, 11, 12, 12)]
                return plain, usage, seeded

        plain, usage, seeded = asyncio.run(talk())
    assert all(len(ch.choices) == 1 for ch in plain) and all(ch.usage is None for ch in plain)
    assert plain[-1].choices[0].finish_reason in ("stop", "length")
    assert plain[0].model_extra["prompt_token_ids"] == tok.apply_chat_template(ask, add_generation_prompt=True,
                                                                               tokenize=True, return_dict=False)
    assert usage[-1].choices == [] and usage[-1].usage.completion_tokens == len(usage[0].choices[0].token_ids)
    ids = [r.choices[0].token_ids for r in seeded]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]


def test_a_forced_tool_call_is_sampled_after_its_opening_in_the_prompt_over_http(tiny):
    """tool_choice "required" through the HTTP handler on the tiny model (whose template ignores tools: rlhfkit's
    Hermes prompt): the engine samples after `<tool_call>\\n` appended to the prompt, the recorded prompt holds it and
    the trajectory trains the sampled tokens alone, with the trainer's logprobs; a function the tools lack is a 400."""
    from rlhfkit.agents.endpoint import stitch
    from rlhfkit.agents.tools import ToolTemplate

    model, tok = tiny
    engine = HFEngine(model, tok)
    msgs = [{"role": "user", "content": "3+4?"}]
    with serve(tok, engine) as server:
        e = server.open_episode(0, seed=7, limits=EndpointLimits(per_call=6, total=40))

        async def talk():
            async with client_of(server, e) as c:
                r = await c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, tool_choice="required",
                                                    parallel_tool_calls=False)
                with pytest.raises(openai.BadRequestError, match="not among the request's tools"):
                    await c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS,
                                                    tool_choice={"type": "function", "function": {"name": "mul"}})
                return r

        r = asyncio.run(talk())
        calls = server.close_episode(e.id).calls
    prompt = ToolTemplate(tok, TOOLS).prompt_ids(msgs) + tok("<tool_call>\n", add_special_tokens=False)["input_ids"]
    assert len(calls) == 1 and calls[0].prompt_ids == prompt == r.model_extra["prompt_token_ids"]
    again = engine.generate([prompt], SamplingParams(max_new_tokens=6), seeds=[replay_seed(7, 0)])
    assert calls[0].sampled_ids == again[0].response_ids.tolist() == r.choices[0].model_extra["token_ids"]
    [traj] = stitch(calls, 0, 0, {}).trajectories
    assert traj.prompt_ids.tolist() == prompt and bool(traj.loss_mask.all())
    batch = collate([traj], pad_id=tok.pad_token_id)
    logp, _ = response_logprobs(model, batch, temperature=1.0)
    torch.testing.assert_close(traj.logprobs, logp[0][batch.loss_mask[0]], atol=1e-4, rtol=0)
