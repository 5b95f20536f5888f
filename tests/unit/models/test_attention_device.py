"""The shared-prefix attention switch (models.logprobs.attention_for) decides from where the model's
parameters are, not from the mask: the mask is always built on the CPU, so deciding from it ran every
GPU shared-prefix micro-batch with eager attention."""

from types import SimpleNamespace

import torch

from rlhfkit.models import logprobs as logprobs_module
from rlhfkit.models.tiny import tiny_model_and_tokenizer


def _model(device: str):
    model, _ = tiny_model_and_tokenizer()
    model.config._attn_implementation = "sdpa"
    return model.to(device) if device != "cpu" else model


def _attention_inside(model, rows: int = 8) -> str:
    mask = torch.ones((1, 1, rows, rows), dtype=torch.bool)  # built on the CPU, as data.packing does
    with logprobs_module.attention_for(model, SimpleNamespace(attention_mask=mask)):
        return model.config._attn_implementation


def test_a_model_on_the_cpu_runs_short_shared_prefix_rows_with_eager_attention():
    model = _model("cpu")
    assert logprobs_module.parameter_device_type(model) == "cpu"
    assert _attention_inside(model) == "eager"
    assert _attention_inside(model, rows=logprobs_module.EAGER_ROW_TOKENS + 1) == "sdpa"
    assert model.config._attn_implementation == "sdpa"  # restored


def test_a_model_off_the_cpu_keeps_sdpa_with_a_cpu_mask():
    # Parameters on the meta device stand for a GPU here: not "cpu", while the mask stays on the CPU.
    model = _model("meta")
    assert logprobs_module.parameter_device_type(model) == "meta"
    assert _attention_inside(model) == "sdpa"


def test_the_decision_reads_the_parameters_device_type(monkeypatch):
    model = _model("cpu")
    monkeypatch.setattr(logprobs_module, "parameter_device_type", lambda m: "cuda")
    assert _attention_inside(model) == "sdpa"


def test_checkpointing_is_read_without_transformers_deprecation_warning():
    import warnings

    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.precision import enable_gradient_checkpointing

    model = _model("cpu")
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert not logprobs_module.activation_checkpointing(model)
        enable_gradient_checkpointing(model)
        assert logprobs_module.activation_checkpointing(model)
        # the eager swap is off under checkpointing (the backward recomputes with the model's attention)
        assert _attention_inside(model) == "sdpa"
    peft_model = add_lora(model, rank=2, alpha=4, target_modules="all-linear")  # peft reads the old name itself
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert logprobs_module.activation_checkpointing(peft_model)
