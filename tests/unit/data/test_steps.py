"""Step-labelled data (data/steps.py): labels at the placeholder tokens, worked out by hand on the
character-level tiny tokenizer (one token per character)."""

import pytest
import torch

from rlhfkit.data.steps import (
    Placeholder,
    collate_steps,
    encode_steps,
    label_targets,
    load_steps,
    placeholder_of,
    single_token_id,
)
from rlhfkit.data.supervised import TextFormat, render_reward
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import tiny_tokenizer

TOK = tiny_tokenizer()
HASH = TOK.convert_tokens_to_ids("#")


def test_labels_become_the_probability_of_a_good_step():
    assert label_targets(["+", "-", "+"], ("+", "-"), "r") == [1.0, 0.0, 1.0]
    assert label_targets([0.25, 1, 0], ("+", "-"), "r") == [0.25, 1.0, 0.0]
    for bad in (["?"], [1.5], [True], [], "+"):
        with pytest.raises(DataError):
            label_targets(bad, ("+", "-"), "r")


def test_targets_sit_at_the_placeholders():
    # "1+1=2#3#": the placeholders are characters 5 and 7
    s = encode_steps(TOK, "1+1=2#3#", ["+", "-"], HASH, ("+", "-"), "record 0")
    assert s.input_ids.tolist() == TOK("1+1=2#3#", add_special_tokens=False)["input_ids"]
    assert s.step_mask.nonzero().flatten().tolist() == [5, 7]
    assert s.targets.tolist() == [0, 0, 0, 0, 0, 1, 0, 0]
    soft = encode_steps(TOK, "ab#c#", [0.5, 0.75], HASH, ("+", "-"), "record 0")
    assert soft.targets.tolist() == [0, 0, 0.5, 0, 0.75]


def test_a_sample_without_placeholder_or_with_other_label_counts_is_refused():
    with pytest.raises(DataError, match="record 3: no placeholder token"):
        encode_steps(TOK, "1+1=2", ["+"], HASH, ("+", "-"), "record 3")
    with pytest.raises(DataError, match="2 placeholder tokens but 1 labels"):
        encode_steps(TOK, "a#b#", ["+"], HASH, ("+", "-"), "record 3")


def test_tokens_must_be_single_tokens():
    assert single_token_id(TOK, "#", "--data.placeholder_token") == HASH
    with pytest.raises(ConfigError, match="--data.reward_tokens 'ok' is 2 tokens"):
        single_token_id(TOK, "ok", "--data.reward_tokens")


def test_load_and_collate():
    rows = [{"input": "ab#", "label": ["+"]}, {"input": "a#bc#", "label": [0.0, 1.0]},
            {"input": "a" * 30 + "#", "label": ["-"]}]
    samples, skipped = load_steps(rows, TextFormat(TOK), "#", ("+", "-"), max_len=10)
    assert skipped == 1 and len(samples) == 2
    b = collate_steps(samples, TOK.pad_token_id)
    assert b.input_ids.shape == (2, 5)
    assert b.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert b.step_mask.tolist() == [[False, False, True, False, False], [False, True, False, False, True]]
    assert b.targets[b.step_mask].tolist() == [1.0, 0.0, 1.0]
    assert b.input_ids[0, 3:].tolist() == [TOK.pad_token_id] * 2
    with pytest.raises(ConfigError, match="--data.placeholder_token '' encodes to no token"):
        load_steps(rows, TextFormat(TOK), "", ("+", "-"))
    with pytest.raises(DataError, match="record 0: no placeholder token"):  # "##" is two tokens, not in "ab#"
        load_steps(rows, TextFormat(TOK), "##", ("+", "-"))


def test_reward_template_renders_the_score_with_two_decimals():
    assert render_reward("{input} <rm_score>: {reward} ", "2+3=", 5) == "2+3= <rm_score>: 5.00 "
    assert render_reward("[{reward}] {input}", "q", -0.125) == "[-0.12] q"
    with pytest.raises(DataError, match="expected a number"):
        render_reward("{input}{reward}", "q", "high")


def test_conditional_sft_puts_the_score_in_the_prompt():
    from rlhfkit.data.supervised import load_sft

    rows = [{"input": "q", "output": "a", "reward": 1}]
    (s,), _ = load_sft(rows, TextFormat(TOK), reward_template="{input}={reward}:")
    assert TOK.decode(s.prompt_ids) == "q=1.00:"
    with pytest.raises(DataError, match="--data.reward_key"):
        load_sft([{"input": "q", "output": "a"}], TextFormat(TOK), reward_template="{input}{reward}")
    assert torch.equal(s.loss_mask, torch.tensor([True, True]))


def test_a_placeholder_of_several_tokens_is_matched_as_a_sequence_and_scored_at_its_last_token():
    ph = placeholder_of(TOK, "#%", "--data.placeholder_token")
    assert ph.ids == tuple(TOK("#%", add_special_tokens=False)["input_ids"]) and len(ph.ids) == 2
    # "1+1=2#%3#%": the placeholders end at characters 6 and 9; a lone "#" or "%" is no placeholder
    s = encode_steps(TOK, "1+1=2#%3#%", ["+", "-"], ph, ("+", "-"), "record 0")
    assert s.step_mask.nonzero().flatten().tolist() == [6, 9]
    assert s.targets.tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    with pytest.raises(DataError, match="1 placeholder tokens but 2 labels"):
        encode_steps(TOK, "1#2%3#%", ["+", "-"], ph, ("+", "-"), "record 1")
    samples, _ = load_steps([{"input": "ab#%c#%", "label": [1.0, 0.0]}], TextFormat(TOK), "#%", ("+", "-"))
    assert samples[0].step_mask.nonzero().flatten().tolist() == [3, 6]


def test_placeholder_matches_do_not_overlap_and_take_either_variant():
    ph = Placeholder(ids=(7, 9), variants=((5, 9), (7, 9)))  # a bare form and a space-merged form
    assert ph.ends([1, 5, 9, 7, 9, 9, 7]) == [2, 4]
    assert Placeholder((4, 4), ((4, 4),)).ends([4, 4, 4, 4, 4]) == [1, 3]


@pytest.mark.slow
def test_math_shepherds_placeholder_in_smollm2s_tokenizer():
    from transformers import AutoTokenizer

    from rlhfkit.models.loading import materialize_smollm2

    tok = AutoTokenizer.from_pretrained(materialize_smollm2())
    ph = placeholder_of(tok, "ки", "--data.placeholder_token")
    bare = tuple(tok("ки", add_special_tokens=False)["input_ids"])
    spaced = tuple(tok(" ки", add_special_tokens=False)["input_ids"])
    assert len(bare) == len(spaced) == 2 and ph.ids == spaced and set(ph.variants) == {bare, spaced}
    text = "2+3=5 ки\n5*2=11 ки"
    raw = tok(text, add_special_tokens=False)["input_ids"]
    s = encode_steps(tok, text, ["+", "-"], ph, ("+", "-"), "record 0")
    ends = s.step_mask.nonzero().flatten().tolist()
    assert len(ends) == 2 and all(tuple(raw[e - 1 : e + 1]) == spaced for e in ends)
    assert s.targets[ends].tolist() == [1.0, 0.0]
