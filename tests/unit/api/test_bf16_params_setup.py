"""--actor.dtype bfloat16 under bf16 autocast: the builder keeps the norm weights and the residual
stream in float32 (models.precision), the matrices in bf16; other settings leave the model alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhfkit.api.builder import _bf16_matrices
from rlhfkit.models import tiny_model_and_tokenizer


def _cfg(dtype: str, autocast: str | None):
    return SimpleNamespace(actor=SimpleNamespace(dtype=dtype, autocast=autocast))


def _hidden_dtypes(model) -> set[torch.dtype]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=torch.tensor([[5, 6, 7, 8]]), output_hidden_states=True)
    return {h.dtype for h in out.hidden_states[:-1]}  # the residual sums (the last one is the final norm's)


def test_bf16_parameters_get_float32_norms_and_residual():
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.to(torch.bfloat16)
    _bf16_matrices(model, _cfg("bfloat16", "bfloat16"))
    assert {p.dtype for p in model.parameters() if p.dim() == 1} == {torch.float32}
    assert {p.dtype for p in model.parameters() if p.dim() == 2} == {torch.bfloat16}
    assert _hidden_dtypes(model) == {torch.float32}


@pytest.mark.parametrize("dtype,autocast", [("bfloat16", None), ("float32", "bfloat16")])
def test_other_settings_leave_the_model_as_loaded(dtype, autocast):
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    _bf16_matrices(model, _cfg(dtype, autocast))
    assert {p.dtype for p in model.parameters()} == {model.dtype}
    assert not model.get_input_embeddings()._forward_hooks
