"""HFEngine keeps an episode's KV cache across its turns (rollout.turns): a turn prefills only its new
tokens, and the tokens and logprobs equal those of a full prefill of the whole history, across
architectures, rows of different lengths, a prompt that does not extend its history, weight updates."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams, end_episodes, turn_kwargs
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.turns import KeptTurn, TurnCaches

from .conftest import STOP

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(STOP,))
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0)


def feedback(tok, turn: int, row: int) -> list[int]:
    """Row `row`'s feedback after turn `turn`: of a different length per row."""
    return tok(f" fb{turn}" * (row + 1), add_special_tokens=False)["input_ids"]


def play(engine, tok, prompts, params, turns=4, seeds=None, edit=None):
    """`turns` turns of one episode per prompt; `edit(turn, row, history)` may change a history before
    its turn. Returns per turn the trajectories, and the engine's prefilled tokens expected when every
    kept cache is used: each turn after the first prefills the action's last token and the feedback."""
    history, out, expected = [list(p) for p in prompts], [], sum(len(p) for p in prompts)
    for turn in range(turns):
        if edit is not None:
            history = [edit(turn, row, h) for row, h in enumerate(history)]
        kw = {} if seeds is None else {"seeds": [s + turn for s in seeds]}
        trajs = engine.generate(history, params, episode_keys=list(range(len(history))), **kw)
        out.append(trajs)
        for row, t in enumerate(trajs):
            history[row] = history[row] + t.response_ids.tolist() + feedback(tok, turn, row)
            if turn < turns - 1:
                expected += 1 + len(feedback(tok, turn, row))
    return out, expected


def assert_same(kept, plain, tol=1e-5):
    for turn_a, turn_b in zip(kept, plain):
        for a, b in zip(turn_a, turn_b):
            assert a.response_ids.tolist() == b.response_ids.tolist()
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=tol, rtol=0)
            assert a.finish_reason == b.finish_reason


@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3", "gpt_neox", "gpt2", "mixtral"])
def test_kept_turns_equal_the_full_prefill_and_prefill_only_the_new_tokens(arch):
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch)
    prompts = [tok(t)["input_ids"] for t in ["What is 2+3?", "1+1=", "Hello there, how are you?"]]
    kept_engine, plain_engine = HFEngine(model, tok), HFEngine(model, tok, keep_turns=False)
    kept, expected = play(kept_engine, tok, prompts, GREEDY)
    plain, _ = play(plain_engine, tok, prompts, GREEDY)
    assert_same(kept, plain)
    assert len({len(t.prompt_ids) for t in kept[-1]}) == len(prompts)  # rows of different history lengths
    if arch == "llama":  # and rows that left the batch at different steps (kept as they left)
        assert len({t.response_length for turn in kept for t in turn}) > 1
    assert kept_engine.prefilled_tokens == expected  # only the new tokens after the first turn
    full = sum(len(t.prompt_ids) for turn in plain for t in turn)
    assert plain_engine.prefilled_tokens == full and kept_engine.turns.reused_tokens == full - expected


def test_rows_that_stop_between_stop_checks_keep_only_what_they_ran(tiny, prompts, monkeypatch):
    """As on CUDA (a stop check every few steps): a finished row decodes on until the check; the tokens
    after its stop are not its own and must not be kept."""
    from rlhfkit.rollout import hf

    monkeypatch.setitem(hf.STOP_CHECK_EVERY, "cpu", 4)
    model, tok = tiny
    engine = HFEngine(model, tok)
    kept, expected = play(engine, tok, prompts, GREEDY)
    plain, _ = play(HFEngine(model, tok, keep_turns=False), tok, prompts, GREEDY)
    assert_same(kept, plain)
    assert any(0 < t.response_length < GREEDY.max_new_tokens - 1 for turn in kept for t in turn)
    assert engine.prefilled_tokens == expected


def test_sampled_turns_with_per_prompt_seeds_equal_the_full_prefill(tiny, prompts):
    model, tok = tiny
    seeds = [5, 6, 7]
    kept, _ = play(HFEngine(model, tok), tok, prompts, SAMPLED, seeds=seeds)
    plain, _ = play(HFEngine(model, tok, keep_turns=False), tok, prompts, SAMPLED, seeds=seeds)
    assert_same(kept, plain)


def test_a_prompt_that_does_not_extend_its_history_is_prefilled_in_full(tiny, prompts):
    model, tok = tiny

    def edit(turn, row, history):  # row 1's second turn rewrites a token its kept cache holds
        return history[:2] + [history[2] + 1] + history[3:] if (turn, row) == (1, 1) else history

    engine = HFEngine(model, tok)
    kept, expected = play(engine, tok, prompts, GREEDY, turns=2, edit=edit)
    plain, _ = play(HFEngine(model, tok, keep_turns=False), tok, prompts, GREEDY, turns=2, edit=edit)
    assert_same(kept, plain)
    row1 = kept[1][1].prompt_ids.tolist()
    # row 1 prefilled whole instead of its new tokens (its kept cache was dropped, not reused)
    assert engine.prefilled_tokens == expected + len(row1) - (1 + len(feedback(tok, 0, 1)))


