"""The official `tinker` SDK against `rlhfkit serve-training`'s app (a tiny random Llama on CPU):
an SL loop, an RL loop, save / load / restart, two clients with isolated adapters, hostile
clients. Skipped when the SDK is not installed (`pip install 'rlhfkit[tinker]'`)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
uvicorn = pytest.importorskip("uvicorn")

from rlhfkit.errors import DataError
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.serving.tinker.app import make_app
from rlhfkit.serving.tinker.host import ModelHost

# The SDK's session heartbeat threads outlive each test's server and log a warning when it is gone;
# they would land in later tests' captured logs.
logging.getLogger("tinker").setLevel(logging.ERROR)

KEY = "tml-test-key"
NAME = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app over a fresh ModelHost (or the `host` given) in a uvicorn thread; `stop()` ends it (a
    'restart' is a new Server)."""

    def __init__(self, root, full: bool = False, max_request_bytes: int = 8 << 20, name: str = NAME, host=None):
        if host is None:
            model, tok = tiny_model_and_tokenizer(seed=0)
            host = ModelHost(model, tok, name, root, torch.device("cpu"), full=full)
        self.host = host
        self.port = free_port()
        self.app = make_app(self.host, KEY, max_request_bytes, poll_s=2.0)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str = KEY):
        return tinker.ServiceClient(base_url=self.url, api_key=key)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def served(tmp_path, monkeypatch, **kwargs):
    """A Server over `tmp_path / "ckpt"` (`kwargs`: Server's), stopped after the test (yield from it
    in a fixture)."""
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    srv = Server(tmp_path / "ckpt", **kwargs)
    yield srv
    srv.stop()


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from served(tmp_path, monkeypatch)


def datum(tokens: list[int], weights: list[float] | None = None):
    """Next-token prediction over `tokens`: input tokens[:-1], targets tokens[1:]."""
    inputs, targets = tokens[:-1], tokens[1:]
    w = weights if weights is not None else [1.0] * len(targets)
    return tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(inputs),
                              loss_fn_inputs={"target_tokens": np.asarray(targets, dtype=np.int64),
                                              "weights": np.asarray(w, dtype=np.float32)})


EXAMPLES = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35, 36]]


def sl_steps(tc, steps: int, lr: float = 1e-2) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward([datum(e) for e in EXAMPLES], "cross_entropy")
        tc.optim_step(tinker.types.AdamParams(learning_rate=lr)).result()
        losses.append(fb.result().metrics["loss:sum"])
    return losses


def test_sl_loop_loss_falls_and_outputs_logprobs(server):
    tc = server.client().create_lora_training_client(base_model=NAME, rank=8).result()
    losses = sl_steps(tc, 6)
    assert losses[-1] < 0.5 * losses[0], losses
    out = tc.forward([datum(EXAMPLES[0])], "cross_entropy").result()
    lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert lp.shape == (len(EXAMPLES[0]) - 1,) and np.all(lp <= 0)
    assert out.metrics["loss:sum"] == pytest.approx(-lp.sum(), rel=1e-5)
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 8 and info.model_data.model_name == NAME


PROMPT = [3, 10, 11, 12]
LOW = 44  # reward: the share of sampled tokens below this id (vocabulary 89)


def rl_datum(prompt, seq, advantage):
    tokens = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                        "logprobs": np.asarray([0.0] * n_prompt + list(seq.logprobs), dtype=np.float32),
                        "advantages": np.asarray([0.0] * n_prompt + [advantage] * len(seq.tokens), dtype=np.float32)})


def test_rl_loop_reward_rises_and_sampled_logprobs_equal_forward(server):
    tc = server.client().create_lora_training_client(base_model=NAME, rank=8, seed=1).result()
    rewards = []
    for step in range(14):
        params = tinker.types.SamplingParams(max_tokens=6, temperature=1.0, seed=step)
        sc = tc.save_weights_and_get_sampling_client(f"step{step}")
        seqs = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=8,
                         sampling_params=params).result().sequences
        r = np.array([np.mean(np.asarray(s.tokens) < LOW) for s in seqs])
        rewards.append(r.mean())
        if step == 0:  # the sampler's logprobs are the trainer's forward on the same tokens
            fwd = tc.forward([rl_datum(PROMPT, seqs[0], 0.0)], "importance_sampling").result()
            lp = fwd.loss_fn_outputs[0]["logprobs"].to_numpy()[len(PROMPT) - 1:]
            np.testing.assert_allclose(lp, seqs[0].logprobs, atol=1e-4)
        adv = r - r.mean()
        tc.forward_backward([rl_datum(PROMPT, s, a) for s, a in zip(seqs, adv)], "importance_sampling").result()
        tc.optim_step(tinker.types.AdamParams(learning_rate=3e-2)).result()
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.15, rewards


