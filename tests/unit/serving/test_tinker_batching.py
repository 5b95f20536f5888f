"""Several clients' requests in shared forwards (ModelHost.forward_backward_many, ModelHost.sample
over several sampling sessions): the same losses, logprobs, gradients and samples as running each
request alone, in fewer forwards / engine calls, and a bad request fails alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("peft")

from rlhfkit.errors import DataError
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.serving.tinker.host import ModelHost
from rlhfkit.serving.tinker.wire import FwdBwdRequest, SampleOptions, WireDatum


def ce(tokens: list[int]) -> WireDatum:
    return WireDatum(tokens[:-1], {"target_tokens": np.asarray(tokens[1:]), "weights": np.ones(len(tokens) - 1,
                                                                                                np.float32)})


def rl(tokens: list[int], q: float, adv: float) -> WireDatum:
    n = len(tokens) - 1
    return WireDatum(tokens[:-1], {"target_tokens": np.asarray(tokens[1:]), "logprobs": np.full(n, q, np.float32),
                                   "advantages": np.linspace(-adv, adv, n).astype(np.float32)})


@pytest.fixture
def host(tmp_path):
    """A LoRA host with three clients whose adapters differ (one SL step each on its own data):
    a (rank 8), b (rank 4), c (rank 4, attention only)."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    h = ModelHost(model, tok, "tiny", tmp_path, torch.device("cpu"))
    for k, (mid, rank, mlp) in enumerate((("a", 8, True), ("b", 4, True), ("c", 4, False))):
        h.create_model(mid, rank, seed=k, mlp=mlp)
        h.forward_backward(mid, "cross_entropy", {}, [ce([5 + 10 * k + i for i in range(6)])], forward_only=False)
        h.optim_step(mid, {"learning_rate": 3e-2})
    return h


def take_grads(host, model_id):
    params = host.models[model_id].learner.params
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return grads


def count_forwards(module, calls: list) -> None:
    module.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs["input_ids"].shape[0]),
                                     with_kwargs=True)


REQUESTS = [
    FwdBwdRequest("a", 0, "cross_entropy", {}, False, [ce([5, 6, 7, 8, 9, 10]), ce([11, 12, 13])]),
    FwdBwdRequest("b", 0, "importance_sampling", {}, False, [rl([3, 30, 31, 32, 33], -4.0, 1.0)]),
    FwdBwdRequest("c", 0, "cross_entropy", {}, True, [ce([40, 41, 42, 43])]),  # forward only
    FwdBwdRequest("a", 1, "ppo", {}, False, [rl([3, 50, 51, 52], -4.5, 2.0)]),
    FwdBwdRequest("b", 1, "dro", {"beta": 0.1}, False, [rl([3, 60, 61, 62, 63, 64, 65], -4.2, 0.5)]),
]


