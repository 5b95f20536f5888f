"""Every loader reads records from memory (a list of dicts, a datasets.Dataset / DatasetDict) as
it reads them from a file: the same examples, the same key checks, the same one-line errors
naming "record N" (numbered from 0)."""

import json

import pytest
import torch

from rlhfkit.data.prompts import load_prompts
from rlhfkit.data.records import read_records, source_name
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft, load_unpaired
from rlhfkit.errors import DataError
from rlhfkit.models import tiny_tokenizer

SFT = [{"input": "ab", "output": "c"}, {"input": "xyz", "output": "uv"}]
PAIRS = [{"prompt": "q", "chosen": "ab", "rejected": "c"}, {"prompt": "r", "chosen": "d", "rejected": "ef"}]
KTO = [{"prompt": "q", "output": "ab", "label": True}, {"prompt": "r", "output": "c", "label": False}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dataset(rows):
    import datasets

    return datasets.Dataset.from_list(rows)


def same_samples(a, b):
    """Token samples (or pairs / labeled samples) of two loads are equal field by field."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name, v in vars(x).items():
            w = getattr(y, name)
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, w), name
            elif hasattr(v, "__dict__"):
                same_samples([v], [w])
            else:
                assert v == w, name


# --------------------------------------------------------------------------- sources


def test_read_records_of_list_dataset_and_datasetdict_name_each_record():
    import datasets

    assert [(r.data, r.where) for r in read_records(SFT)] == [(SFT[0], "record 0"), (SFT[1], "record 1")]
    assert [r.data for r in read_records(dataset(SFT))] == SFT
    dd = datasets.DatasetDict({"train": dataset(SFT[:1]), "test": dataset(SFT[1:])})
    (test,) = read_records(dd, split="test")
    assert (test.data, test.where) == (SFT[1], "record 0 of split 'test'")
    assert source_name(SFT) == "in-memory list" and source_name(dd) == "in-memory DatasetDict"


@pytest.mark.parametrize("make", [list, dataset], ids=["list", "Dataset"])
def test_in_memory_sft_pairs_and_kto_equal_the_file(tmp_path, tok, make):
    fmt = TextFormat(tok, input_template="Q:{}")
    for rows, load in [(SFT, load_sft), (PAIRS, load_pairs), (KTO, load_unpaired)]:
        f = write(tmp_path / "d.jsonl", rows)
        from_file, _ = load(f, fmt, seed=3)
        from_memory, _ = load(make(rows), fmt, seed=3)
        same_samples(from_memory, from_file)


def test_in_memory_prompts_strings_and_message_lists(tok):
    rows = [{"input": "hi", "answer": 1}, {"input": [{"role": "user", "content": "yo"}], "answer": 2}]
    out = load_prompts(rows, label_key="answer", tokenizer=tok, apply_chat_template=True)
    assert [e.text for e in out] == ["user: hi<eos>assistant: ", "user: yo<eos>assistant: "]
    assert [(e.label, e.index, e.raw) for e in out] == [(1, 0, rows[0]), (2, 1, rows[1])]
    # a Dataset of conversations (arrow gives the message lists back as lists of dicts)
    conv = [{"input": [{"role": "user", "content": "hi"}]}]
    assert load_prompts(dataset(conv), tokenizer=tok, apply_chat_template=True)[0].text == out[0].text
    assert [e.text for e in load_prompts([{"input": "a"}, {"input": "b"}])] == ["a", "b"]


def test_datasetdict_split_is_taken_as_for_folders(tok):
    import datasets

    dd = datasets.DatasetDict({"train": dataset(SFT[:1]), "test": dataset(SFT[1:])})
    (s,), _ = load_sft(dd, TextFormat(tok))
    assert tok.decode(s.prompt_ids.tolist()) == "ab"
    (t,), _ = load_sft(dd, TextFormat(tok), split="test")
    assert tok.decode(t.prompt_ids.tolist()) == "xyz"
    with pytest.raises(DataError, match=r"^in-memory DatasetDict: no split 'validation'.*\['test', 'train'\]"):
        load_prompts(dd, split="validation")


# --------------------------------------------------------------------------- errors


def test_missing_key_names_record_and_flag(tok):
    with pytest.raises(DataError, match=r"^in-memory list, record 1: no key 'rejected' \(--data.rejected_key\); "
                                        r"the record has keys \['chosen', 'prompt'\]"):
        load_pairs([PAIRS[0], {"prompt": "r", "chosen": "d"}], TextFormat(tok))
    with pytest.raises(DataError, match=r"^in-memory Dataset, record 0: no key 'q' \(input_key\)"):
        load_prompts(dataset(SFT), input_key="q")


def test_bad_values_name_record_and_key(tok):
    with pytest.raises(DataError, match=r"^in-memory list, record 1, key 'label': expected true or false"):
        load_unpaired([KTO[0], {**KTO[1], "label": "no"}], TextFormat(tok))
    with pytest.raises(DataError, match=r"^in-memory list, record 0, key 'input': expected a string, got int"):
        load_prompts([{"input": 5}])


def test_empty_non_dict_and_unknown_sources_fail_in_one_line(tok):
    with pytest.raises(DataError, match=r"^in-memory list: the dataset is empty"):
        load_sft([], TextFormat(tok))
    with pytest.raises(DataError, match=r"^in-memory Dataset: the dataset is empty"):
        load_prompts(dataset(SFT).select([]))
    with pytest.raises(DataError, match=r"^in-memory list, record 1: expected a dict, got str"):
        load_prompts([{"input": "a"}, "b"])
    with pytest.raises(DataError, match=r"^in-memory dict: not a dataset; give a path"):
        load_prompts({"input": ["a", "b"]})
    with pytest.raises(DataError, match=r"^in-memory list: all 2 samples are longer than --data.max_len 1"):
        load_sft(SFT, TextFormat(tok), max_len=1)
    with pytest.raises(DataError, match=r"^in-memory list, record 0: no key 'output'") as info:
        load_sft([{"input": "a"}], TextFormat(tok))
    assert "\n" not in str(info.value)
