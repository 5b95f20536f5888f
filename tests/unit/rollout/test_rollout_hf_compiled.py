"""HFEngine's decode paths besides the default eager loop: the compiled decode step over a static
KV cache (`compile_decode=True`; on the CPU only with `compile_on_cpu=True`), its fallbacks, one
compiled step per model, and the stop check every k steps (what CUDA uses): each must give the eager
loop's tokens, logprobs, lengths and finish reasons."""

from __future__ import annotations

import logging

import pytest
import torch

from rlhfkit.data.batch import collate
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models.compile import has_cxx
from rlhfkit.rollout import hf, static_cache
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from tests.unit.rollout.conftest import STOP

PARAMS = [
    SamplingParams(max_new_tokens=10, temperature=0.0),
    SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(STOP,)),
    SamplingParams(max_new_tokens=8, temperature=1.0, n=3, stop_token_ids=(STOP,)),
]


def _same(a, b, logprob_tol=1e-5):  # batch shapes change float summation order
    assert [t.response_ids.tolist() for t in a] == [t.response_ids.tolist() for t in b]
    assert [t.finish_reason for t in a] == [t.finish_reason for t in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=logprob_tol, rtol=0)


@pytest.mark.parametrize("params", PARAMS)
def test_stop_check_every_k_steps_equals_every_step(tiny, prompts, params, monkeypatch):
    """Rows that stopped between two checks keep decoding until the check; their extra tokens are dropped."""
    model, tok = tiny
    every = HFEngine(model, tok).generate(prompts, params, seeds=[5, 6, 7])
    monkeypatch.setitem(hf.STOP_CHECK_EVERY, "cpu", 3)
    shapes = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(kw["input_ids"].shape[0]),
                                             with_kwargs=True)
    try:
        sparse = HFEngine(model, tok).generate(prompts, params, seeds=[5, 6, 7])
    finally:
        handle.remove()
    _same(every, sparse)
    if params.stop_token_ids and params.n == 1:
        # rows leave at the checks after steps 2, 5, 8: row 1 (stopped at step 0) after step 2, row 0 after step 5
        assert shapes == [3, 3, 3, 2, 2, 2, 1, 1, 1, 1]


def test_nan_probabilities_raise(prompts):
    model, tok = tiny_model_and_tokenizer(seed=0)
    with torch.no_grad():
        model.lm_head.weight[5] = float("nan")
    with pytest.raises(RuntimeError, match="inf, nan"):
        HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=3, temperature=1.0),
                                      torch.Generator().manual_seed(0))


def test_static_cache_layers_hold_the_dynamic_cache_rows():
    """The static layer's first `length` positions equal DynamicLayer's cache through prefill, decode
    steps, row expansion and row dropping."""
    from transformers.cache_utils import DynamicLayer

    g = torch.Generator().manual_seed(0)
    static, ref = static_cache.static_layer_class()(max_cache_len=8), DynamicLayer()
    for (rows, n), act in [((2, 3), None), ((6, 1), ("repeat", 3)), ((6, 1), None), ((3, 1), ("select", [0, 2, 5]))]:
        if act is not None:
            for layer in (static, ref):
                if act[0] == "repeat":
                    layer.batch_repeat_interleave(act[1])
                else:
                    layer.batch_select_indices(torch.tensor(act[1]))
        k, v = torch.randn(rows, 2, n, 4, generator=g), torch.randn(rows, 2, n, 4, generator=g)
        static.update(k, v)
        ref.update(k, v)
        length = ref.keys.shape[-2]
        assert static.keys.shape == (rows, 2, 8, 4) and static.batch_size == rows
        assert torch.equal(static.keys[:, :, :length], ref.keys)
        assert torch.equal(static.values[:, :, :length], ref.values)