def test_requests_of_several_adapters_in_one_forward_equal_one_by_one(host):
    calls: list[int] = []
    count_forwards(host.base, calls)
    alone = [host.forward_backward(r.model_id, r.loss_fn, r.config, r.data, r.forward_only) for r in REQUESTS]
    want = {mid: take_grads(host, mid) for mid in "abc"}
    assert len(calls) == len(REQUESTS)
    calls.clear()

    batched = host.forward_backward_many(REQUESTS)
    assert calls == [6]  # every datum of every client in one forward
    got = {mid: take_grads(host, mid) for mid in "abc"}
    for (outs, metrics), (want_outs, want_metrics) in zip(batched, alone, strict=True):
        assert metrics["loss:sum"] == pytest.approx(want_metrics["loss:sum"], rel=1e-5, abs=1e-6)
        for o, w in zip(outs, want_outs, strict=True):
            for key in ("logprobs", "elementwise_loss"):
                np.testing.assert_allclose(o[key], w[key], rtol=1e-5, atol=1e-5)
    for mid in "ab":
        assert any(float(g.abs().max()) > 0 for g in got[mid])
        for g, w in zip(got[mid], want[mid], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert all(g is None for g in got["c"]) and all(g is None for g in want["c"])  # forward only: no gradient


def test_the_token_budget_cuts_the_batch_and_changes_nothing(host):
    host.batch_tokens = 12  # rows (input tokens) a: 5, 2, 3; b: 4, 6; c: 3 -> [5, 2] [3, 4] [6, 3]
    calls: list[int] = []
    count_forwards(host.base, calls)
    cut = host.forward_backward_many(REQUESTS)
    grads = {mid: take_grads(host, mid) for mid in "ab"}
    host.batch_tokens = 4096
    whole = host.forward_backward_many(REQUESTS)
    assert calls == [2, 2, 2, 6]
    for (outs, _), (want, _) in zip(cut, whole, strict=True):
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(o["logprobs"], w["logprobs"], rtol=1e-5, atol=1e-5)
    for mid in "ab":
        for g, w in zip(grads[mid], take_grads(host, mid), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_a_bad_request_fails_alone_and_leaves_its_model_untouched(host):
    good = REQUESTS[0]
    host.forward_backward(good.model_id, good.loss_fn, good.config, good.data, False)
    want = take_grads(host, "a")
    bad_token = FwdBwdRequest("b", 0, "cross_entropy", {}, False, [ce([5, 6, 500])])
    no_beta = FwdBwdRequest("c", 0, "dro", {}, False, [rl([3, 30, 31], -4.0, 1.0)])
    empty_mask = FwdBwdRequest("b", 1, "gspo", {}, False, [WireDatum([3, 4], {
        "target_tokens": np.asarray([4, 5]), "logprobs": np.zeros(2, np.float32),
        "advantages": np.ones(2, np.float32), "sequence_ratio_mask": np.zeros(2, np.float32)})])
    unknown = FwdBwdRequest("nobody", 0, "cross_entropy", {}, False, [ce([5, 6, 7])])
    results = host.forward_backward_many([bad_token, good, no_beta, empty_mask, unknown])
    assert isinstance(results[0], DataError) and "outside" in str(results[0])
    assert isinstance(results[2], DataError) and "beta" in str(results[2])
    assert isinstance(results[3], DataError) and "sequence_ratio_mask" in str(results[3])
    assert isinstance(results[4], DataError) and "no such training model" in str(results[4])
    for g, w in zip(take_grads(host, "a"), want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert all(g is None for mid in "bc" for g in take_grads(host, mid))


PROMPTS = [[3, 10, 11, 12], [3, 20, 21], [3, 30, 31, 32, 33], [3, 40], [3, 50, 51]]
PARAMS = {"max_tokens": 6, "temperature": 1.0}


def test_samples_of_several_adapters_in_one_engine_call_equal_each_alone(host, monkeypatch):
    sessions = [host.create_sampler(host.save_for_sampler(mid, "s0")) for mid in "ab"] + [host.create_sampler(None)]
    rows = [sessions[0], sessions[1], sessions[2], sessions[0], sessions[1]]  # a, b, the base, a, b
    seeds = [100 + i for i in range(len(PROMPTS))]
    want_lp = [SampleOptions(prompt_logprobs=i == 1) for i in range(len(PROMPTS))]
    engine_calls: list[int] = []
    generate = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, prompts, *a, **k: (engine_calls.append(len(prompts)),
                                                                              generate(self, prompts, *a, **k))[1])
    batched = host.sample(rows, PROMPTS, 3, PARAMS, seeds, want_lp)
    assert engine_calls == [5]
    engine_calls.clear()
    for i in range(len(PROMPTS)):
        (alone,) = host.sample([rows[i]], [PROMPTS[i]], 3, PARAMS, [seeds[i]], [want_lp[i]])
        seqs, lp, _ = batched[i]
        assert [s.tokens for s in seqs] == [s.tokens for s in alone[0]]
        for s, a in zip(seqs, alone[0], strict=True):
            np.testing.assert_allclose(s.logprobs, a.logprobs, atol=1e-5)
        assert (lp is None) == (alone[1] is None)
        if lp is not None:
            np.testing.assert_allclose(lp[1:], alone[1][1:], atol=1e-5)
    assert engine_calls == [1] * len(PROMPTS)
    # the adapters matter: a's prompt sampled with b's weights gives other logprobs
    (other,) = host.sample([sessions[1]], [PROMPTS[0]], 3, PARAMS, [seeds[0]], [SampleOptions()])
    assert not np.allclose(other[0][0].logprobs[:1], batched[0][0][0].logprobs[:1], atol=1e-4)


def test_a_bad_prompt_or_session_fails_alone(host):
    session = host.create_sampler(None)
    out = host.sample([session, "sampler-nope", session], [[3, 4], [3, 4], [3, 9999]], 1, PARAMS, [1, 2, 3],
                      [SampleOptions()] * 3)
    assert len(out[0][0]) == 1 and len(out[0][0][0].tokens) >= 1
    assert isinstance(out[1], DataError) and "no such sampling session" in str(out[1])
    assert isinstance(out[2], DataError) and "prompt" in str(out[2])


def test_token_batches_cut_where_the_module_changes_and_at_the_budget():
    """Full fine-tuning: each model its own module, so a batch never mixes two models' rows; within one
    model's rows the budget cuts (rows x longest <= 8): a: 3, 3, 4 -> [3, 3] [4]; b: 2 -> [2];
    c (a's module, after b's): 5 -> [5]."""
    one, two = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    host = ModelHost.__new__(ModelHost)
    host.batch_tokens = 8
    host.models = {"a": SimpleNamespace(module=one), "b": SimpleNamespace(module=two),
                   "c": SimpleNamespace(module=one)}
    requests = [FwdBwdRequest(mid, 0, "cross_entropy", {}, False, [WireDatum([0] * n) for n in lengths])
                for mid, lengths in (("a", (3, 3, 4)), ("b", (2,)), ("c", (5,)))]
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)]
    assert list(host._token_batches(rows, requests)) == [[(0, 0), (0, 1)], [(0, 2)], [(1, 0)], [(2, 0)]]
