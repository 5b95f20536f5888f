"""bf16 parameters with float32 masters (trainers.learner), float32 norms
(models.precision.vectors_to_float32) and a float32 residual stream (models.precision.float32_residual),
under bf16 autocast, learn as float32 parameters under bf16 autocast do: on a tiny Llama the losses
of 20 AdamW steps agree within 0.01 and the masters end within 5% of the distance the float32 run
moved; the norm weights the forward reads move as the float32 run's do, where in bf16 they would not
move at all at this learning rate; the residual stream is float32."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.precision import float32_residual, vectors_to_float32
from rlhfkit.trainers.learner import Learner


@pytest.fixture(scope="module")
def tiny():
    model, _ = tiny_model_and_tokenizer(seed=0, tie_embeddings=True, init_std=0.02)
    return model


def _ids(model):
    return torch.randint(3, model.config.vocab_size, (8, 24), generator=torch.Generator().manual_seed(1))


def _train(model, mode: str, lr: float, steps: int):
    """`steps` AdamW steps of next-token cross-entropy on a fixed batch, bf16 autocast. mode: fp32
    (float32 parameters), bf16 (bf16 parameters), bf16+norms (bf16 matrices, float32 vectors),
    bf16+norms+residual (the same with the residual stream in float32)."""
    model = copy.deepcopy(model).train()
    if mode != "fp32":
        model.to(torch.bfloat16)
    if mode.startswith("bf16+norms"):
        assert vectors_to_float32(model) > 0
    if mode == "bf16+norms+residual":
        assert float32_residual(model)
    learner = Learner(model, lr=lr, betas=(0.9, 0.95), max_norm=1.0)
    ids, losses = _ids(model), []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        learner.backward(loss)
        learner.step()
        losses.append(loss.item())
    return model, learner, losses


def _flat(tensors):
    return torch.cat([t.detach().float().flatten() for t in tensors])


def test_vectors_to_float32_moves_only_the_1d_parameters(tiny):
    model = copy.deepcopy(tiny).to(torch.bfloat16)
    moved = vectors_to_float32(model)
    assert moved == sum(1 for p in model.parameters() if p.dim() == 1)  # 2 norms per layer + the final norm
    assert all(p.dtype == (torch.float32 if p.dim() == 1 else torch.bfloat16) for p in model.parameters())


def test_bf16_masters_learn_as_float32_parameters(tiny):
    init = _flat(tiny.parameters())
    _, ref, ref_losses = _train(tiny, "fp32", lr=1e-3, steps=20)
    _, bf16, losses = _train(tiny, "bf16+norms", lr=1e-3, steps=20)
    assert ref_losses[-1] < ref_losses[0] - 0.5  # it learned
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 0.01
    moved = (_flat(ref.train_params) - init).norm()
    assert (_flat(bf16.train_params) - _flat(ref.train_params)).norm() < 0.05 * moved


def test_norm_weights_move_in_the_forward_only_in_float32(tiny):
    """lr 1e-4 for 10 steps moves a norm weight of 1.0 by ~1e-3, under half its bf16 spacing (2^-7)."""
    norms = [n for n, p in tiny.named_parameters() if p.dim() == 1]
    init = {n: p.detach().clone() for n, p in tiny.named_parameters()}
    runs = {mode: dict(_train(tiny, mode, lr=1e-4, steps=10)[0].named_parameters()) for mode in
            ("fp32", "bf16", "bf16+norms")}
    for n in norms:
        step = runs["fp32"][n].detach() - init[n]
        assert step.abs().max() > 5e-4
        assert torch.equal(runs["bf16"][n].detach().float(), init[n])  # rounded back to where it started
        assert (runs["bf16+norms"][n].detach() - init[n] - step).norm() < 0.1 * step.norm()


def test_the_residual_stream_stays_float32_under_autocast(tiny):
    """bf16 matrices under autocast: with `float32_residual` every hidden state (the sum the layers add
    into) is float32, as over float32 parameters; without it the embedding's bf16 output makes it bf16."""
    ids = _ids(tiny)[:2]
    dtypes = {}
    for residual in (False, True):
        model = copy.deepcopy(tiny).to(torch.bfloat16)
        vectors_to_float32(model)
        if residual:
            assert float32_residual(model) and not float32_residual(model)  # added once
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        dtypes[residual] = {h.dtype for h in hidden[:-1]}  # the last one is the final norm's output
    assert dtypes == {False: {torch.bfloat16}, True: {torch.float32}}


def test_bf16_masters_with_a_float32_residual_learn_as_float32_parameters(tiny):
    init = _flat(tiny.parameters())
    _, ref, ref_losses = _train(tiny, "fp32", lr=1e-3, steps=20)
    _, bf16, losses = _train(tiny, "bf16+norms+residual", lr=1e-3, steps=20)
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 0.01
    moved = (_flat(ref.train_params) - init).norm()
    assert (_flat(bf16.train_params) - _flat(ref.train_params)).norm() < 0.05 * moved