def test_the_kept_caches_are_dropped_at_a_weight_update(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    engine.generate(prompts, GREEDY, episode_keys=[0, 1, 2])
    assert len(engine.turns.kept) == 3
    engine.update_weights({}, version=1)  # a shared module: its weights changed in place
    assert engine.turns.kept == {} and engine.turns.take(0, prompts[0] + [5, 5], 1) is None


def test_after_new_weights_the_next_turn_equals_a_fresh_engine_on_them(prompts):
    model, tok = tiny_model_and_tokenizer(seed=0)
    engine = HFEngine(model, tok)
    first = engine.generate(prompts, GREEDY, episode_keys=[0, 1, 2])
    history = [p + t.response_ids.tolist() + feedback(tok, 0, i) for i, (p, t) in enumerate(zip(prompts, first))]
    new = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    engine.update_weights(new, version=1)
    again = engine.generate(history, GREEDY, episode_keys=[0, 1, 2])
    fresh = HFEngine(model, tok, keep_turns=False).generate(history, GREEDY)
    assert engine.prefilled_tokens == sum(map(len, prompts)) + sum(map(len, history))  # nothing reused
    for a, b in zip(again, fresh):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.version == 1
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_a_weight_update_inside_a_sliced_generation_keeps_none_of_its_rows(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    gen = engine.start(prompts, SamplingParams(max_new_tokens=6, temperature=0.0), episode_keys=[0, 1, 2])
    assert engine.resume(gen, 2) is None
    engine.update_weights({}, version=1)
    engine.resume(gen)
    assert engine.turns.kept == {}  # its rows' caches mix the two versions' keys and values


def test_new_and_continuing_episodes_share_a_batch(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    [t] = engine.generate(prompts[:1], GREEDY, episode_keys=["a"])
    second = [prompts[0] + t.response_ids.tolist() + feedback(tok, 0, 0), prompts[1], prompts[2]]
    got = engine.generate(second, GREEDY, episode_keys=["a", "b", "c"])  # "b", "c": their first turn
    want = HFEngine(model, tok, keep_turns=False).generate(second, GREEDY)
    assert_same([got], [want])
    assert engine.turns.reused_tokens == len(prompts[0]) + t.response_length - 1


def test_finished_episodes_are_freed_and_the_cap_holds(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    engine.generate(prompts, GREEDY, episode_keys=[0, 1, 2])
    end_episodes(engine, [0, 2])
    assert list(engine.turns.kept) == [1]
    capped = HFEngine(model, tok, max_batch_tokens=len(prompts[0]) + 7)
    capped.generate(prompts[:1], GREEDY, episode_keys=[0])
    assert capped.turns.tokens <= len(prompts[0]) + 7


def test_the_hint_is_ignored_where_it_cannot_hold(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    engine.generate(prompts, SamplingParams(max_new_tokens=3, n=2), episode_keys=[0, 1, 2])  # n > 1
    assert engine.turns.kept == {}
    off = HFEngine(model, tok, keep_turns=False)
    assert turn_kwargs(off, [0]) == {} and turn_kwargs(engine, (0,)) == {"episode_keys": [0]}
    assert turn_kwargs(object(), [0]) == {}  # an engine without the hint (vLLM, remote workers)
    end_episodes(object(), [0])
    sliding, stok = tiny_model_and_tokenizer(seed=0, arch="mistral")  # sliding-window layers keep their own
    e = HFEngine(sliding, stok)
    e.generate(prompts, GREEDY, episode_keys=[0, 1, 2])
    assert e.turns.kept == {}


def test_turn_caches_by_hand():
    entry = KeptTurn([1, 2, 3], [], [], version=4)
    caches = TurnCaches(max_tokens=5)
    caches.put("a", entry)
    caches.put("b", KeptTurn([7, 8, 9], [], [], version=4))  # 3 + 3 > 5: not kept
    assert list(caches.kept) == ["a"] and caches.tokens == 3
    assert caches.take("a", [1, 2, 3], 4) is None  # no new token after it
    caches.put("a", entry)
    assert caches.take("a", [1, 2, 3, 4], 5) is None  # other weights
    caches.put("a", entry)
    assert caches.take("a", [1, 9, 3, 4], 4) is None and "a" not in caches.kept  # not a prefix: dropped
    caches.put("a", entry)
    assert caches.take("a", [1, 2, 3, 4], 4) is entry and caches.kept == {}


def test_the_flag_reaches_the_engine(tiny):
    from rlhfkit.api.engines import build_engine
    from rlhfkit.config import RLConfig

    model, tok = tiny
    on = RLConfig.from_args(["--actor.model_name_or_path", "tiny"])
    off = RLConfig.from_args(["--actor.model_name_or_path", "tiny", "--rollout.keep_kv_across_turns", "false"])
    assert on.rollout.keep_kv_across_turns and build_engine(model, tok, on).keeps_turns
    assert not build_engine(model, tok, off).keeps_turns
