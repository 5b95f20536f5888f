"""The decode loop copies nothing host -> device per token: with per-prompt seeds the uniforms of a
chunk are drawn once (`chunk_uniforms`) and copied once, so a longer generation makes no more `.to()`
calls from the loop and no more draws; on CUDA each per-step copy waited for the device."""

from __future__ import annotations

import sys

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout import decode_attention, kv_cache, prefill, sampling
from rlhfkit.rollout import hf as hf_module
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def setup():
    model, tok = tiny_model_and_tokenizer(seed=0)
    return model, tok, [tok(t)["input_ids"] for t in ("What is 2+3?", "1+1=", "abc")]


# the engine's own code: rollout/hf.py, its prefill (rollout/prefill.py) and the modules of its decode loop
ENGINE_FILES = {m.__file__ for m in (hf_module, prefill, sampling, kv_cache, decode_attention)}


def _counts(monkeypatch, engine, prompts, max_new: int) -> tuple[int, int]:
    """(`.to(device)` calls made by the engine's own code, torch.rand calls) during one seeded generate."""
    calls = {"to": 0, "rand": 0}
    to, rand = torch.Tensor.to, torch.rand

    def counting_to(self, *args, **kwargs):
        to_device = "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args)
        if to_device and sys._getframe(1).f_code.co_filename in ENGINE_FILES:  # not a dtype cast
            calls["to"] += 1
        return to(self, *args, **kwargs)

    def counting_rand(*args, **kwargs):
        calls["rand"] += 1
        return rand(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    monkeypatch.setattr(torch, "rand", counting_rand)
    try:
        params = SamplingParams(max_new_tokens=max_new, temperature=1.0, n=2)
        trajs = engine.generate(prompts, params, seeds=[1, 2, 3])
    finally:
        monkeypatch.undo()
    assert max(t.response_length for t in trajs) == max_new  # decoded to the end
    return calls["to"], calls["rand"]


def test_no_copy_or_draw_per_decoded_token(setup, monkeypatch):
    model, tok, prompts = setup
    engine = HFEngine(model, tok)
    short, long = _counts(monkeypatch, engine, prompts, 2), _counts(monkeypatch, engine, prompts, 10)
    assert short == long  # nothing per step
    assert long[1] == len(prompts)  # one draw per prompt per chunk


def test_one_draw_per_prompt_per_chunk(setup, monkeypatch):
    model, tok, prompts = setup
    engine = HFEngine(model, tok, max_batch_size=2)  # one prompt (n = 2 rows) per chunk
    assert _counts(monkeypatch, engine, prompts, 6)[1] == len(prompts)
