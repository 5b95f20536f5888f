"""The compiled decode step's inputs keep few shapes and one address per layer: the static cache length
is bucketed, the rows bucketed to powers of two, and the key/value buffers reused by every chunk and row
drop. On CUDA each new (shape, address) of the step's static inputs records a new CUDA graph; here the
step is the eager model (the compiled step's inputs without the compile) and the signatures it sees
stand for the recordings."""

from __future__ import annotations

import torch

import rlhfkit.models.compile as compile_module
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.static_cache import (
    STATIC_LENGTH_BUCKET,
    StaticBuffers,
    static_cache_length,
)

STOP = 13  # some rows of the tiny model (seed 0) stop early, so rows are dropped


def test_cache_length_is_bucketed():
    assert STATIC_LENGTH_BUCKET == 256
    assert static_cache_length(10, 20) == 256 and static_cache_length(200, 56) == 256
    assert static_cache_length(200, 57) == 512


def test_buffers_are_reused_for_fewer_rows_and_grown_only_when_needed():
    buffers = StaticBuffers()
    k, _ = buffers.place(0, torch.ones(4, 2, 8, 3), torch.ones(4, 2, 8, 3))
    address = k.data_ptr()
    k2, _ = buffers.place(0, torch.full((2, 2, 8, 3), 2.0), torch.zeros(2, 2, 8, 3))
    assert k2.data_ptr() == address and k2.shape[0] == 2 and bool((k2 == 2).all())
    assert buffers.allocations == 1
    buffers.place(0, torch.ones(8, 2, 8, 3), torch.ones(8, 2, 8, 3))  # more rows: a new buffer
    assert buffers.allocations == 2


def test_chunks_and_row_drops_reuse_one_buffer_per_layer(tiny, monkeypatch):
    model, tok = tiny
    seen = []

    def step(m, **kwargs):  # the compiled step's inputs, stepped eagerly
        keys = kwargs["past_key_values"].layers[0].keys
        seen.append((tuple(kwargs["input_ids"].shape), tuple(keys.shape), keys.data_ptr()))
        return compile_module._call(m, **kwargs)

    monkeypatch.setattr(compile_module, "compile_decode_step", lambda m, on_cpu=False: step)
    engine = HFEngine(model, tok, compile_decode=True, max_batch_size=6)  # two chunks of 2 prompts x 3
    prompts = [tok(t)["input_ids"] for t in ("What is 2+3?", "1+1=", "Hello there, how are you?", "abc")]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, stop_token_ids=(STOP,))
    trajs = engine.generate(prompts, params, seeds=[5, 6, 7, 8])
    trajs += engine.generate(prompts[::-1], params, seeds=[1, 2, 3, 4])  # other widths per chunk
    assert any(t.finish_reason == "stop" for t in trajs)
    assert {address for _, _, address in seen} == {seen[0][2]}  # one address for every step
    assert {shape[2] for _, shape, _ in seen} == {256}  # one cache length
    rows = {shape[0] for _, shape, _ in seen}
    assert rows <= {6, 4, 2}  # powers of two after drops
    layers = len(model.model.layers)
    assert engine.static_buffers.allocations == layers  # allocated once per layer
    eager = HFEngine(model, tok, max_batch_size=6)
    want = eager.generate(prompts, params, seeds=[5, 6, 7, 8]) + eager.generate(prompts[::-1], params,
                                                                               seeds=[1, 2, 3, 4])
    assert [t.response_ids.tolist() for t in trajs] == [t.response_ids.tolist() for t in want]
