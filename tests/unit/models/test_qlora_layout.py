"""QLoRA's 4-bit layers keep one layout on the CPU (`models.loading.keep_4bit_layout`): bitsandbytes would
repack a layer's weight in place at its first no-grad forward on a CPU with AVX512-BF16 (this project's
machine has it), after which no gradient reaches the layer's input and every `state_dict()` moves the
frozen base. Each test runs a no-grad forward first, as a rollout does before the update. On a CPU
without AVX512-BF16 bitsandbytes never repacks, and these tests pass with or without the setting."""

import pytest
import torch

from rlhfkit.models.loading import load_causal_lm

bnb = pytest.importorskip("bitsandbytes")


def dequantized(layer) -> torch.Tensor:
    return bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)


def test_the_gradient_reaches_a_4bit_layers_input_after_a_no_grad_forward(tiny_folder):
    model = load_causal_lm(tiny_folder, load_in_4bit=True)
    layer = model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, bnb.nn.Linear4bit)
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = layer(x)
    layer.train()
    x.requires_grad_(True)
    layer(x).sum().backward()
    # y = x W^T with W the dequantized weight: d(sum y)/dx = ones @ W, the column sums of W
    w = dequantized(layer)
    torch.testing.assert_close(x.grad, w.sum(0).expand(3, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(before, x.detach() @ w.T, atol=1e-5, rtol=1e-5)


def test_state_dict_leaves_the_frozen_4bit_base_as_it_was(tiny_folder):
    model = load_causal_lm(tiny_folder, load_in_4bit=True)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        first = model(ids).logits
    layer = model.model.layers[0].self_attn.q_proj
    w = dequantized(layer)
    model.state_dict()  # what a checkpoint or a weight sync does
    assert torch.equal(dequantized(layer), w)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, first)