def test_prompt_logprobs_and_stop(server):
    sc = server.client().create_sampling_client(base_model=NAME)
    out = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2, include_prompt_logprobs=True,
                    sampling_params=tinker.types.SamplingParams(max_tokens=5, seed=3)).result()
    assert len(out.sequences) == 2 and all(len(s.tokens) <= 5 for s in out.sequences)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    first = out.sequences[0].tokens[0]
    again = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1,
                      sampling_params=tinker.types.SamplingParams(max_tokens=5, seed=3, stop=[first])).result()
    assert list(again.sequences[0].tokens) == [first] and again.sequences[0].stop_reason == "stop"
    # a stop string of several tokens (as tinker-cookbook's renderers send "\n\nUser:") ends the sample
    # after the token that completes it; the kept tokens are the unstopped sample's prefix
    tok = server.host.tokenizer
    long = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1,
                     sampling_params=tinker.types.SamplingParams(max_tokens=12, seed=5)).result().sequences[0]
    text = tok.decode(long.tokens)
    stop = text[2:4]
    cut = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1,
                    sampling_params=tinker.types.SamplingParams(max_tokens=12, seed=5, stop=[stop]))
    cut = cut.result().sequences[0]
    assert len(tok.encode(stop, add_special_tokens=False)) == 2
    assert stop in tok.decode(cut.tokens) and stop not in tok.decode(cut.tokens[:-1])
    assert list(cut.tokens) == list(long.tokens[:len(cut.tokens)]) and cut.stop_reason == "stop"
    np.testing.assert_allclose(cut.logprobs, long.logprobs[:len(cut.tokens)], atol=1e-6)


def loss_of(tc, example=EXAMPLES[0]) -> float:
    return tc.forward([datum(example)], "cross_entropy").result().metrics["loss:sum"]


def test_save_load_and_restart(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    srv = Server(tmp_path / "ckpt")
    tc = srv.client().create_lora_training_client(base_model=NAME, rank=4).result()
    sl_steps(tc, 2)
    saved = loss_of(tc)
    path = tc.save_state("two-steps").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/two-steps")
    sl_steps(tc, 2)
    assert loss_of(tc) < saved - 1e-3
    tc.load_state_with_optimizer(path).result()
    assert loss_of(tc) == pytest.approx(saved, abs=1e-5)
    sl_steps(tc, 1)
    after_one = loss_of(tc)
    srv.stop()

    srv = Server(tmp_path / "ckpt")  # a restarted server: the checkpoint is all it has
    try:
        tc2 = srv.client().create_training_client_from_state_with_optimizer(path).result()
        assert loss_of(tc2) == pytest.approx(saved, abs=1e-5)
        sl_steps(tc2, 1)  # with the Adam moments restored the step is the same step as before the restart
        assert loss_of(tc2) == pytest.approx(after_one, abs=1e-4)
    finally:
        srv.stop()


def test_two_clients_have_isolated_adapters_on_one_base(server):
    svc = server.client()
    a = svc.create_lora_training_client(base_model=NAME, rank=8, seed=1).result()
    b = svc.create_lora_training_client(base_model=NAME, rank=4, seed=2).result()
    b_before = loss_of(b)
    a_before = loss_of(a)
    sl_steps(a, 4)
    assert loss_of(a) < 0.7 * a_before
    assert loss_of(b) == pytest.approx(b_before, abs=1e-6)
    sl_steps(b, 1)
    assert loss_of(b) < b_before
    assert len(server.host.models) == 2 and server.host.peft is not None
    assert {a.get_info().lora_rank, b.get_info().lora_rank} == {8, 4}


def test_hostile_clients_are_refused_and_others_unaffected(tmp_path, monkeypatch):
    import httpx

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    srv = Server(tmp_path / "ckpt", max_request_bytes=1 << 20)
    try:
        good = srv.client().create_lora_training_client(base_model=NAME, rank=4).result()
        sl_steps(good, 1)
        before = loss_of(good)
        r = httpx.post(f"{srv.url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"})
        assert r.status_code == 401 and "API key" in r.json()["detail"]
        with pytest.raises(Exception, match="401|API key"):
            srv.client(key="tml-wrong").create_lora_training_client(base_model=NAME, rank=4).result()
        big = httpx.post(f"{srv.url}/api/v1/forward_backward", content=b"\0" * (100 << 20),
                         headers={"X-API-Key": KEY, "Content-Type": "application/x-protobuf"}, timeout=60)
        assert big.status_code == 413
        bad = srv.client().create_lora_training_client(base_model=NAME, rank=4).result()
        wrong = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                                   loss_fn_inputs={"target_tokens": np.asarray([6, 7], dtype=np.int64),
                                                   "weights": np.asarray([1.0, 1.0], dtype=np.float32)})
        with pytest.raises(Exception, match="one per input token"):
            bad.forward_backward([wrong], "cross_entropy").result()
        with socket.create_connection(("127.0.0.1", srv.port)) as s:  # a client that vanishes mid-body
            s.sendall(f"POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
                      "Content-Length: 100000\r\n\r\n".encode() + b"\x0a" * 100)
        assert loss_of(good) == pytest.approx(before, abs=1e-6)
        sl_steps(good, 1)
        assert loss_of(good) < before
    finally:
        srv.stop()


