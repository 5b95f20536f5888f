"""The response-only logprob forward and the critic, checked against naive full forwards."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.data.batch import collate
from rlhfkit.data.types import Trajectory
from rlhfkit.models import Critic, response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models.logprobs import split_backbone

# (prompt length, response length): mixed, including a 1-token prompt and a 1-token response.
SHAPES = [(5, 3), (1, 7), (9, 1), (4, 4)]


def _batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for p, r in SHAPES:
        ids = torch.randint(3, vocab, (p + r,), generator=g)
        mask = torch.ones(r, dtype=torch.bool)
        trajs.append(Trajectory(ids[:p], ids[p:], mask, torch.zeros(r), "length", 0))
    return collate(trajs, pad_id=0)


def _naive_logprobs(model, batch, temperature):
    """Full forward, log_softmax over every position, gather row by row (no padding)."""
    out = torch.zeros(batch.response_ids.shape)
    for b, (p, r) in enumerate(SHAPES):
        ids = batch.input_ids[b : b + 1, : p + r]
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, dim=-1)
        for j in range(r):
            out[b, j] = logp[p + j - 1, ids[0, p + j]]
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_logprobs_match_naive_forward(temperature):
    model, tok = tiny_model_and_tokenizer(seed=0)
    batch = _batch(len(tok))
    logp, ent = response_logprobs(model, batch, temperature=temperature, with_entropy=True)
    assert logp.shape == ent.shape == batch.response_ids.shape
    assert logp.dtype == torch.float32
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    naive = _naive_logprobs(model, batch, temperature)
    m = batch.response_mask
    torch.testing.assert_close(logp[m], naive[m], atol=1e-5, rtol=0)
    # Entropy at response token 0 of row 1 by hand from the full forward.
    p = SHAPES[1][0]
    z = model(batch.input_ids[1:2, :p]).logits[0, -1] / temperature
    probs = torch.softmax(z, -1)
    torch.testing.assert_close(ent[1, 0], -(probs * probs.log()).sum(), atol=1e-5, rtol=0)


def test_response_logprobs_without_entropy_and_fallback_path(monkeypatch):
    model, tok = tiny_model_and_tokenizer(seed=2)
    batch = _batch(len(tok), seed=1)
    fast, ent = response_logprobs(model, batch)
    assert ent is None
    monkeypatch.setattr("rlhfkit.models.logprobs.split_backbone", lambda model: None)
    slow, _ = response_logprobs(model, batch)
    torch.testing.assert_close(fast[batch.response_mask], slow[batch.response_mask], atol=1e-5, rtol=0)


def test_split_backbone_refuses_softcapped_heads():
    model, _ = tiny_model_and_tokenizer()
    assert split_backbone(model) is not None
    model.config.final_logit_softcapping = 30.0
    assert split_backbone(model) is None


def test_response_logprobs_gradients_flow_only_from_counted_tokens():
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.train()
    batch = _batch(len(tok))
    logp, _ = response_logprobs(model, batch)
    logp[batch.response_mask].sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_response_logprobs_bf16_model_close_to_fp32():
    model, tok = tiny_model_and_tokenizer(seed=0)
    batch = _batch(len(tok))
    ref, _ = response_logprobs(model, batch)
    low, _ = response_logprobs(model.to(torch.bfloat16), batch)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low[batch.response_mask], ref[batch.response_mask], atol=0.1, rtol=0)


def test_critic_values_align_with_logprob_positions():
    model, tok = tiny_model_and_tokenizer(seed=0)
    critic = Critic.from_causal_lm(model)
    assert critic.backbone is not model.model  # a copy, never the policy's own weights
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    batch = _batch(len(tok))
    full = critic(batch.input_ids, batch.attention_mask)
    assert full.shape == batch.input_ids.shape and full.dtype == torch.float32
    resp = critic.response_values(batch)
    assert resp.shape == batch.response_ids.shape
    for b, (p, r) in enumerate(SHAPES):
        # Unpadded single-row forward: value of the state before response token j = position p+j-1.
        single = critic(batch.input_ids[b : b + 1, : p + r], batch.attention_mask[b : b + 1, : p + r])[0]
        torch.testing.assert_close(resp[b, :r], single[p - 1 : p + r - 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(full[b, : p + r], single, atol=1e-5, rtol=0)


def test_fresh_critic_is_zero_and_trains():
    model, tok = tiny_model_and_tokenizer(seed=0)
    critic = Critic.from_causal_lm(model)
    batch = _batch(len(tok))
    values = critic.response_values(batch)
    assert torch.equal(values, torch.zeros_like(values))
    ((values - 1.0) ** 2).mean().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0


def test_critic_save_load_round_trip(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "lm")
    critic = Critic.from_causal_lm(tmp_path / "lm")
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(1))
    critic.value_head.bias.data.fill_(0.5)
    critic.save_pretrained(tmp_path / "critic")
    assert (tmp_path / "critic" / "model.safetensors").is_file()
    loaded = Critic.from_pretrained(tmp_path / "critic")
    batch = _batch(len(tok))
    assert torch.equal(critic.response_values(batch), loaded.response_values(batch))


def test_critic_from_pretrained_names_missing_head(tmp_path):
    from rlhfkit.errors import ModelError

    with pytest.raises(ModelError, match="value_head.safetensors"):
        Critic.from_pretrained(tmp_path)


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_head_equals_the_logits_path_in_values_and_every_gradient(monkeypatch, autocast):
    """response_logprobs runs the LM head fused with the log-softmax (its own backward); the plain
    head + logprobs_and_entropy path gives the same logprobs, entropy and parameter gradients (in
    float32 to rounding; under bf16 autocast to bf16 rounding: the two round in other places)."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.train()
    batch = _batch(len(tok))
    weights = torch.rand(batch.response_ids.shape, generator=torch.Generator().manual_seed(0)) * batch.response_mask

    def run():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=False)
            (logp * weights).sum().backward()
        return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    calls = []
    fused = run()
    monkeypatch.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: calls.append(head) or False)
    plain = run()
    assert calls  # the second run took the logits path
    m = batch.response_mask
    torch.testing.assert_close(fused[0][m], plain[0][m], atol=1e-6, rtol=0)
    torch.testing.assert_close(fused[1][m], plain[1][m], atol=1e-4, rtol=0)
    for name, g in plain[2].items():
        if autocast:
            assert float((fused[2][name] - g).norm() / g.norm()) < 2e-2, name
        else:
            torch.testing.assert_close(fused[2][name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_a_hooked_or_biased_head_is_called_as_a_module():
    from rlhfkit.models.logprobs import _plain_linear

    model, tok = tiny_model_and_tokenizer(seed=0)
    assert _plain_linear(model.lm_head)
    seen = []
    handle = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    assert not _plain_linear(model.lm_head)  # FSDP gathers a sharded head's weight in such a hook
    response_logprobs(model, _batch(len(tok)))
    assert seen
    handle.remove()
    assert not _plain_linear(torch.nn.Linear(4, 5, bias=True)) and not _plain_linear(None)
