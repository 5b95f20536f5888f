"""train sft's --data.truncation (verl's SFT data.truncation): an over-long sample skipped, refused, or its whole
token sequence cut on one side with its targets. The tiny tokenizer is one token per character (<eos> one token):
"abcd" + "xyz<eos>" is 8 tokens, 4 of them targets."""

import pytest

from rlhfkit.api.supervised import load_data
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.supervised import TextFormat, load_sft
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models.tiny import tiny_tokenizer

RECORDS = [{"input": "abcd", "output": "xyz"}, {"input": "ab", "output": "x"}]


def cut(truncation, max_len=6, records=RECORDS):
    tok = tiny_tokenizer()
    samples, skipped = load_sft(records, TextFormat(tok), max_len=max_len, truncation=truncation)
    return [(tok.decode(s.prompt_ids), tok.decode(s.response_ids), s.loss_mask.tolist(), s.index)
            for s in samples], skipped


def test_an_over_long_sample_is_skipped_or_cut_on_one_side_with_its_targets():
    short = ("ab", "x<eos>", [True, True], 1)  # 4 tokens: untouched
    assert cut("skip") == ([short], 1)
    # left keeps the last 6 of "abcdxyz<eos>": "cd" stays the prompt, the 4 targets whole
    assert cut("left") == ([("cd", "xyz<eos>", [True] * 4, 0), short], 0)
    # right keeps the first 6: the answer loses its last 2 tokens ("z<eos>")
    assert cut("right") == ([("abcd", "xy", [True, True], 0), short], 0)
    # cut to 3 on the right, "abcdxyz<eos>" keeps only prompt tokens: no target left, skipped and counted
    assert cut("right", 3) == ([("ab", "x", [True], 1)], 1)


def test_error_stops_at_the_first_over_long_sample_naming_its_record():
    with pytest.raises(DataError, match=r"record 0: the sample is 8 tokens, over --data.max_len 6 "
                                        r"\(--data.truncation error\)"):
        cut("error")


def test_verls_data_truncation_reaches_train_sfts_loader():
    cfg = SFTConfig.from_args(["data.truncation=left", "data.max_length=6", "data.prompt_key=input",
                               "data.response_key=output", "--data.apply_chat_template", "false"])
    assert cfg.data.truncation == "left"
    items, _, skipped = load_data("sft", cfg, tiny_tokenizer(), train_dataset=RECORDS)
    assert skipped == 0 and sorted(len(s.prompt_ids) + len(s.response_ids) for s in items) == [4, 6]


def test_what_cannot_be_cut_is_refused():
    with pytest.raises(ConfigError, match="--data.truncation: unknown value 'middle'"):
        SFTConfig.from_args(["--data.truncation", "middle"])
    with pytest.raises(ConfigError, match="--model.pretrain_mode_enable cuts each text"):
        SFTConfig.from_args(["--data.truncation", "left", "--model.pretrain_mode_enable"])
    cfg = SFTConfig.from_args(["--data.truncation", "right"])
    with pytest.raises(ConfigError, match="samples with images are not cut"):
        load_data("sft", cfg, tiny_tokenizer(), train_dataset=RECORDS, processor=object())
