"""load_prompts: every source kind, keys, templates, shuffling and the error messages."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlhfkit.data import PromptExample, load_prompts
from rlhfkit.errors import ConfigError, DataError

RECORDS = [
    {"input": "What is 2+3?", "answer": "5"},
    {"input": "What is 4*4?", "answer": "16"},
    {"input": "What is 9-10?", "answer": "-1"},
]


class FakeTokenizer:
    """Records each call and renders messages as '<role>content' + '<assistant>'."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict], dict]] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return body + ("<assistant>" if kwargs.get("add_generation_prompt") else "")


def tiny_tokenizer():
    """A real transformers tokenizer built locally (one-word vocabulary, no chat template)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, "[UNK]")))


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- sources


def test_jsonl_reads_text_label_raw_and_index(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS)
    out = load_prompts(path, label_key="answer")
    assert out == [
        PromptExample(text=r["input"], label=r["answer"], raw=r, index=i)
        for i, r in enumerate(RECORDS)
    ]


def test_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"input": "a"}\n\n   \n{"input": "b"}\n', encoding="utf-8")
    assert [e.text for e in load_prompts(path)] == ["a", "b"]
    assert [e.label for e in load_prompts(path)] == [None, None]


def test_json_list_and_data_wrapper(tmp_path):
    plain = tmp_path / "a.json"
    plain.write_text(json.dumps(RECORDS), encoding="utf-8")
    wrapped = tmp_path / "b.json"
    wrapped.write_text(json.dumps({"data": RECORDS}), encoding="utf-8")
    lines = tmp_path / "c.json"  # JSON Lines named .json, which datasets' json loader (OpenRLHF's) reads
    lines.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    for path in (plain, wrapped, lines):
        out = load_prompts(path, label_key="answer")
        assert [(e.text, e.label) for e in out] == [(r["input"], r["answer"]) for r in RECORDS]
    lines.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(RECORDS[1])[:-1] + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.json, line 2: not valid JSON"):
        load_prompts(lines)


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path)
    out = load_prompts(path, label_key="answer")
    assert [(e.text, e.label, e.index) for e in out] == [
        (r["input"], r["answer"], i) for i, r in enumerate(RECORDS)
    ]


def test_csv_and_arrow_files_as_openrlhf_reads_them(tmp_path):
    import datasets
    import pyarrow as pa

    csv = tmp_path / "p.csv"
    csv.write_text('input,answer\nWhat is 2+3?,5\n"a, b",16\n"caf\u00e9 \u03c0",-1\n', encoding="utf-8")
    out = load_prompts(csv, label_key="answer")
    assert [(e.text, e.label) for e in out] == [("What is 2+3?", 5), ("a, b", 16), ("caf\u00e9 \u03c0", -1)]
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "ds"))  # an Arrow stream inside
    (arrow,) = (tmp_path / "ds").glob("*.arrow")
    table = pa.Table.from_pylist(RECORDS)
    with pa.ipc.new_file(tmp_path / "f.arrow", table.schema) as writer:  # the Arrow file format
        writer.write_table(table)
    for path in (arrow, tmp_path / "f.arrow"):
        assert [(e.text, e.label) for e in load_prompts(path, label_key="answer")] == [
            (r["input"], r["answer"]) for r in RECORDS]
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(DataError, match=r"bad\.arrow: cannot read as arrow \(ArrowInvalid"):
        load_prompts(tmp_path / "bad.arrow")


def test_hf_folder_dataset_and_datasetdict_split(tmp_path):
    import datasets

    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(RECORDS[:2]),
            "test": datasets.Dataset.from_list(RECORDS[2:]),
        }
    ).save_to_disk(str(tmp_path / "dict"))

    assert [e.text for e in load_prompts(tmp_path / "single")] == [r["input"] for r in RECORDS]
    assert [e.text for e in load_prompts(tmp_path / "dict")] == [r["input"] for r in RECORDS[:2]]
    test = load_prompts(tmp_path / "dict", label_key="answer", split="test")
    assert [(e.text, e.label) for e in test] == [("What is 9-10?", "-1")]
    with pytest.raises(DataError, match=r"no split 'validation'.*\['test', 'train'\]"):
        load_prompts(tmp_path / "dict", split="validation")


def test_folder_that_is_not_a_dataset(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(DataError, match="neither a HF datasets folder written by save_to_disk nor a folder"):
        load_prompts(tmp_path / "junk")


# --------------------------------------------------------------------------- errors


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "a"}\n{"input": "b"}\n{"input": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl, line 3: not valid JSON"):
        load_prompts(path)


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: expected a JSON object, got list"):
        load_prompts(path)


def test_missing_input_key_names_key_file_line_and_existing_keys(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": "a"}, {"question": "b", "id": 7}])
    with pytest.raises(DataError) as info:
        load_prompts(path)
    msg = str(info.value)
    assert "p.jsonl, line 2" in msg
    assert "'input'" in msg and "input_key" in msg
    assert "['id', 'question']" in msg


def test_missing_label_key_in_json_names_record(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"input": "a", "answer": 1}, {"input": "b"}]), encoding="utf-8")
    with pytest.raises(DataError, match=r"p\.json, record 1: no key 'answer' \(label_key\).*\['input'\]"):
        load_prompts(path, label_key="answer")


def test_a_dotted_label_key_reads_verls_nested_ground_truth(tmp_path):
    """verl's parquet rows: the prompt a message list, the answer in reward_model.ground_truth."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlhfkit.data.prompts import check_prompts

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"{i}+1="}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(3)]
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = load_prompts(path, "prompt", "reward_model.ground_truth", FakeTokenizer(), apply_chat_template=True)
    assert [(e.text, e.label) for e in out] == [(f"<user>{i}+1=<assistant>", str(i + 1)) for i in range(3)]
    assert out[0].raw["extra_info"] == {"index": 0}
    # a column whose own name has a dot wins over the nested path
    flat = load_prompts([{"input": "a", "x.y": "flat", "x": {"y": "nested"}}], label_key="x.y")
    assert flat[0].label == "flat"
    with pytest.raises(DataError, match=r"verl\.parquet, record 0: no key 'reward_model\.answer' \(label_key\): "
                                        r"reward_model has keys \['ground_truth', 'style'\]"):
        check_prompts(path, "prompt", "reward_model.answer", apply_chat_template=True)
    with pytest.raises(DataError, match=r"in-memory list, record 1: no key 'x\.y' \(label_key\): x has a str"):
        check_prompts([{"input": "a", "x": {"y": 1}}, {"input": "b", "x": "z"}], label_key="x.y")


