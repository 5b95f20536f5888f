"""Hostile agents against the endpoint, with the official `openai` SDK: a wrong key, another episode's
key, calls after the episode ended, a flood of calls, 1M tokens asked, a spent budget, a huge body are
refused and counted; agents that raise, hang past the timeout, never call or return no reward are
dropped (counted, one log line) while the other episodes train; the server listens on loopback only
and leaves no thread or port behind."""

import asyncio
import socket
import threading

import pytest

openai = pytest.importorskip("openai")

from rlhfkit.agents.endpoint import EndpointExecutor, EndpointLimits, EndpointServer, Settings  # noqa: E402
from rlhfkit.agents.executor import TokenBudget  # noqa: E402
from rlhfkit.models import tiny_model_and_tokenizer  # noqa: E402
from rlhfkit.rollout.base import SamplingParams  # noqa: E402
from rlhfkit.rollout.hf import HFEngine  # noqa: E402

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_model_and_tokenizer(seed=4)
    return HFEngine(model, tok), tok


class P:
    def __init__(self, tok, text):
        self.text, self.raw, self.label, self.record = text, text, None, {}
        self.ids = tok(text, add_special_tokens=False)["input_ids"]


def status_of(coro) -> int | None:
    async def go():
        try:
            await coro
        except openai.APIStatusError as exc:
            return exc.status_code
        return None
    return asyncio.run(go())


def client(server, e, key=None, url=None):
    return openai.AsyncOpenAI(base_url=url or server.url(e), api_key=key or e.key, max_retries=0)


def test_keys_episodes_and_ended_calls_are_refused_and_counted(tiny):
    engine, tok = tiny
    with EndpointServer(tok, Settings(SamplingParams(max_new_tokens=4))) as server:
        server.engine = engine
        assert server._socket.getsockname()[0] == "127.0.0.1"
        a = server.open_episode(0, 1, EndpointLimits(per_call=4, total=8))
        b = server.open_episode(1, 2, EndpointLimits(per_call=4, total=8))
        chat = lambda c: c.chat.completions.create(model="p", messages=ASK)  # noqa: E731
        assert status_of(chat(client(server, a, key="wrong"))) == 401
        assert status_of(chat(client(server, a, key=b.key))) == 403  # b's key on a's URL
        assert status_of(chat(client(server, a, url=server.base + "/v1"))) == 404  # no episode in the URL
        assert status_of(chat(client(server, a))) is None
        server.close_episode(a.id)
        assert status_of(chat(client(server, a))) == 410
        m = server.registry.pop_metrics()
    assert m["endpoint/refused_auth"] == 1 and m["endpoint/refused_other_episode"] == 1
    assert m["endpoint/refused_ended"] == 1 and m["endpoint/refused_unknown"] == 1 and m["endpoint/calls"] == 1
    assert len(a.calls) == 1 and not b.calls


def test_floods_huge_asks_spent_budgets_and_huge_bodies_are_refused(tiny):
    engine, tok = tiny
    with EndpointServer(tok, Settings(SamplingParams(max_new_tokens=4))) as server:
        server.engine = engine
        e = server.open_episode(0, 1, EndpointLimits(per_call=3, total=5, max_calls=3))
        small = server.open_episode(1, 1, EndpointLimits(max_request_bytes=4000))

        async def go():
            async with client(server, e) as c:
                big = await c.chat.completions.create(model="p", messages=ASK, max_tokens=1_000_000)
                codes = []
                for _ in range(3):
                    try:
                        await c.chat.completions.create(model="p", messages=ASK, max_tokens=1_000_000)
                        codes.append(200)
                    except openai.APIStatusError as exc:
                        codes.append(exc.status_code)
            try:
                async with client(server, small) as c:
                    await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "x" * 5000}])
            except openai.APIStatusError as exc:
                codes.append(exc.status_code)
            return big, codes

        big, codes = asyncio.run(go())
        m = server.registry.pop_metrics()
    assert big.usage.completion_tokens <= 3  # 1M asked, the per-call budget given
    sampled = sum(len(c.sampled_ids) for c in e.calls)
    assert sampled <= 5
    # call 2 samples what the budget has left (or is refused when nothing is), call 4 is over max_calls
    assert codes[2] == 429 and m["endpoint/refused_flood"] == 1
    assert codes[3] == 413 and m["endpoint/refused_too_large"] == 1 and not small.calls
    assert m["endpoint/max_tokens_lowered"] >= 1


