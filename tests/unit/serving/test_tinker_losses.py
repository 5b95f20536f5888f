"""The served Tinker losses are rlhfkit's core losses, summed over tokens as Tinker defines them,
and `forward_backward`'s gradients equal rlhfkit's SFT / policy-gradient losses on the same tokens."""

import math

import numpy as np
import pytest
import torch

from rlhfkit.core.losses import logprobs_from_logits, policy_loss, sft_loss
from rlhfkit.errors import DataError
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.serving.tinker.host import ModelHost
from rlhfkit.serving.tinker.losses import TINKER_LOSSES, lookup_loss
from rlhfkit.serving.tinker.wire import WireDatum

LOGP = torch.tensor([-1.0, -2.0, -0.5])
Q = torch.tensor([-1.5, -2.0, -0.2])
ADV = torch.tensor([1.0, -1.0, 2.0])


def run(name, inputs, config=None):
    return float(TINKER_LOSSES[name].fn(LOGP, inputs, config or {})[0])


def test_cross_entropy_is_the_weighted_sum():
    assert run("cross_entropy", {"weights": torch.tensor([1.0, 0.0, 2.0])}) == pytest.approx(1.0 + 0.0 + 1.0)


def test_importance_sampling_by_hand():
    r = [math.exp(0.5), 1.0, math.exp(-0.3)]
    want = -(r[0] * 1.0 + r[1] * -1.0 + r[2] * 2.0)
    assert run("importance_sampling", {"logprobs": Q, "advantages": ADV}) == pytest.approx(want, rel=1e-6)


def test_ppo_clips_the_ratio_by_hand():
    # ratios e^0.5 = 1.65 (A=1: clipped to 1.2), 1 (A=-1), e^-0.3 = 0.74 (A=2: min(0.74*2, 0.8*2) = 1.48)
    want = -(1.2 * 1.0 + 1.0 * -1.0 + math.exp(-0.3) * 2.0)
    got = run("ppo", {"logprobs": Q, "advantages": ADV}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    assert got == pytest.approx(want, rel=1e-6)


def test_cispo_weights_logp_by_the_clipped_detached_ratio():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = TINKER_LOSSES["cispo"].fn(logp, {"logprobs": Q, "advantages": ADV}, {})
    w = torch.tensor([1.2, 1.0, 0.8])  # clip(e^0.5) = 1.2, 1, clip(e^-0.3 = 0.74) = 0.8
    assert float(loss) == pytest.approx(float(-(w * ADV * LOGP).sum()), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, -w * ADV)  # the weight carries no gradient


def test_gspo_token_ratio_is_the_sequence_ratio_with_each_tokens_gradient():
    # sequence log-ratio over the two marked tokens: mean(0.5, 0.0) = 0.25, s = e^0.25 = 1.284 (unclipped in
    # [0.8, 1.5]); every token's ratio is s, so the loss is -s * sum(A) and d loss / d logp_t = -s * A_t.
    logp = LOGP.clone().requires_grad_(True)
    inputs = {"logprobs": Q, "advantages": ADV, "sequence_ratio_mask": torch.tensor([1.0, 1.0, 0.0])}
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.5}
    loss, _ = TINKER_LOSSES["gspo"].fn(logp, inputs, config)
    s = math.exp(0.25)
    assert float(loss) == pytest.approx(-s * (1.0 - 1.0 + 2.0), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, -s * ADV)
    # clipped at 1.2: tokens with A > 0 lose their gradient, the A < 0 token keeps it (min picks s * A)
    logp.grad = None
    loss, _ = TINKER_LOSSES["gspo"].fn(logp, inputs, {})
    assert float(loss) == pytest.approx(-(1.2 * 1.0 + s * -1.0 + 1.2 * 2.0), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, s, 0.0]))
    per_token = TINKER_LOSSES["gspo"].elementwise(LOGP, inputs, {})
    assert per_token == pytest.approx([-1.2, s, -2.4], rel=1e-6)


def test_gspo_needs_marked_tokens():
    inputs = {"logprobs": Q, "advantages": ADV, "sequence_ratio_mask": torch.zeros(3)}
    with pytest.raises(DataError, match="sequence_ratio_mask marks no token"):
        TINKER_LOSSES["gspo"].fn(LOGP, inputs, {})


