"""Reward server and client over real HTTP on free ports: protocol, sharding, retries, errors."""

import socket
import sys
import threading
import time

import httpx
import pytest
import torch
import uvicorn

from rlhfkit.errors import RewardError
from rlhfkit.rewards.loader import load_reward_file
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.server import make_app

REWARD_FILE = '''
import asyncio

async def reward_func(queries, prompts, labels, **kwargs):
    await asyncio.sleep(0)
    r = [float(len(q) - len(p)) for q, p in zip(queries, prompts)]
    return {"rewards": r, "scores": [min(x, 1.0) for x in r], "extra_logs": {"n": [float(len(queries))] * len(r)}}
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn in a thread on a free port; stopped at exit."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/get_reward"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return
            time.sleep(0.02)
        raise RuntimeError("server did not start")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(5)


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm") / "reward.py"
    path.write_text(REWARD_FILE)
    return load_reward_file(path)


@pytest.fixture(scope="module")
def servers(reward_fn):
    a, b = Server(make_app(reward_fn)), Server(make_app(reward_fn, token="s3cret", max_request_bytes=2000))
    yield a, b
    a.stop()
    b.stop()


def test_round_trip_matches_the_local_function(servers, reward_fn):
    a, _ = servers
    queries, prompts, labels = ["p1abc", "p2a", "p3"], ["p1", "p2", "p3"], ["x", None, 3]
    out = RemoteRewardFn([a.url])(queries, prompts, labels)
    local = reward_fn(queries, prompts, labels)
    assert out.rewards.tolist() == [3.0, 1.0, 0.0] == local.rewards.tolist()
    assert out.scores.tolist() == [1.0, 1.0, 0.0] and out.extra_logs["n"].tolist() == [3.0, 3.0, 3.0]


def test_requests_are_batched_and_sharded_over_urls(servers):
    a, b = servers
    fn = RemoteRewardFn([a.url, b.url], batch_size=2, token="s3cret")
    queries = [f"p{'x' * i}" for i in range(5)]
    out = fn(queries, ["p"] * 5, [None] * 5)
    assert out.rewards.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert out.extra_logs["n"].tolist() == [2.0, 2.0, 2.0, 2.0, 1.0]  # requests of 2, 2, 1 queries


def test_bearer_token_and_size_limit(servers):
    _, b = servers
    payload = {"query": ["a"], "prompts": [""], "labels": [None]}
    assert httpx.post(b.url, json=payload).status_code == 401
    assert httpx.post(b.url, json=payload, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(b.url, json=payload, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["rewards"] == [1.0]
    big = {"query": ["a" * 5000], "prompts": [""], "labels": [None]}
    assert httpx.post(b.url, json=big, headers={"Authorization": "Bearer s3cret"}).status_code == 413
    with pytest.raises(RewardError, match=f"reward server {b.url} answered HTTP 401"):
        RemoteRewardFn([b.url])(["a"], [""], [None])


def test_malformed_requests_get_422(servers):
    a, _ = servers
    assert httpx.post(a.url, content=b"not json").status_code == 422
    assert httpx.post(a.url, json={"query": ["a", "b"], "prompts": ["x"]}).status_code == 422
    assert httpx.get(a.url.replace("get_reward", "health")).json() == {"status": "ok"}


def test_dead_server_is_a_clear_error_after_retries():
    url = f"http://127.0.0.1:{free_port()}/get_reward"
    fn = RemoteRewardFn([url], max_retries=2, backoff=0.01, timeout=2)
    with pytest.raises(RewardError, match=rf"reward server {url} failed after 3 attempts \(ConnectError"):
        fn(["a"], [""], [None])


def test_garbage_answers_are_clear_errors():
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app, calls = FastAPI(), {"flaky": 0}

    @app.post("/text")
    async def text():
        return PlainTextResponse("hello")

    @app.post("/short")
    async def short():
        return {"rewards": [1.0]}

    @app.post("/nan")
    async def nan():
        return PlainTextResponse('{"rewards": [NaN, 1.0]}', media_type="application/json")

    @app.post("/flaky")
    async def flaky():
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            return PlainTextResponse("busy", status_code=503)
        return [0.5, 0.25]

    s = Server(app)
    base = f"http://127.0.0.1:{s.port}"
    try:
        args = (["a", "b"], ["", ""], [None, None])
        with pytest.raises(RewardError, match=f"reward server {base}/text answered non-JSON"):
            RemoteRewardFn([f"{base}/text"])(*args)
        with pytest.raises(RewardError, match=f"server {base}/short returned 1 rewards for a batch of 2"):
            RemoteRewardFn([f"{base}/short"])(*args)
        with pytest.raises(RewardError, match="non-finite value in rewards at index 0"):
            RemoteRewardFn([f"{base}/nan"])(*args)
        out = RemoteRewardFn([f"{base}/flaky"], max_retries=3, backoff=0.01)(*args)
        assert out.rewards.tolist() == [0.5, 0.25] and calls["flaky"] == 3  # two 503s retried
    finally:
        s.stop()


def test_a_stalled_server_is_a_clear_error_after_retries():
    import asyncio

    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/slow")
    async def slow():
        await asyncio.sleep(1.5)
        return [1.0]

    s = Server(app)
    url = f"http://127.0.0.1:{s.port}/slow"
    try:
        with pytest.raises(RewardError, match=rf"reward server {url} failed after 2 attempts \(ReadTimeout"):
            RemoteRewardFn([url], max_retries=1, backoff=0.01, timeout=0.3)(["a"], [""], [None])
    finally:
        s.stop()


def test_serve_reward_cli_in_a_subprocess(tmp_path):
    import subprocess

    path = tmp_path / "reward.py"
    path.write_text(REWARD_FILE)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlhfkit.cli.main", "serve-reward", "--reward.remote_url",
                             str(path), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/get_reward"
        for _ in range(300):
            try:
                out = RemoteRewardFn([url], max_retries=0)(["pab"], ["p"], [None])
                break
            except RewardError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.1)
        assert out.rewards.tolist() == [2.0]
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_reward_serves_one_reward(capsys):
    from rlhfkit.cli.main import main

    assert main(["serve-reward", "--reward.model_name_or_path", "x", "--reward.remote_url", "r.py"]) == 2
    assert "not both" in capsys.readouterr().err


def test_batched_and_grouped_reward_functions(tmp_path):
    path = tmp_path / "r.py"
    path.write_text('''
