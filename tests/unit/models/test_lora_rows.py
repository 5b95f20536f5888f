"""Per-row LoRA adapters (models.lora_rows): one forward over rows of different adapters gives each
row what peft gives it with its own adapter active (the base alone for None), and a backward gives
each adapter the gradient of its own rows only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from rlhfkit.errors import ModelError
from rlhfkit.models.lora import add_adapter, add_lora
from rlhfkit.models.lora_rows import RowAdapters, runs
from rlhfkit.models.tiny import tiny_model_and_tokenizer

TARGETS = ("q_proj", "v_proj", "down_proj")


def two_adapters():
    """A tiny peft model with adapters one (rank 4, attention and MLP) and two (rank 2, attention only),
    their B matrices made non-zero so that each changes the output."""
    model, _ = tiny_model_and_tokenizer(seed=0)
    peft = add_lora(model, 4, 32, TARGETS, adapter_name="one")
    add_adapter(peft, "two", 2, 32, ("q_proj", "v_proj"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return peft


def adapter_params(peft, name: str) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in peft.named_parameters() if f".{name}." in n and "lora_" in n}


IDS = torch.tensor([[5, 6, 7, 8, 9], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34], [40, 41, 42, 43, 44]])
WEIGHTS = torch.linspace(-1.0, 1.0, 89)  # a loss that reaches every logit: sum(logits * w)


def alone(peft, name, rows):
    """Logits of `rows` of IDS with adapter `name` active in peft (None: adapters disabled)."""
    if name is None:
        with peft.disable_adapter():
            return peft(input_ids=IDS[rows]).logits
    peft.set_adapter(name)
    return peft(input_ids=IDS[rows]).logits


def test_runs_of_equal_names():
    assert runs(["a", "a", "b", None, None, "a"]) == [(0, 2, "a"), (2, 3, "b"), (3, 5, None), (5, 6, "a")]
    assert runs([]) == []


def test_a_mixed_batch_gives_each_row_its_own_adapters_logits_and_gradients():
    peft = two_adapters()
    names = ["one", "one", "two", None]
    with RowAdapters(peft, trainable=("one", "two")) as rows:
        rows.set_rows(names)
        mixed = peft(input_ids=IDS).logits
        (mixed * WEIGHTS).sum().backward()
    got = {name: {n: p.grad.clone() for n, p in adapter_params(peft, name).items()} for name in ("one", "two")}
    assert all(float(g.abs().max()) > 0 for grads in got.values() for g in grads.values())
    peft.zero_grad(set_to_none=True)

    for name, rows in (("one", [0, 1]), ("two", [2]), (None, [3])):
        want = alone(peft, name, rows)
        torch.testing.assert_close(mixed[rows], want, rtol=1e-5, atol=1e-6)
        if name is None:
            continue
        (want * WEIGHTS).sum().backward()
        for n, p in adapter_params(peft, name).items():
            torch.testing.assert_close(got[name][n], p.grad, rtol=1e-5, atol=1e-7)
        peft.zero_grad(set_to_none=True)
    # the rows really differ by adapter: one's rows under two would not give these logits
    assert not torch.allclose(mixed[:2], alone(peft, "two", [0, 1]), atol=1e-4)


def test_only_the_trainable_adapters_get_gradients_and_flags_are_restored():
    peft = two_adapters()
    peft.set_adapter("two")  # peft's own flags: two trainable, one frozen
    flags = {n: p.requires_grad for n, p in peft.named_parameters()}
    with RowAdapters(peft, trainable=("one",)) as rows:
        rows.set_rows(["one", "two", "two", "one"])
        loss = (peft(input_ids=IDS).logits * WEIGHTS).sum()
        torch.autograd.backward(loss, inputs=list(adapter_params(peft, "one").values()))
    assert all(p.grad is not None for p in adapter_params(peft, "one").values())
    assert all(p.grad is None for p in adapter_params(peft, "two").values())
    assert {n: p.requires_grad for n, p in peft.named_parameters()} == flags
    assert "forward" not in vars(next(m for m in peft.modules() if hasattr(m, "lora_A")))


def test_a_batch_of_the_wrong_size_is_refused():
    peft = two_adapters()
    with RowAdapters(peft) as rows, pytest.raises(ModelError, match="4 rows, 3 adapters"):
        rows.set_rows(["one", "two", "one"])
        peft(input_ids=IDS)