def test_dimuon_is_refused_when_the_client_is_created(server):
    """Tinker's Dimuon optimizer is not served (docs/tinker.md): a client asking for it is refused at
    creation, not trained with AdamW in its place."""
    svc = server.client()
    with pytest.raises(Exception, match="Dimuon is not served by rlhfkit's Tinker server"):
        svc.create_lora_training_client(base_model=NAME, rank=4,
                                        optimizer=tinker.types.DimuonOptimizerConfig()).result()
    assert not server.host.models
    tc = svc.create_lora_training_client(base_model=NAME, rank=4).result()
    path = tc.save_state("adam").result().path
    with pytest.raises(Exception, match="Dimuon is not served"):
        svc.create_training_client_from_state(path, optimizer=tinker.types.DimuonOptimizerConfig()).result()
    with pytest.raises(Exception, match="Dimuon is not served"):
        tc.optim_step(tinker.types.DimuonParams(learning_rate=1e-3)).result()
    assert len(server.host.models) == 1


def accumulated_grads(server, tc) -> list[torch.Tensor]:
    model = server.host.get(tc.model_id)
    grads = [p.grad.clone() for p in model.learner.params]
    for p in model.learner.params:
        p.grad = None
    return grads


def test_custom_loss_gradient_equals_the_builtin_one(server):
    """`forward_backward_custom` (the SDK's forward, then cross_entropy with -dC/dlogp as weights):
    a custom loss written as importance sampling gives the built-in loss's gradient."""
    tc = server.client().create_lora_training_client(base_model=NAME, rank=8, seed=3).result()
    sc = tc.save_weights_and_get_sampling_client("s0").result()
    params = tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)
    seqs = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2,
                     sampling_params=params).result().sequences
    data = [rl_datum(PROMPT, s, a) for s, a in zip(seqs, (1.0, -0.5))]
    tc.forward_backward(data, "importance_sampling").result()
    builtin = accumulated_grads(server, tc)

    def is_loss(batch, logprobs):
        total = 0
        for d, lp in zip(batch, logprobs):
            q = torch.tensor(d.loss_fn_inputs["logprobs"].data)
            adv = torch.tensor(d.loss_fn_inputs["advantages"].data)
            total = total - (torch.exp(lp - q) * adv).sum()
        return total, {}

    out = tc.forward_backward_custom(data, is_loss).result()
    custom = accumulated_grads(server, tc)
    assert any(float(g.abs().max()) > 0 for g in builtin)
    for a, b in zip(builtin, custom):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert np.isfinite(out.metrics["loss:sum"])