def test_dro_is_the_policy_gradient_with_a_quadratic_penalty_by_hand():
    # logp - q = (0.5, 0, -0.3): penalty 0.05 * 0.5 * (0.25 + 0 + 0.09) = 0.0085
    want = -((-1.0 * 1.0) + (-2.0 * -1.0) + (-0.5 * 2.0)) + 0.05 * 0.5 * (0.25 + 0.09)
    got = run("dro", {"logprobs": Q, "advantages": ADV}, {"beta": 0.05})
    assert got == pytest.approx(want, abs=1e-7)  # float32 sums of terms near 1 that cancel
    with pytest.raises(DataError, match="needs loss_fn_config"):
        run("dro", {"logprobs": Q, "advantages": ADV})


def test_unknown_loss_lists_the_served_ones():
    with pytest.raises(DataError, match="cross_entropy, importance_sampling, ppo, cispo, gspo, dro"):
        lookup_loss("stable_reinforce")


def grads_after(host, model_id, loss_fn, data):
    host.forward_backward(model_id, loss_fn, {}, data, forward_only=False)
    return [p.grad.clone() for p in host.models[model_id].learner.params]


@pytest.fixture
def full_host(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    return ModelHost(model, tok, "tiny", tmp_path, torch.device("cpu"), full=True), model


def reference_grads(model, tokens, targets, loss_of_logp):
    ref = tiny_model_and_tokenizer(seed=0)[0]
    ref.load_state_dict(model.state_dict())
    ref.train()
    total = 0
    for toks, tgt in zip(tokens, targets):
        logits = ref(input_ids=torch.tensor([toks])).logits[0]
        total = total + loss_of_logp(logprobs_from_logits(logits, torch.tensor(tgt)))
    total.backward()
    return [p.grad for p in ref.parameters()]


TOKENS = [[5, 6, 7, 8], [9, 10, 11]]
TARGETS = [[6, 7, 8, 9], [10, 11, 12]]


def test_cross_entropy_gradients_equal_rlhfkits_sft_loss(full_host):
    host, model = full_host
    model_id = host.create_model("s:train:0", None, seed=0)
    weights = [np.array([0, 1, 1, 1], np.float32), np.array([1, 1, 0], np.float32)]
    data = [WireDatum(t, {"target_tokens": np.array(g), "weights": w}) for t, g, w in zip(TOKENS, TARGETS, weights)]
    got = grads_after(host, model_id, "cross_entropy", data)
    masks = iter([torch.tensor(w) > 0 for w in weights])
    want = reference_grads(model, TOKENS, TARGETS, lambda lp: sft_loss(lp, next(masks), num_tokens=1.0)[0])
    for g, w in zip(got, want, strict=True):  # the host runs both data in one padded forward: float32 sums
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_importance_sampling_gradients_equal_rlhfkits_policy_gradient(full_host):
    host, model = full_host
    model_id = host.create_model("s:train:0", None, seed=0)
    q = [np.array([-3.0, -4.0, -4.5, -5.0], np.float32), np.array([-4.0, -4.2, -4.4], np.float32)]
    adv = [np.array([0.0, 1.0, 1.0, 1.0], np.float32), np.array([-0.5, -0.5, -0.5], np.float32)]
    data = [WireDatum(t, {"target_tokens": np.array(g), "logprobs": a, "advantages": b})
            for t, g, a, b in zip(TOKENS, TARGETS, q, adv)]
    got = grads_after(host, model_id, "importance_sampling", data)
    pairs = iter(zip(q, adv))

    def pg(lp):  # rlhfkit's policy loss, unclipped, summed over the tokens
        old, a = (torch.tensor(x) for x in next(pairs))
        return policy_loss(lp, old, a, torch.ones_like(lp, dtype=torch.bool), eps_low=1e9,
                           num_tokens=1.0)[0]
    want = reference_grads(model, TOKENS, TARGETS, pg)
    for g, w in zip(got, want, strict=True):  # the host runs both data in one padded forward: float32 sums
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_a_malformed_datum_leaves_the_accumulated_gradient_alone(full_host):
    host, _ = full_host
    model_id = host.create_model("s:train:0", None, seed=0)
    good = [WireDatum(TOKENS[0], {"target_tokens": np.array(TARGETS[0]), "weights": np.ones(4, np.float32)})]
    before = grads_after(host, model_id, "cross_entropy", good)
    bad = [good[0], WireDatum([5, 6], {"target_tokens": np.array([6, 200]), "weights": np.ones(2, np.float32)})]
    with pytest.raises(DataError, match="outside"):
        host.forward_backward(model_id, "cross_entropy", {}, bad, forward_only=False)
    for p, b in zip(host.models[model_id].learner.params, before, strict=True):
        torch.testing.assert_close(p.grad, b)