def test_static_cache_support_refuses_sliding_windows(caplog):
    from rlhfkit.models.tiny import tiny_config

    config = tiny_config()
    model = type("M", (), {"config": config})()
    assert static_cache.static_cache_support(model)
    config.sliding_window, config.layer_types = 4, ["sliding_attention"] * config.num_hidden_layers
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        assert not static_cache.static_cache_support(model)
    assert "decodes eagerly" in caplog.text


def test_compile_decode_without_a_compiler_falls_back_with_one_line(tiny, prompts, monkeypatch, caplog):
    import rlhfkit.models.compile as compile_module

    model, tok = tiny
    monkeypatch.setattr(compile_module, "has_cxx", lambda: False)
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        engine = HFEngine(model, tok, compile_decode=True, compile_on_cpu=True)
    assert engine._compiled_step is None
    assert caplog.text.count("no C++ compiler") == 1
    _same(engine.generate(prompts, PARAMS[1]), HFEngine(model, tok).generate(prompts, PARAMS[1]))


def test_compile_decode_is_off_on_the_cpu_with_one_line(tiny, prompts, caplog):
    model, tok = tiny
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        engine = HFEngine(model, tok, compile_decode=True)
    assert engine._compiled_step is None and caplog.text.count("off on the CPU") == 1
    _same(engine.generate(prompts, PARAMS[2], seeds=[5, 6, 7]),
          HFEngine(model, tok).generate(prompts, PARAMS[2], seeds=[5, 6, 7]), logprob_tol=0)


@pytest.mark.skipif(not has_cxx(), reason="torch.compile's CPU backend needs a C++ compiler")
def test_one_compiled_step_per_model_no_recompile_for_new_engines_or_finished_rows(prompts, monkeypatch):
    """Dynamo (its eager backend: the trace without inductor's compile) traces the step once: not
    again for a second engine, nor as rows finish (9 rows -> 8 -> 4 -> 2), nor for new samples."""
    from torch._dynamo.utils import counters

    import rlhfkit.models.compile as compile_module

    model, tok = tiny_model_and_tokenizer(seed=0)  # a model no other test compiled
    compiles = []
    real_compile = torch.compile
    monkeypatch.setattr(compile_module.torch, "compile",
                        lambda fn, **kw: compiles.append(fn) or real_compile(fn, backend="eager", **kw))
    first = HFEngine(model, tok, compile_decode=True, compile_on_cpu=True)
    second = HFEngine(model, tok, compile_decode=True, compile_on_cpu=True)
    assert first._compiled_step is second._compiled_step and len(compiles) == 1
    other = tiny_model_and_tokenizer(seed=1)[0]
    assert HFEngine(other, tok, compile_decode=True, compile_on_cpu=True)._compiled_step is not first._compiled_step
    first.generate(prompts, PARAMS[2], seeds=[5, 6, 7])
    traced = counters["frames"]["ok"]
    for engine, seeds in ((second, [5, 6, 7]),
                          (HFEngine(model, tok, compile_decode=True, compile_on_cpu=True), [8, 9, 1])):
        trajs = engine.generate(prompts, PARAMS[2], seeds=seeds)
        assert any(t.finish_reason == "stop" for t in trajs)  # rows left the batch
        _same(trajs, HFEngine(model, tok).generate(prompts, PARAMS[2], seeds=seeds))
    assert counters["frames"]["ok"] == traced
    assert len(compiles) == 2  # the other model's


def test_bucketed_rows_keep_a_power_of_two_of_at_least_two():
    alive = torch.tensor([False, True, False, False, True, False, True, False, False])
    keep = alive.nonzero().squeeze(-1)
    assert static_cache.bucketed_rows(keep, alive).tolist() == [0, 1, 4, 6]  # 3 decoding rows + 1 finished
    one = torch.tensor([False, False, True])
    assert static_cache.bucketed_rows(one.nonzero().squeeze(-1), one).tolist() == [0, 2]
    # no fewer: all
    assert static_cache.bucketed_rows(torch.tensor([0]), torch.tensor([True, False])).tolist() == [0, 1]