def test_gspo_and_dro_through_the_sdk(server):
    tc = server.client().create_lora_training_client(base_model=NAME, rank=8, seed=4).result()
    sc = tc.save_weights_and_get_sampling_client("s0").result()
    params = tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=2)
    seq = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1,
                    sampling_params=params).result().sequences[0]
    d = rl_datum(PROMPT, seq, 1.0)
    n_prompt = len(PROMPT) - 1
    mask = np.asarray([0.0] * n_prompt + [1.0] * len(seq.tokens), dtype=np.float32)
    gspo = tinker.types.Datum(model_input=d.model_input,
                              loss_fn_inputs={**d.loss_fn_inputs, "sequence_ratio_mask": mask})
    out = tc.forward_backward([gspo], "gspo").result()
    # on-policy: every ratio is 1, so the loss is -sum(A) over the sampled tokens
    assert out.metrics["loss:sum"] == pytest.approx(-float(len(seq.tokens)), rel=1e-3)
    out = tc.forward_backward([d], "dro", loss_fn_config={"beta": 0.1}).result()
    lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    # sampled tokens: A = 1 and no penalty (on-policy); prompt tokens: A = 0, q = 0, penalty beta/2 * logp^2
    want = -float(lp[n_prompt:].sum()) + 0.05 * float((lp[:n_prompt] ** 2).sum())
    assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-3)
    with pytest.raises(Exception, match="sequence_ratio_mask"):
        tc.forward_backward([d], "gspo").result()


def test_concurrent_sample_requests_share_one_engine_call_and_keep_their_answers(server, monkeypatch):
    import asyncio

    calls = []
    original = server.host.sample

    def counted(session, prompts, *args):
        calls.append(len(prompts))
        time.sleep(0.3)  # keep the worker busy so that the next requests queue behind this one
        return original(session, prompts, *args)

    monkeypatch.setattr(server.host, "sample", counted)
    sc = server.client().create_sampling_client(base_model=NAME)
    prompts = [PROMPT, [3, 20, 21], [3, 30, 31, 32, 33], [3, 40]]

    def params(i):
        return tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=100 + i)

    async def together():
        return await asyncio.gather(*[sc.sample_async(tinker.types.ModelInput.from_ints(p), num_samples=2,
                                                      sampling_params=params(i)) for i, p in enumerate(prompts)])

    batched = asyncio.run(together())
    assert sum(calls) == len(prompts) and len(calls) < len(prompts), calls  # some requests ran in one call
    calls.clear()
    for i, p in enumerate(prompts):
        alone = sc.sample(tinker.types.ModelInput.from_ints(p), num_samples=2, sampling_params=params(i)).result()
        assert [s.tokens for s in alone.sequences] == [s.tokens for s in batched[i].sequences]
        for a, b in zip(alone.sequences, batched[i].sequences):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert calls == [1] * len(prompts)


def held_queue(server):
    """Hold the server's worker until the returned `release(n)` is called (it waits for n requests to
    be queued behind the hold, then lets them run)."""
    queue = server.app.state.queue
    gate = threading.Event()
    queue.submit(None, gate.wait)

    def release(n: int) -> None:
        deadline = time.time() + 30
        while len(queue.pending) < n and time.time() < deadline:
            time.sleep(0.02)
        assert len(queue.pending) == n, queue.pending
        gate.set()
    return release


