"""check_prompts (the checks of load_prompts without a tokenizer), message-list prompts, folders of
data files, and hub dataset names read offline from a hub cache laid out by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfkit.data.prompts import check_prompts, load_prompts
from rlhfkit.data.records import is_hub_dataset_name, read_records
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft
from rlhfkit.errors import DataError
from rlhfkit.models import tiny_model_and_tokenizer

CHAT = [
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}], "answer": "1"},
    {"messages": [{"role": "user", "content": "Q2"}], "answer": "2"},
    {"messages": "Q3 as a plain string", "answer": "3"},
]


class FakeTokenizer:
    """Renders messages as '<role>content' + '<assistant>'."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def offline_caches(tmp_path, monkeypatch):
    """An empty hub cache and datasets cache under tmp_path, read offline (what HF_HOME=tmp_path and
    HF_HUB_OFFLINE=1 give a fresh process; here the libraries are already imported)."""
    import datasets
    from huggingface_hub import constants

    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return hub


def gsm_like_repo(folder: Path) -> Path:
    """A hub dataset repo as gsm8k lays it out: configs main and socratic (README), train and test."""
    for config in ("main", "socratic"):
        (folder / config).mkdir(parents=True)
        for split, n in (("train", 3), ("test", 2)):
            rows = [{"question": f"{config} {split} {i}", "answer": str(i)} for i in range(n)]
            pq.write_table(pa.Table.from_pylist(rows), folder / config / f"{split}-00000-of-00001.parquet")
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
        f"  - split: test\n    path: {c}/test-*\n" for c in ("main", "socratic"))
    (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# a gsm8k-like dataset\n")
    return folder


# --------------------------------------------------------------------------- message lists


def test_message_lists_render_with_the_chat_template(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    out = load_prompts(path, input_key="messages", label_key="answer", tokenizer=FakeTokenizer(),
                       apply_chat_template=True)
    assert [e.text for e in out] == ["<system>S<user>Q1<assistant>", "<user>Q2<assistant>",
                                     "<user>Q3 as a plain string<assistant>"]
    assert [e.label for e in out] == ["1", "2", "3"]


def test_check_prompts_counts_what_load_prompts_builds(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    opts = dict(input_key="messages", label_key="answer", apply_chat_template=True)
    assert check_prompts(path, **opts) == 3
    assert check_prompts(path, **opts, max_samples=2, shuffle_seed=1) == 2
    assert len(load_prompts(path, tokenizer=FakeTokenizer(), **opts, max_samples=2, shuffle_seed=1)) == 2


@pytest.mark.parametrize("fn", [check_prompts, load_prompts])
def test_message_list_without_chat_template_says_to_add_the_flag(tmp_path, fn):
    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    with pytest.raises(DataError) as info:
        fn(path, input_key="messages")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}, line 1, key 'messages': a message list")
    assert "add --data.apply_chat_template" in msg


def test_check_prompts_checks_types_of_the_kept_records_as_load_prompts_does(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": "ok"}, {"input": 42}])
    assert check_prompts(path, max_samples=1) == 1 == len(load_prompts(path, max_samples=1))
    for fn in (check_prompts, load_prompts):
        with pytest.raises(DataError, match=r"line 2, key 'input': expected a string, got int"):
            fn(path)
    with pytest.raises(DataError, match=r"line 2, key 'input': expected a string or a list of"):
        check_prompts(path, apply_chat_template=True)


def test_check_prompts_needs_no_tokenizer_but_load_prompts_does(tmp_path):
    from rlhfkit.errors import ConfigError

    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    assert check_prompts(path, input_key="messages", apply_chat_template=True) == 3
    with pytest.raises(ConfigError, match="needs a tokenizer with apply_chat_template"):
        load_prompts(path, input_key="messages", apply_chat_template=True)


def test_sft_and_pairs_message_lists_without_chat_template_say_to_add_the_flag(tmp_path):
    _, tok = tiny_model_and_tokenizer(seed=0)
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"messages": conv}])
    with pytest.raises(DataError, match="key 'messages': a message list.*add --data.apply_chat_template"):
        load_sft(sft, TextFormat(tok), input_key="messages")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"chosen": conv, "rejected": conv[:1] + [
        {"role": "assistant", "content": "no"}]}])
    with pytest.raises(DataError, match="key 'chosen': a message list.*add --data.apply_chat_template"):
        load_pairs(pairs, TextFormat(tok), prompt_key=None)
    (sample,), _ = load_sft(sft, TextFormat(tok, apply_chat_template=True), input_key="messages")
    assert sample.loss_mask.any()