def test_hostile_agents_are_dropped_and_the_rest_of_the_batch_trains(tiny, caplog):
    engine, tok = tiny

    async def mixed(client, prompt, label, **row):
        kind = prompt
        if kind == "raises":
            raise ValueError("boom")
        if kind == "hangs":
            await asyncio.sleep(30)
        if kind == "never":
            return 1.0
        r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": kind}])
        if kind == "garbage":
            return "not a number"
        return float(len(r.choices[0].message.content))

    before = {t.name for t in threading.enumerate()}
    ex = EndpointExecutor(mixed, timeout=2.0)
    prompts = [P(tok, k) for k in ("ok", "raises", "hangs", "never", "garbage", "ok2")]
    with caplog.at_level("WARNING", logger="rlhfkit"):
        trajs = ex.run(engine, tok, prompts, SamplingParams(max_new_tokens=4), TokenBudget(4, 8, 2),
                       seeds=list(range(6)))
    m = ex.pop_metrics()
    assert sorted(t.group_id for t in trajs) == [0, 5]
    assert m["agent/dropped_error"] == 1 and m["agent/dropped_timeout"] == 1
    assert m["agent/dropped_no_calls"] == 1 and m["agent/dropped_bad_reward"] == 1
    drops = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(drops) == 4 and all("\n" not in d for d in drops)
    # the endpoint is gone: its threads ended and its port is closed
    assert {t.name for t in threading.enumerate()} - before == set()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ex.last_server.port), timeout=1).close()


def test_serve_mode_needs_its_key_honours_the_requests_temperature_and_records_nothing(tiny):
    engine, tok = tiny
    settings = Settings(SamplingParams(max_new_tokens=4), honor_sampling=True)
    with EndpointServer(tok, settings, serve_key="k1", serve_limits=EndpointLimits(per_call=4, total=4)) as server:
        server.engine = engine

        def ask(key, **kw):
            async def go():
                async with openai.AsyncOpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0) as c:
                    return await c.chat.completions.create(model="p", messages=ASK, **kw)
            return asyncio.run(go())

        with pytest.raises(openai.AuthenticationError):
            ask("wrong")
        greedy = [ask("k1", temperature=0.0).choices[0].message.content for _ in range(2)]
        assert greedy[0] == greedy[1]  # temperature 0 is the request's, and greedy
        assert not server.registry.episodes


class SlowEngine:
    """The engine, each generate call held back `delay` seconds (a busy or slow engine)."""

    def __init__(self, engine, delay: float):
        self.engine, self.delay = engine, delay

    def generate(self, *args, **kwargs):
        import time

        time.sleep(self.delay)
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_the_timeout_does_not_count_waits_on_a_slow_engine_but_drops_an_agent_that_dawdles(tiny):
    engine, tok = tiny

    async def agent(client, prompt, label, **row):
        for _ in range(2):  # each call waits 0.8 s on the engine: 1.6 s in all, past the 1 s timeout
            await client.chat.completions.create(model="p", messages=ASK, max_tokens=2)
        if prompt == "dawdles":
            await asyncio.sleep(1.5)  # its own time: this counts
        return 1.0

    ex = EndpointExecutor(agent, timeout=1.0)
    prompts = [P(tok, "waits"), P(tok, "dawdles")]
    trajs = ex.run(SlowEngine(engine, 0.8), tok, prompts, SamplingParams(max_new_tokens=2), TokenBudget(2, 8, 2),
                   seeds=[0, 1])
    m = ex.pop_metrics()
    assert {t.group_id for t in trajs} == {0} and m["agent/dropped_timeout"] == 1  # (two segments: one history)


