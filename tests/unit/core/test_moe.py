"""The router's load-balancing loss: values and gradients worked by hand on a 2-expert toy, and the
same number as transformers' `aux_loss` (OpenRLHF's) on a tiny Mixtral."""

import math

import pytest
import torch

from rlhfkit.core.moe import load_balancing_loss


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