def test_concurrent_clients_run_in_shared_calls_with_their_own_results(server):
    """Three LoRA clients' forward_backward requests waiting together run as one batch (one call of
    the queue: one forward over all their data, tests/unit/serving/test_tinker_batching.py), with
    each client's loss, logprobs and gradients those of its request run alone; two clients'
    samplers sampling together share one engine call and get the samples each gets alone."""
    svc = server.client()
    clients = [svc.create_lora_training_client(base_model=NAME, rank=r, seed=s).result()
               for r, s in ((8, 1), (4, 2), (4, 3))]
    sl_steps(clients[0], 1, lr=3e-2)  # the adapters differ from each other and from the base
    clients[1].forward_backward([datum(EXAMPLES[2])], "cross_entropy").result()
    clients[1].optim_step(tinker.types.AdamParams(learning_rate=3e-2)).result()
    calls = server.app.state.queue.calls
    release = held_queue(server)
    futures = [tc.forward_backward([datum(EXAMPLES[k]), datum(EXAMPLES[(k + 1) % 3])], "cross_entropy")
               for k, tc in enumerate(clients)]
    release(3)
    batched = [f.result() for f in futures]
    assert calls["fwdbwd"][-1] == 3, calls
    grads = [accumulated_grads(server, tc) for tc in clients]
    for k, tc in enumerate(clients):
        alone = tc.forward_backward([datum(EXAMPLES[k]), datum(EXAMPLES[(k + 1) % 3])], "cross_entropy").result()
        assert calls["fwdbwd"][-1] == 1
        assert batched[k].metrics["loss:sum"] == pytest.approx(alone.metrics["loss:sum"], rel=1e-5)
        for b, a in zip(batched[k].loss_fn_outputs, alone.loss_fn_outputs):
            np.testing.assert_allclose(b["logprobs"].to_numpy(), a["logprobs"].to_numpy(), atol=1e-5)
        for g, w in zip(grads[k], accumulated_grads(server, tc), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)

    samplers = [tc.save_weights_and_get_sampling_client(f"s{k}").result() for k, tc in enumerate(clients[:2])]
    params = tinker.types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    release = held_queue(server)
    futures = [sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params)
               for sc in samplers]
    release(2)
    together = [f.result() for f in futures]
    assert calls["sample"][-1] == 2, calls
    for sc, got in zip(samplers, together):
        alone = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params).result()
        assert [s.tokens for s in got.sequences] == [s.tokens for s in alone.sequences]
        for a, b in zip(alone.sequences, got.sequences):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert [s.tokens for s in together[0].sequences] != [s.tokens for s in together[1].sequences]


def test_user_mistakes_are_raised_at_once_as_the_sdks_errors(server):
    """A sampler of a checkpoint that does not exist, a model id the server does not know, a
    loss_fn_config value that is not a number and a LoRA rank of 0 are the user's mistakes: the SDK
    raises each at once with the server's line (not a 500 it retries for a minute, nor a 'server
    error', nor rank 0 trained as the default rank)."""
    import httpx

    svc = server.client()
    start = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match="no such checkpoint on this server"):
        svc.create_sampling_client(model_path="tinker://nobody:train:0/sampler_weights/none").sample(
            tinker.types.ModelInput.from_ints(PROMPT), 1, tinker.types.SamplingParams(max_tokens=2)).result()
    assert time.monotonic() - start < 10
    r = httpx.post(f"{server.url}/api/v1/get_info", json={"model_id": "nobody:train:0"}, headers={"X-API-Key": KEY})
    assert r.status_code == 400 and "nobody:train:0" in r.json()["detail"]
    tc = svc.create_lora_training_client(base_model=NAME, rank=4).result()
    d = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                           loss_fn_inputs={"target_tokens": np.asarray([6, 7, 8]),
                                           "logprobs": np.full(3, -1.0, np.float32),
                                           "advantages": np.ones(3, np.float32)})
    with pytest.raises(tinker.RequestFailedError, match="DataError: loss_fn_config") as caught:
        tc.forward_backward([d], "ppo", loss_fn_config={"clip_low_threshold": "low"}).result()
    assert "server error" not in str(caught.value)
    with pytest.raises(tinker.RequestFailedError, match="rank 0; give a positive integer"):
        svc.create_lora_training_client(base_model=NAME, rank=0).result()
    assert len(server.host.models) == 1


def test_closing_the_service_client_ends_its_session(server):
    """`ServiceClient.close(status)` (the SDK's end of a run) is answered, and unloads that session's
    training models only; their checkpoints stay and load in a new session."""
    first, other = server.client(), server.client()
    tc = first.create_lora_training_client(base_model=NAME, rank=4).result()
    keep = other.create_lora_training_client(base_model=NAME, rank=4).result()
    sl_steps(tc, 1)
    trained = loss_of(tc)
    path = tc.save_state("before-close").result().path
    first.close("success").result()
    assert tc.model_id not in server.host.models and keep.model_id in server.host.models
    sl_steps(keep, 1)
    again = server.client().create_training_client_from_state(path).result()
    assert loss_of(again) == pytest.approx(trained, abs=1e-5)