from rlhfkit.rewards.loader import batched, grouped

@grouped
async def reward_func(queries, prompts, labels, group_ids=None):
    best = max(len(q) for q in queries)  # relative to the group: needs the whole group
    return [float(len(q) == best) for q in queries]
''')
    fn = load_reward_file(path)
    out = fn(["a", "abc", "ab", "x", "xy", "xy"], [""] * 6, [None] * 6, group_ids=torch.tensor([0, 0, 0, 1, 1, 1]))
    assert out.rewards.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    with pytest.raises(RewardError, match="asks for whole groups"):
        fn(["a"], [""], [None])
    path.write_text('''
from rlhfkit.rewards.loader import batched

@batched(2)
def reward_func(queries, prompts, labels, response_lengths=None):
    return [float(len(queries)) + float(x) for x in response_lengths]
''')
    out = load_reward_file(path)(["a"] * 5, [""] * 5, [None] * 5, response_lengths=torch.tensor([0., 10, 20, 30, 40]))
    assert out.rewards.tolist() == [2.0, 12.0, 22.0, 32.0, 41.0]


def test_image_fields_encode_each_shared_prompt_image_once(monkeypatch):
    """The samples of a prompt share its image objects: each is PNG-encoded once a call, its URL repeated."""
    from PIL import Image

    from rlhfkit.data.images import image_data_url
    from rlhfkit.rewards import remote

    encoded = []
    monkeypatch.setattr(remote, "image_data_url", lambda im: encoded.append(im) or image_data_url(im))
    red, blue = Image.new("RGB", (2, 2), "red"), Image.new("RGB", (2, 2), "blue")
    out = remote.image_fields({"prompt_images": [[red], [red], [blue, red], None], "raw_prompts": ["p"] * 4,
                               "responses": ["a", "b", "c", "d"]})
    assert encoded == [red, blue]
    r, b = image_data_url(red), image_data_url(blue)
    assert out["images"] == [[r], [r], [b, r], None]
    assert out["raw_prompts"] == ["p"] * 4 and out["responses"] == ["a", "b", "c", "d"]
