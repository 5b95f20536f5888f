"""The router's load-balancing loss: values and gradients worked by hand on a 2-expert toy, and the
same number as transformers' `aux_loss` (OpenRLHF's) on a tiny Mixtral; routing replay's index math."""

import math

import pytest
import torch

from rlhfkit.core.moe import (
    changed_choices,
    expert_code_dtype,
    load_balancing_loss,
    merge_recorded,
    missing_code,
    replay_indices,
    replayed_weights,
    skip_code,
)


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_two_experts_top1_all_tokens_on_expert_0_by_hand():
    """Logits z1 = (1, 0), z2 = (2, 0): both tokens pick expert 0, f = (1, 0);
    p1 = (s(1), 1 - s(1)), p2 = (s(2), 1 - s(2)); loss = 2 * f . P = 2 * (s(1) + s(2)) / 2.
    d loss / d z_t = (E / N) p_t * (f - p_t . f) = (p_t0 (1 - p_t0), -p_t0 p_t1)."""
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0]], requires_grad=True)
    loss, m = load_balancing_loss([z], top_k=1)
    assert float(loss) == pytest.approx(sig(1) + sig(2), abs=1e-6)  # 1.6119
    loss.backward()
    expected = [[sig(1) * (1 - sig(1)), -sig(1) * (1 - sig(1))], [sig(2) * (1 - sig(2)), -sig(2) * (1 - sig(2))]]
    torch.testing.assert_close(z.grad, torch.tensor(expected), rtol=1e-5, atol=1e-7)  # 0.19661, 0.10499
    assert m["expert_load"].tolist() == [1.0, 0.0] and float(m["load_max"]) == 2.0


def test_balanced_routing_has_loss_k_and_no_gradient_from_the_counts():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)  # one token each: f = (1/2, 1/2)
    loss, m = load_balancing_loss([z], top_k=1)
    assert float(loss) == pytest.approx(1.0, abs=1e-6)  # 2 * (P_0 + P_1) / 2 = 1
    loss.backward()
    torch.testing.assert_close(z.grad, torch.zeros(2, 2), atol=1e-7, rtol=0)  # f - p.f = 0 for each token
    assert float(m["load_max"]) == 1.0


def test_padding_and_layers_by_hand():
    """Two layers, a masked third token: only tokens 1 and 2 count, in both layers (N * L = 4)."""
    a = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 9.0]])
    b = torch.tensor([[0.0, 1.0], [2.0, 0.0], [9.0, 0.0]])
    loss, m = load_balancing_loss([a, b], top_k=1, mask=torch.tensor([True, True, False]))
    f = torch.tensor([3 / 4, 1 / 4])  # layer a: 0, 0; layer b: 1, 0
    p = (torch.softmax(a[:2], -1).sum(0) + torch.softmax(b[:2], -1).sum(0)) / 4
    assert float(loss) == pytest.approx(float(2 * (f * p).sum()), abs=1e-6)
    assert m["expert_load"].tolist() == [0.75, 0.25]


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_it_is_transformers_aux_loss_on_a_tiny_moe_model(arch):
    from rlhfkit.models.tiny import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer(seed=0, arch=arch)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 0, 0]])
    am = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    out = model(input_ids=ids, attention_mask=am, output_router_logits=True)
    ours, _ = load_balancing_loss(out.router_logits, model.config.num_experts_per_tok, am.bool().reshape(-1))
    torch.testing.assert_close(ours, out.aux_loss.float(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ routing replay: the index math


def test_expert_codes_are_uint8_up_to_254_experts_and_int16_above():
    assert expert_code_dtype(128) == torch.uint8 and expert_code_dtype(254) == torch.uint8
    assert expert_code_dtype(256) == torch.int16  # DeepSeek-V3's routed experts
    assert (missing_code(torch.uint8), skip_code(torch.uint8)) == (255, 254)
    assert (missing_code(torch.int16), skip_code(torch.int16)) == (32767, 32766)


def test_replay_takes_the_recorded_experts_and_the_routers_own_elsewhere():
    own = torch.tensor([[0, 1], [2, 3], [1, 2]])
    codes = torch.tensor([[3, 2], [255, 255], [254, 254]], dtype=torch.uint8)  # recorded, missing, skipped
    idx, replayed, counted = replay_indices(own, codes)
    assert idx.tolist() == [[3, 2], [2, 3], [1, 2]] and idx.dtype == torch.long
    assert replayed.tolist() == [True, False, False] and counted.tolist() == [True, True, False]


def test_replayed_softmax_weights_by_hand():
    """logits (ln 1, ln 2, ln 3, ln 4): p = (.1, .2, .3, .4); experts (0, 2): (.1, .3), normalised (.25, .75)."""
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).log()
    idx = torch.tensor([[0, 2]])
    torch.testing.assert_close(replayed_weights(logits, idx, "softmax", False), torch.tensor([[0.1, 0.3]]))
    torch.testing.assert_close(replayed_weights(logits, idx, "softmax", True), torch.tensor([[0.25, 0.75]]))


def test_replayed_sigmoid_weights_by_hand():
    """logits (0, ln 3): sigmoid (1/2, 3/4); experts (1, 0) normalised: (.6, .4), times the scale 2.5."""
    logits = torch.tensor([[0.0, math.log(3.0)]])
    idx = torch.tensor([[1, 0]])
    torch.testing.assert_close(replayed_weights(logits, idx, "sigmoid", False), torch.tensor([[0.75, 0.5]]))
    torch.testing.assert_close(replayed_weights(logits, idx, "sigmoid", True, 2.5), torch.tensor([[1.5, 1.0]]))
    with pytest.raises(ValueError, match="softmax or sigmoid"):
        replayed_weights(logits, idx, "relu", True)


def test_a_changed_choice_is_a_different_set_of_experts():
    own = torch.tensor([[0, 1], [1, 0], [0, 2]])
    recorded = torch.tensor([[1, 0], [1, 0], [0, 3]], dtype=torch.uint8)
    assert changed_choices(own, recorded).tolist() == [False, False, True]


def test_merged_codes_keep_each_tokens_first_recorded_experts():
    """An episode's turns: turn 1 recorded tokens 0-1 (its last action token 2 never ran: missing); turn 2's
    call recorded tokens 1-4 (token 0 kept in the cache: missing there; token 1 computed again, routed
    otherwise: the first record stays) and the feedback token 5 after it never ran."""
    m, u8 = missing_code(torch.uint8), torch.uint8
    first = torch.tensor([[[0]], [[1]], [[m]]], dtype=u8)
    later = torch.tensor([[[m]], [[3]], [[2]], [[3]], [[1]]], dtype=u8)
    merged = merge_recorded(first, later, 6, u8)
    assert merged.reshape(-1).tolist() == [0, 1, 2, 3, 1, m]  # the trailing token: never computed
    assert merge_recorded(first, None, 2, u8).reshape(-1).tolist() == [0, 1]
    with pytest.raises(ValueError, match="both None"):
        merge_recorded(None, None, 2, u8)