def test_rest_client_lists_and_deletes_checkpoints(server):
    """The SDK's RestClient: list_checkpoints of a training run and list_user_checkpoints name what
    save_state / save_weights_for_sampler wrote (newest first), delete_checkpoint removes one."""
    svc = server.client()
    tc = svc.create_lora_training_client(base_model=NAME, rank=4).result()
    other = svc.create_lora_training_client(base_model=NAME, rank=4).result()
    state = tc.save_state("first").result().path
    time.sleep(0.05)
    sampler = tc.save_weights_for_sampler("second").result().path
    theirs = other.save_state("theirs").result().path
    rest = svc.create_rest_client()
    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert [(c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed] == [
        ("sampler_weights/second", "sampler", sampler), ("weights/first", "training", state)]
    assert all(c.size_bytes > 0 for c in listed)
    every = rest.list_user_checkpoints().result()
    assert {c.tinker_path for c in every.checkpoints} == {state, sampler, theirs}
    assert every.cursor.total_count == 3
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints] == [sampler]
    with pytest.raises(tinker.RequestFailedError, match="no such checkpoint"):
        tc.load_state(state).result()
    with pytest.raises(tinker.BadRequestError, match="no such checkpoint"):
        rest.delete_checkpoint_from_tinker_path(state).result()


def test_adam_params_out_of_range_are_refused_and_change_nothing(server):
    """A negative learning rate (a step up the loss), beta1 = 1 (Adam's bias correction divides by
    zero) or eps = 0 is refused naming the field; the weights and the accumulated gradient stay, and
    the next valid step takes that gradient."""
    tc = server.client().create_lora_training_client(base_model=NAME, rank=4, seed=5).result()
    before = loss_of(tc)
    tc.forward_backward([datum(e) for e in EXAMPLES], "cross_entropy").result()
    for params, message in ((dict(learning_rate=-1e-2), "learning_rate=-0.01; need lr >= 0"),
                            (dict(learning_rate=1e-2, beta1=1.0), "beta1=1.0; need 0 <= beta1 < 1"),
                            (dict(learning_rate=1e-2, eps=0.0), "eps=0.0; need eps > 0")):
        with pytest.raises(tinker.RequestFailedError, match=message):
            tc.optim_step(tinker.types.AdamParams(**params)).result()
    assert loss_of(tc) == pytest.approx(before, abs=1e-6)
    tc.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
    assert loss_of(tc) < before - 1e-3


def sampled_logprobs(sc, seed: int = 3) -> list[float]:
    params = tinker.types.SamplingParams(max_tokens=4, seed=seed)
    out = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), 1, sampling_params=params).result()
    return out.sequences[0].logprobs


def test_a_sampler_samples_the_save_it_was_created_from(server):
    """Saving sampler weights again under the same name (as a loop that keeps one 'latest' does): a
    sampler created after the second save samples the trained weights (it sampled the first save's,
    kept loaded under the same folder), and the first sampler keeps its snapshot."""
    svc = server.client()
    tc = svc.create_lora_training_client(base_model=NAME, rank=4, seed=6).result()
    first = svc.create_sampling_client(model_path=tc.save_weights_for_sampler("latest").result().path)
    before = sampled_logprobs(first)
    sl_steps(tc, 3, lr=5e-2)
    second = svc.create_sampling_client(model_path=tc.save_weights_for_sampler("latest").result().path)
    fresh = svc.create_sampling_client(model_path=tc.save_weights_for_sampler("fresh").result().path)
    trained = sampled_logprobs(fresh)
    assert np.max(np.abs(np.subtract(trained, before))) > 1e-2
    np.testing.assert_allclose(sampled_logprobs(second), trained, atol=1e-6)
    np.testing.assert_allclose(sampled_logprobs(first), before, atol=1e-6)