def test_an_empty_prompt_is_refused_unless_a_template_gives_it_text():
    from rlhfkit.data.prompts import check_prompts

    rows = [{"input": "a"}, {"input": ""}]
    with pytest.raises(DataError, match=r"in-memory list, record 1, key 'input': an empty prompt"):
        check_prompts(rows)
    assert [e.text for e in load_prompts(rows, input_template="Q: {}")] == ["Q: a", "Q: "]
    assert len(load_prompts(rows, tokenizer=FakeTokenizer(), apply_chat_template=True)) == 2


def test_a_builtin_verifier_needs_a_label_in_every_kept_record():
    from rlhfkit.data.prompts import check_prompts

    rows = [{"input": "a", "answer": "1"}, {"input": "b", "answer": None}]
    flag = "--reward.remote_url builtin:math"
    assert check_prompts(rows, label_key="answer") == 2  # another reward may take a null label
    assert check_prompts(rows, label_key="answer", labels_for=flag, max_samples=1) == 1
    with pytest.raises(DataError, match=r"record 1, key 'answer' \(--data.label_key\): null, and --reward.remote_url "
                                        r"builtin:math needs each prompt's reference answer"):
        check_prompts(rows, label_key="answer", labels_for=flag)
    with pytest.raises(ConfigError, match=r"builtin:math scores each response .*set --data.label_key"):
        check_prompts(rows, labels_for=flag)


