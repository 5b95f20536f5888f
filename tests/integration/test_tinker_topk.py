"""Top-k logprobs through the official `tinker` SDK (`topk_prompt_logprobs`, `topk_sample_logprobs`):
the values of a transformers forward computed here, unchanged when several clients' samples run
batched. Skipped when the SDK is not installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
pytest.importorskip("uvicorn")

from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.serving.tinker.scoring import MAX_TOPK
from tests.integration.test_tinker_sdk import NAME, PROMPT, held_queue, served, sl_steps


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from served(tmp_path, monkeypatch)


def reference_logp(tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) [len(tokens), V] of a fresh copy of the served tiny model."""
    model, _ = tiny_model_and_tokenizer(seed=0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def assert_rows(rows, logp: torch.Tensor, k: int) -> None:
    """Each row of `rows` ((token, logprob) lists) is the top k of the same row of `logp`, best first."""
    assert len(rows) == logp.shape[0]
    for row, want in zip(rows, logp):
        top = want.topk(k)
        assert [t for t, _ in row] == top.indices.tolist()
        np.testing.assert_allclose([lp for _, lp in row], top.values.numpy(), atol=1e-5)


def test_topk_logprobs_equal_a_transformers_forward(server):
    sc = server.client().create_sampling_client(base_model=NAME).result()
    params = tinker.types.SamplingParams(max_tokens=6, temperature=0.7, seed=4)
    out = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params,
                    include_prompt_logprobs=True, topk_prompt_logprobs=5, topk_sample_logprobs=3).result()
    # prompt positions: the model's own distribution (temperature 1); position 0 has none
    prompt_logp = reference_logp(PROMPT)
    assert out.topk_prompt_logprobs[0] is None and len(out.topk_prompt_logprobs) == len(PROMPT)
    assert_rows(out.topk_prompt_logprobs[1:], prompt_logp[:-1], 5)
    np.testing.assert_allclose(out.prompt_logprobs[1:], prompt_logp[:-1].gather(
        -1, torch.tensor(PROMPT[1:]).view(-1, 1)).squeeze(-1).numpy(), atol=1e-5)
    # sampled positions: the distribution the token was drawn from, at the request's temperature
    for seq in out.sequences:
        logp = reference_logp(PROMPT + seq.tokens[:-1], temperature=0.7)[len(PROMPT) - 1:]
        assert len(seq.topk_logprobs) == len(seq.tokens)
        assert_rows(seq.topk_logprobs, logp, 3)
        for token, lp, row in zip(seq.tokens, seq.logprobs, seq.topk_logprobs):
            if token in dict(row):  # the sampled token's logprob is its entry in its own row
                assert dict(row)[token] == pytest.approx(lp, abs=1e-5)
    # greedy: the sampled token is its row's first, and the row is at temperature 1
    greedy = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1, topk_sample_logprobs=2,
                       sampling_params=tinker.types.SamplingParams(max_tokens=4, temperature=0.0)).result()
    seq = greedy.sequences[0]
    assert [row[0][0] for row in seq.topk_logprobs] == list(seq.tokens)
    assert_rows(seq.topk_logprobs, reference_logp(PROMPT + seq.tokens[:-1])[len(PROMPT) - 1:], 2)
    plain = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=1, sampling_params=params).result()
    assert plain.topk_prompt_logprobs is None and plain.sequences[0].topk_logprobs is None


def test_topk_of_several_clients_batched_equal_each_alone(server):
    """Two LoRA clients' samplers asking different top-k widths (and one none) while waiting together run
    in one engine call; each gets the top-k rows it gets alone."""
    svc = server.client()
    clients = [svc.create_lora_training_client(base_model=NAME, rank=r, seed=s).result() for r, s in ((8, 1), (4, 2))]
    sl_steps(clients[0], 1, lr=3e-2)  # the two adapters differ
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in clients]
    params = tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=9)
    asks = [(4, 3), (0, 2), (2, 0)]  # (topk_prompt_logprobs, topk_sample_logprobs) of each request
    runs = [(samplers[0], asks[0]), (samplers[1], asks[1]), (samplers[1], asks[2])]

    def request(sc, ask):
        return sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params,
                         topk_prompt_logprobs=ask[0], topk_sample_logprobs=ask[1])

    calls = server.app.state.queue.calls
    release = held_queue(server)
    futures = [request(sc, ask) for sc, ask in runs]
    release(3)
    together = [f.result() for f in futures]
    assert calls["sample"][-1] == 3, calls
    for (sc, ask), got in zip(runs, together):
        alone = request(sc, ask).result()
        assert calls["sample"][-1] == 1
        assert (got.topk_prompt_logprobs is None) == (ask[0] == 0)
        if ask[0]:
            assert got.topk_prompt_logprobs[0] is None
            for g, a in zip(got.topk_prompt_logprobs[1:], alone.topk_prompt_logprobs[1:], strict=True):
                assert len(g) == ask[0] and [t for t, _ in g] == [t for t, _ in a]
                np.testing.assert_allclose([lp for _, lp in g], [lp for _, lp in a], atol=1e-5)
        for gs, a_s in zip(got.sequences, alone.sequences, strict=True):
            assert gs.tokens == a_s.tokens and (gs.topk_logprobs is None) == (ask[1] == 0)
            for g, a in zip(gs.topk_logprobs or [], a_s.topk_logprobs or [], strict=True):
                assert len(g) == ask[1] and [t for t, _ in g] == [t for t, _ in a]
                np.testing.assert_allclose([lp for _, lp in g], [lp for _, lp in a], atol=1e-5)
    # the adapters matter: the two clients' prompt rows differ
    assert not np.allclose([lp for _, lp in together[0].topk_prompt_logprobs[-1][:2]],
                           [lp for _, lp in together[2].topk_prompt_logprobs[-1][:2]], atol=1e-4)


def test_unserved_sampling_options_are_refused_in_one_line(server):
    sc = server.client().create_sampling_client(base_model=NAME).result()
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    params = tinker.types.SamplingParams(max_tokens=2)
    with pytest.raises(Exception, match=f"topk_sample_logprobs {MAX_TOPK + 1}: give an integer from 0"):
        sc.sample(prompt, num_samples=1, sampling_params=params, topk_sample_logprobs=MAX_TOPK + 1).result()
    with pytest.raises(Exception, match="prompt_alt_tokens_k is not served"):
        sc.sample(prompt, num_samples=1, sampling_params=params, prompt_alt_tokens_k=2).result()