def test_loaded_sampler_weights_are_bounded_and_reloaded_when_sampled_again(server):
    """An RL loop makes a sampler of new weights every step: only the MAX_LOADED_SAMPLERS most recently
    sampled stay loaded (adapters in the shared peft model); an older one samples again from its
    checkpoint, the same logprobs; one whose checkpoint was saved again since is refused in one line."""
    from rlhfkit.serving.tinker.host import MAX_LOADED_SAMPLERS

    limit = MAX_LOADED_SAMPLERS["lora"]
    svc = server.client()
    tc = svc.create_lora_training_client(base_model=NAME, rank=4, seed=7).result()
    samplers, logprobs = [], []
    for step in range(limit + 2):
        sl_steps(tc, 1, lr=3e-2)
        samplers.append(svc.create_sampling_client(model_path=tc.save_weights_for_sampler(f"step{step}").result().path))
        logprobs.append(sampled_logprobs(samplers[-1]))
    host = server.host
    assert len(host._loaded) == limit and len(host.peft.peft_config) == 1 + limit
    np.testing.assert_allclose(sampled_logprobs(samplers[0]), logprobs[0], atol=1e-6)  # unloaded, loaded again
    assert len(host.peft.peft_config) == 1 + limit
    tc.save_weights_for_sampler("step1").result()  # samplers[1]'s weights are unloaded: its save is gone
    with pytest.raises(tinker.RequestFailedError, match="step1 was saved again after this sampler was created"):
        sampled_logprobs(samplers[1])
    np.testing.assert_allclose(sampled_logprobs(samplers[-1]), logprobs[-1], atol=1e-6)


def test_a_nan_gradient_step_is_answered_not_retried_without_end(server):
    """A NaN weight makes the loss and the gradient NaN: the step is skipped (weights unchanged) and
    optim_step answers at once with skipped_steps and no grad norm. Before, its NaN grad norm made
    the answer a 500 (JSON has no NaN) that the SDK retried without end. Any other answer that
    cannot be sent as JSON is an error the SDK raises."""
    import httpx

    tc = server.client().create_lora_training_client(base_model=NAME, rank=4, seed=8).result()
    before = loss_of(tc)
    nan = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                             loss_fn_inputs={"target_tokens": np.asarray([6, 7, 8]),
                                             "weights": np.asarray([np.nan, 1.0, 1.0], np.float32)})
    assert np.isnan(tc.forward_backward([nan], "cross_entropy").result().metrics["loss:sum"])
    step = tc.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result(timeout=20)
    assert step.metrics == {"skipped_steps:max": 1.0}
    assert loss_of(tc) == before
    sl_steps(tc, 1)
    assert loss_of(tc) < before
    answer = server.app.state.futures.submit(lambda: {"value": float("nan")})
    time.sleep(0.2)
    r = httpx.post(f"{server.url}/api/v1/retrieve_future", json={"request_id": answer["request_id"]},
                   headers={"X-API-Key": KEY})
    assert r.status_code == 200 and r.json()["category"] == "server"
    assert "cannot be sent as JSON" in r.json()["error"]


def test_max_tokens_past_the_context_is_refused_in_one_line(server):
    """A prompt and max_tokens longer than the model's context (512 here) are refused as vLLM refuses
    them (before: the engine tried to allocate a cache for them, 128 TB for max_tokens=10**12); a
    value that is not a number is the user's error, not the server's."""
    import httpx

    sc = server.client().create_sampling_client(base_model=NAME)
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    with pytest.raises(tinker.RequestFailedError, match="4 tokens and max_tokens 509 are more than the model's "
                                                         "context of 512 tokens"):
        sc.sample(prompt, 1, tinker.types.SamplingParams(max_tokens=509)).result()
    assert len(sc.sample(prompt, 1, tinker.types.SamplingParams(max_tokens=508, seed=1)).result().sequences) == 1
    session = httpx.post(f"{server.url}/api/v1/create_sampling_session", json={"base_model": NAME},
                         headers={"X-API-Key": KEY}).json()["sampling_session_id"]
    r = httpx.post(f"{server.url}/api/v1/asample", headers={"X-API-Key": KEY},
                   json={"sampling_session_id": session, "num_samples": 1, "sampling_params": {"max_tokens": "x"},
                         "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}})
    answer = server.app.state.futures.items[r.json()["request_id"]]
    with pytest.raises(DataError, match="sampling_params .* give numbers"):
        answer.result(timeout=20)