def test_an_agents_own_timeout_error_or_cancellation_drops_its_episode_as_an_error(tiny, caplog):
    """A TimeoutError of the agent's own code (its own wait_for) is its error, not --agent.timeout; an agent
    that ends cancelled (it awaited a task it cancelled) is dropped too, and does not cancel the batch."""
    engine, tok = tiny

    async def agent(client, prompt, label, **row):
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": prompt}])
        if prompt == "own_timeout":
            await asyncio.wait_for(asyncio.sleep(30), 0.01)
        if prompt == "cancelled":
            task = asyncio.ensure_future(asyncio.sleep(30))
            await asyncio.sleep(0)
            task.cancel()
            await task
        return 1.0

    ex = EndpointExecutor(agent, source="agent.py", timeout=20.0)
    with caplog.at_level("WARNING", logger="rlhfkit"):
        trajs = ex.run(engine, tok, [P(tok, k) for k in ("ok", "own_timeout", "cancelled")],
                       SamplingParams(max_new_tokens=4), TokenBudget(4, 8, 2), seeds=[0, 1, 2])
    m = ex.pop_metrics()
    assert [t.group_id for t in trajs] == [0]
    assert m["agent/dropped_error"] == 2 and "agent/dropped_timeout" not in m
    drops = sorted(r.getMessage() for r in caplog.records if "dropped" in r.getMessage())
    assert drops[0] == ("agent agent.py: episode 1 (prompt 1 of the batch, 'own_timeout') dropped: error: raised "
                        "TimeoutError")
    assert drops[1].startswith("agent agent.py: episode 2 (prompt 2 of the batch, 'cancelled') dropped: error: raised "
                               "asyncio.CancelledError")