def test_compile_error_at_the_first_step_falls_back_with_one_line(tiny, prompts, monkeypatch, caplog):
    """A failing compiled step: one line, then the eager forward over the same static cache."""
    import rlhfkit.models.compile as compile_module

    def broken(model, **kwargs):
        raise RuntimeError("inductor: CppCompileError\ndetails")

    model, tok = tiny
    monkeypatch.setattr(compile_module, "compile_decode_step", lambda m, on_cpu=False: broken)
    engine = HFEngine(model, tok, compile_decode=True)
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        trajs = engine.generate(prompts, PARAMS[2], seeds=[5, 6, 7])
    assert engine._compiled_step is None and caplog.text.count("torch.compile failed (RuntimeError") == 1
    _same(trajs, HFEngine(model, tok).generate(prompts, PARAMS[2], seeds=[5, 6, 7]), logprob_tol=1e-5)


def test_static_cache_eager_step_equals_the_growing_cache(tiny, prompts, monkeypatch):
    """The static cache and its full-length mask, stepped by the eager model (the compiled step's
    inputs without the compile): the growing cache's tokens and logprobs."""
    import rlhfkit.models.compile as compile_module

    model, tok = tiny
    monkeypatch.setattr(compile_module, "compile_decode_step", lambda m, on_cpu=False: compile_module._call)
    for params in PARAMS:
        _same(HFEngine(model, tok, compile_decode=True).generate(prompts, params, seeds=[5, 6, 7]),
              HFEngine(model, tok).generate(prompts, params, seeds=[5, 6, 7]), logprob_tol=1e-5)


@pytest.mark.slow  # the first compile of the tiny model's step: ~1 min on 2 idle cores
@pytest.mark.skipif(not has_cxx(), reason="torch.compile's CPU backend needs a C++ compiler")
def test_compiled_decode_greedy_equals_model_generate_and_logprobs_the_trainer(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok, compile_decode=True, compile_on_cpu=True)
    assert engine._compiled_step is not None
    for params in PARAMS:
        trajs = engine.generate(prompts, params, seeds=[5, 6, 7])
        _same(trajs, HFEngine(model, tok).generate(prompts, params, seeds=[5, 6, 7]), logprob_tol=1e-6)
        with torch.no_grad():
            ref, _ = response_logprobs(model, collate(trajs, tok.pad_token_id), temperature=params.temperature or 1.0)
        for i, t in enumerate(trajs):
            torch.testing.assert_close(t.logprobs, ref[i, : t.response_length], atol=1e-4, rtol=0)
    assert engine._compiled_step is not None  # no fallback happened
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    tok.padding_side = "right"
    expected = model.generate(**enc, max_new_tokens=10, do_sample=False)[:, enc["input_ids"].shape[1]:]
    greedy = engine.generate(prompts, PARAMS[0])
    assert [t.response_ids.tolist() for t in greedy] == expected.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_decode_on_cuda_equals_the_cpu_loop(prompts):
    """CUDA graphs (reduce-overhead) over the static cache, stop checks every 8 steps: the CPU's tokens."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    expected = HFEngine(model, tok).generate(prompts, PARAMS[1])
    engine = HFEngine(model.to("cuda"), tok, compile_decode=True)
    for _ in range(2):  # the second call replays the recorded graphs
        trajs = engine.generate(prompts, PARAMS[1])
        _same(trajs, expected, logprob_tol=1e-4)
    assert engine._compiled_step is not None


def test_flag_reaches_the_engine(tiny):
    from rlhfkit.api.engines import build_engine
    from rlhfkit.config import RLConfig

    model, tok = tiny
    cfg = RLConfig.from_args(["--actor.model_name_or_path", "tiny", "--rollout.compile_decode", "true"])
    assert cfg.rollout.compile_decode
    assert not RLConfig.from_args(["--actor.model_name_or_path", "tiny"]).rollout.compile_decode
    engine = build_engine(model, tok, cfg)
    assert engine._compiled_step is None  # off on the CPU (see the test above)
