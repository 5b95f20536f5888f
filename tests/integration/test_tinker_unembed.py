"""Tinker's `train_unembed` (the SDK's default): a LoRA adapter on the output layer beside the attention
and MLP ones, trained, saved and loaded back (training state and sampler weights); with
train_unembed=False the output layer has none. Through the official `tinker` SDK, as test_tinker_sdk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

tinker = pytest.importorskip("tinker")
pytest.importorskip("uvicorn")

from tests.integration.test_tinker_sdk import EXAMPLES, NAME, datum, served, sl_steps  # noqa: E402


@pytest.fixture
def server(tmp_path, monkeypatch):
    yield from served(tmp_path, monkeypatch)


def head_lora(server, model_id: str):
    """The LoRA B matrix of `model_id`'s adapter on the output layer, or None when it has none there."""
    head = server.host.peft.get_output_embeddings()
    b = getattr(head, "lora_B", {})
    return b[model_id].weight.detach().clone() if model_id in b else None


def logprobs(client, tokens):
    return client.forward([datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_train_unembed_puts_a_trained_adapter_on_the_output_layer_that_saves_and_loads(server, tmp_path):
    svc = server.client()
    tc = svc.create_lora_training_client(base_model=NAME, rank=4, seed=1)  # train_unembed=True by default
    off = svc.create_lora_training_client(base_model=NAME, rank=4, seed=1, train_unembed=False)
    tc, off = tc.result(), off.result()
    ids = {c: m for c, m in zip((tc, off), server.host.models)}
    assert head_lora(server, ids[off]) is None
    assert head_lora(server, ids[tc]).abs().max() == 0  # LoRA's B starts at zero
    sl_steps(tc, 3)
    assert head_lora(server, ids[tc]).abs().max() > 0  # the head's adapter trained
    want = logprobs(tc, EXAMPLES[0])

    state = tc.save_state("s").result().path
    again = svc.create_training_client_from_state(state).result()
    np.testing.assert_allclose(logprobs(again, EXAMPLES[0]), want, rtol=1e-5, atol=1e-6)
    sampler = tc.save_weights_for_sampler("w").result().path
    folder = Path(server.host.resolve(sampler)[0])
    assert "lm_head" in json.loads((folder / "adapter_config.json").read_text())["target_modules"]
    saved = safe_open(folder / "adapter_model.safetensors", "pt").keys()
    assert any("lm_head.lora_B" in k for k in saved) and not any("lm_head.weight" in k for k in saved)
    sc = svc.create_sampling_client(model_path=sampler)
    sc = sc.result() if hasattr(sc, "result") else sc
    prompt = tinker.types.ModelInput.from_ints(EXAMPLES[0])
    got = sc.compute_logprobs(prompt).result()[1:]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-4, atol=1e-5)