def test_malformed_fields_are_400s_and_unknown_routes_are_openai_shaped(tiny):
    """A request whose fields are of the wrong type is the client's error (400 naming the field), never a 500;
    an unknown route or method answers OpenAI's error shape, as every other refusal does."""
    import httpx

    engine, tok = tiny
    limits = EndpointLimits(per_call=4, total=4)
    with EndpointServer(tok, Settings(SamplingParams(max_new_tokens=4)), serve_key="k", serve_limits=limits) as server:
        server.engine = engine
        with httpx.Client(base_url=server.base + "/v1", headers={"Authorization": "Bearer k"}) as h:
            bad = [({"stop": 5}, "stop"), ({"stop": {}}, "stop"), ({"seed": "x"}, "seed"),
                   ({"stream_options": True, "stream": True}, "stream_options"),
                   ({"messages": [{"role": "assistant", "tool_calls": "x"}, *ASK]}, "tool_calls"),
                   ({"messages": [{"role": "assistant", "tool_calls": ["x"]}, *ASK]}, "tool_calls"),
                   ({"messages": [{"role": "assistant", "tool_calls": [{"function": "add"}]}, *ASK]}, "tool_calls"),
                   ({"tools": [{"type": "function", "function": "add"}]}, "tools"),
                   ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools"),
                   ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
                   ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools")]
            for fields, name in bad:
                r = h.post("/chat/completions", json={"model": "p", "messages": ASK, **fields})
                assert r.status_code == 400 and name in r.json()["error"]["message"], (fields, r.text)
            lone = h.post("/chat/completions", content=b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')
            assert lone.status_code == 400 and "surrogate" in lone.json()["error"]["message"], lone.text
            pair = h.post("/chat/completions", content=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
            assert pair.status_code == 200, pair.text  # an escaped pair is one character (an emoji)
            deep = h.post("/chat/completions", content=b"[" * 100_000 + b"]" * 100_000)
            assert deep.status_code == 400 and deep.json()["error"]["message"] == "the body's JSON is nested too deeply"
            routes = [h.get("/models/p"), h.get("/chat/completions"), h.post("/embeddings", json={})]
        m = server.registry.pop_metrics()
    assert [r.status_code for r in routes] == [404, 405, 404]
    assert [r.json()["error"]["message"] for r in routes] == [
        "no such route: GET /v1/models/p", "method not allowed: GET /v1/chat/completions",
        "no such route: POST /v1/embeddings"]
    assert m["endpoint/bad_request"] == len(bad) + 2 and "endpoint/server_error" not in m


def test_messages_the_chat_template_refuses_are_a_400_naming_its_reason(scripted):
    """A template's raise_exception (an unknown role, roles that must alternate) is the request's error, as
    vLLM answers it: 400 with the template's words, not a 500; the other requests are served."""
    from tests.unit.agents.conftest import char_tokenizer

    strict = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system', 'tool'] %}"
              "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
              "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    tok = char_tokenizer(strict)
    limits = EndpointLimits(per_call=8, total=8, context=400)
    with EndpointServer(tok, Settings(SamplingParams(max_new_tokens=8)), serve_key="k", serve_limits=limits) as server:
        server.engine = scripted(tok, lambda context: "ok<|im_end|>")

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="k", max_retries=0) as c:
                try:
                    await c.chat.completions.create(model="p", messages=[{"role": "wizard", "content": "hi"}])
                except openai.BadRequestError as exc:
                    refused = exc.body["message"]
                reply = await c.chat.completions.create(model="p", messages=ASK)
                return refused, reply.choices[0].message.content

        refused, served = asyncio.run(go())
        m = server.registry.pop_metrics()
    assert refused == "messages: the chat template refused them: Unknown role: wizard" and served == "ok"
    assert m["endpoint/bad_request"] == 1 and "endpoint/server_error" not in m


def test_n_samples_share_the_episodes_response_budget(tiny):
    """--agent.max_response_tokens bounds all an episode samples: a call with n samples gives each an n-th of
    what is left (n=64 asked of an 8-token budget: refused), so no n lets an episode sample past it."""
    engine, tok = tiny
    with EndpointServer(tok, Settings(SamplingParams(max_new_tokens=4))) as server:
        server.engine = engine
        e = server.open_episode(0, 1, EndpointLimits(per_call=4, total=8))
        fresh = server.open_episode(1, 2, EndpointLimits(per_call=4, total=8))

        async def go():
            async with client(server, e) as c, client(server, fresh) as c2:
                four = await c.chat.completions.create(model="p", messages=ASK, n=4, max_tokens=4)
                try:
                    await c2.chat.completions.create(model="p", messages=ASK, n=64)
                except openai.BadRequestError as exc:
                    return four, exc.body["message"]

        four, refused = asyncio.run(go())
        m = server.registry.pop_metrics()
    assert len(four.choices) == 4 and all(len(ch.token_ids) <= 2 for ch in four.choices)
    assert e.sampled == sum(len(ch.token_ids) for ch in four.choices) <= 8
    assert "fewer than n=64 samples need" in refused and m["endpoint/refused_budget"] == 1 and not fresh.calls


def test_a_batch_whose_every_episode_is_dropped_stops_the_run_naming_the_first_reason(tiny):
    """Nothing of such a batch would train (a run would go on training nothing and save an untrained model):
    RewardError names the agent, the first dropped episode's prompt and why. An evaluation reports it instead."""
    from rlhfkit.agents.endpoint.runner import evaluate_agent
    from rlhfkit.errors import RewardError

    engine, tok = tiny

    async def buggy(client, prompt, label, **row):
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": prompt}])
        return undefined_name  # noqa: F821 - the agent's bug

    ex = EndpointExecutor(buggy, source="agent.py")
    params, budget = SamplingParams(max_new_tokens=4, n=2), TokenBudget(4, 8, 2)
    with pytest.raises(RewardError) as caught:
        ex.run(engine, tok, [P(tok, "a"), P(tok, "b")], params, budget, seeds=[0, 1])
    assert str(caught.value) == (
        "agent agent.py: all 4 episodes of the rollout batch were dropped, so nothing would train; the first: "
        "episode 0 (prompt 0 of the batch, 'a'): error: raised NameError: name 'undefined_name' is not defined. "
        "Fix the agent (--debug shows where it raised)")
    assert isinstance(caught.value.__cause__, NameError)  # its traceback is the agent's
    metrics, rows = evaluate_agent(ex, engine, tok, [P(tok, "a")], params, budget)
    assert metrics["eval/dropped"] == 1.0 and metrics["eval/reward"] == 0.0 and rows == []