def test_missing_key_is_found_even_past_max_samples(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": "a"}, {"inp": "b"}])
    with pytest.raises(DataError, match="line 2"):
        load_prompts(path, max_samples=1)


@pytest.mark.parametrize("content", ["", "\n\n", "[]", '{"data": []}'])
def test_empty_dataset(tmp_path, content):
    suffix = ".json" if content.startswith(("[", "{")) else ".jsonl"
    path = tmp_path / f"empty{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="empty"):
        load_prompts(path)


def test_non_utf8_jsonl_names_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"input": "ok"}\n{"input": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl, line 2: bytes that are not UTF-8"):
        load_prompts(path)


def test_non_utf8_json_names_line(tmp_path):
    path = tmp_path / "latin.json"
    path.write_bytes(b'[\n{"input": "ok"},\n{"input": "caf\xe9"}\n]')
    with pytest.raises(DataError, match=r"latin\.json, line 3: bytes that are not UTF-8"):
        load_prompts(path)


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    """Files saved by Windows editors start with a BOM, which json.loads refuses."""
    bom = "\ufeff".encode()
    (tmp_path / "a.jsonl").write_bytes(bom + b'{"input": "x"}\n{"input": "y"}\n')
    (tmp_path / "b.json").write_bytes(bom + b'[{"input": "x"}, {"input": "y"}]')
    for name in ("a.jsonl", "b.json"):
        assert [e.text for e in load_prompts(tmp_path / name)] == ["x", "y"]
    (tmp_path / "c.jsonl").write_bytes(b'{"input": "x"}\n' + bom + b'{"input": "y"}\n')  # only at the start
    with pytest.raises(DataError, match=r"c\.jsonl, line 2: not valid JSON"):
        load_prompts(tmp_path / "c.jsonl")


def test_a_lone_surrogate_escape_names_its_line_and_a_pair_reads(tmp_path):
    """"\\ud83d" alone (an emoji cut in half) made the tokenizer raise a TypeError from inside."""
    (tmp_path / "a.jsonl").write_text('{"input": "ok \\ud83d\\ude00"}\n{"input": "cut \\ud83d"}\n')
    (tmp_path / "b.json").write_text('[{"input": "ok \\ud83d\\ude00"}, {"input": "cut \\uD83D"}]')
    with pytest.raises(DataError, match=r"a\.jsonl, line 2: a lone UTF-16 surrogate escape \(\\ud83d\)"):
        load_prompts(tmp_path / "a.jsonl")
    with pytest.raises(DataError, match=r"b\.json, record 1: a lone UTF-16 surrogate escape"):
        load_prompts(tmp_path / "b.json")
    (tmp_path / "c.jsonl").write_text('{"input": "ok \\ud83d\\ude00"}\n')
    assert [e.text for e in load_prompts(tmp_path / "c.jsonl")] == ["ok \U0001F600"]


def test_json_of_wrong_shape(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"rows": []}', encoding="utf-8")
    with pytest.raises(DataError, match="expected a JSON list"):
        load_prompts(path)


def test_missing_path_and_unknown_suffix(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_prompts(tmp_path / "nope.jsonl")
    sheet = tmp_path / "p.xlsx"
    sheet.write_bytes(b"PK")
    with pytest.raises(DataError, match=r"unsupported file type '\.xlsx'; use one of .jsonl, .json, .parquet, .csv"):
        load_prompts(sheet)


def test_non_string_input_without_chat_template(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match="apply_chat_template=True"):
        load_prompts(path)
    path = write_jsonl(tmp_path / "q.jsonl", [{"input": 5}])
    with pytest.raises(DataError, match=r"line 1, key 'input': expected a string, got int"):
        load_prompts(path)


# --------------------------------------------------------------------------- templates


def test_input_template(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    out = load_prompts(path, input_template="Question: {}\nAnswer:")
    assert out[0].text == "Question: What is 2+3?\nAnswer:"


def test_input_template_keeps_braces_in_the_prompt(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": "f(x) = {x}"}])
    assert load_prompts(path, input_template="Q: {}")[0].text == "Q: f(x) = {x}"


@pytest.mark.parametrize("template", ["no slot", "Q: {} {}", "Q: {name}", "{"])
def test_bad_input_template(tmp_path, template):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    with pytest.raises(ConfigError, match="input_template"):
        load_prompts(path, input_template=template)


def test_chat_template_wraps_a_string(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    tok = FakeTokenizer()
    out = load_prompts(path, tokenizer=tok, apply_chat_template=True)
    assert out[0].text == "<user>What is 2+3?<assistant>"
    messages, kwargs = tok.calls[0]
    assert messages == [{"role": "user", "content": "What is 2+3?"}]
    assert kwargs == {"tokenize": False, "add_generation_prompt": True}


def test_chat_template_uses_a_message_list_directly(tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": msgs}])
    tok = FakeTokenizer()
    assert load_prompts(path, tokenizer=tok, apply_chat_template=True)[0].text == (
        "<system>Be brief.<user>Hi<assistant>"
    )
    assert tok.calls[0][0] == msgs


def test_chat_template_with_a_real_tokenizer(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    out = load_prompts(path, tokenizer=tok, apply_chat_template=True)
    assert out[0].text == "<|user|>What is 2+3?\n<|assistant|>"


def test_chat_template_failure_names_the_record(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = "{{ raise_exception('no system turns here') }}"  # a template that refuses these messages
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    msg = r"p\.jsonl, line 1, key 'input': the tokenizer's chat template failed \(.*no system turns here"
    with pytest.raises(DataError, match=msg):
        load_prompts(path, tokenizer=tok, apply_chat_template=True)


def test_template_and_chat_template_together_is_a_config_error(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    with pytest.raises(ConfigError, match="choose one"):
        load_prompts(path, tokenizer=FakeTokenizer(), apply_chat_template=True, input_template="{}")


def test_chat_template_without_tokenizer_is_a_config_error(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS[:1])
    with pytest.raises(ConfigError, match="needs a tokenizer"):
        load_prompts(path, apply_chat_template=True)
    base = tiny_tokenizer()  # no chat template, as a base model's tokenizer: the failure was the first record's
    with pytest.raises(ConfigError, match=r"--data.apply_chat_template: the tokenizer has no chat template .* "
                                          r"--data.input_template"):
        load_prompts(path, tokenizer=base, apply_chat_template=True)


# --------------------------------------------------------------------------- order


def test_shuffle_is_seeded_local_and_truncates_after(tmp_path):
    records = [{"input": f"q{i}"} for i in range(20)]
    path = write_jsonl(tmp_path / "p.jsonl", records)
    random.seed(123)
    before = random.random()
    random.seed(123)

    a = load_prompts(path, shuffle_seed=7)
    b = load_prompts(path, shuffle_seed=7)
    c = load_prompts(path, shuffle_seed=8)
    assert random.random() == before  # the global RNG was not drawn from

    expected = list(range(20))
    random.Random(7).shuffle(expected)
    assert [e.index for e in a] == expected
    assert [e.text for e in a] == [f"q{i}" for i in expected]
    assert [e.index for e in a] == [e.index for e in b] != [e.index for e in c]

    cut = load_prompts(path, shuffle_seed=7, max_samples=5)
    assert [e.index for e in cut] == expected[:5]
    assert [e.index for e in load_prompts(path, max_samples=3)] == [0, 1, 2]
    assert len(load_prompts(path, max_samples=100)) == 20


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_max_samples(tmp_path, bad):
    path = write_jsonl(tmp_path / "p.jsonl", RECORDS)
    with pytest.raises(ConfigError, match="max_samples"):
        load_prompts(path, max_samples=bad)