# --------------------------------------------------------------------------- folders of data files


def test_folder_of_data_files_reads_splits_configs_and_data_dir(tmp_path, offline_caches):
    repo = gsm_like_repo(tmp_path / "gsm")
    test = load_prompts(repo, input_key="question", label_key="answer", config="main", split="test")
    assert [(e.text, e.label) for e in test] == [("main test 0", "0"), ("main test 1", "1")]
    assert len(read_records(repo, config="socratic")) == 3
    with pytest.raises(DataError, match=r"Config name is missing.*\['main', 'socratic'\]"):
        read_records(repo)


# --------------------------------------------------------------------------- hub names


@pytest.mark.parametrize("name,hub", [
    ("openai/gsm8k", True), ("gsm8k", True), ("org/name@main", True), ("org/my.data-set_2", True),
    ("./prompts", False), ("/data/prompts", False), ("~/prompts", False), ("data/sub/prompts", False),
    ("prompts.jsonl", False), ("org/p.parquet", False), ("org/na me", False),
])
def test_which_names_are_hub_dataset_names(name, hub):
    assert is_hub_dataset_name(name) is hub


def test_hub_dataset_read_offline_from_the_hub_cache(tmp_path, offline_caches, hub_repo):
    hub_repo(offline_caches, "dataset", "org/gsm", gsm_like_repo(tmp_path / "src"))
    train = load_prompts("org/gsm", input_key="question", label_key="answer", config="main")
    assert [e.text for e in train] == ["main train 0", "main train 1", "main train 2"]
    test = check_prompts("org/gsm", input_key="question", config="socratic", split="test")
    assert test == 2
    with pytest.raises(DataError, match=r"dataset 'org/gsm': ValueError: Unknown split \"dev\""):
        read_records("org/gsm", split="dev", config="main")


def test_hub_dataset_data_dir_and_openrlhf_at_spelling(tmp_path, offline_caches, hub_repo):
    src = tmp_path / "src"
    for sub, n in (("easy", 2), ("hard", 4)):
        (src / sub).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([{"input": f"{sub} {i}"} for i in range(n)]),
                       src / sub / "train-00000-of-00001.parquet")
    hub_repo(offline_caches, "dataset", "org/levels", src)
    assert len(read_records("org/levels", data_dir="hard")) == 4
    assert [r.data["input"] for r in read_records("org/levels@easy")] == ["easy 0", "easy 1"]


def test_a_local_path_wins_over_a_hub_name(tmp_path, offline_caches, hub_repo, monkeypatch):
    hub_repo(offline_caches, "dataset", "org/gsm", gsm_like_repo(tmp_path / "src"))
    (tmp_path / "cwd" / "org" / "gsm").mkdir(parents=True)
    write_jsonl(tmp_path / "cwd" / "org" / "gsm" / "p.jsonl", [{"input": "local"}])
    monkeypatch.chdir(tmp_path / "cwd")
    assert [r.data for r in read_records("org/gsm")] == [{"input": "local"}]


def test_missing_hub_dataset_offline_is_one_line_saying_how_to_fetch_it(offline_caches):
    with pytest.raises(DataError) as info:
        check_prompts("rlhfkit-test/no-such-dataset")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("dataset 'rlhfkit-test/no-such-dataset': no local file or folder of that name, "
                          "and it is not in the Hugging Face cache (HF_HUB_OFFLINE is set")
    assert "`hf download --repo-type dataset rlhfkit-test/no-such-dataset`" in msg
    assert "unset HF_HUB_OFFLINE" in msg


def test_a_missing_path_is_still_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file or folder"):
        check_prompts(tmp_path / "nope.jsonl")
