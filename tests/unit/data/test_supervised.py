"""SFT / preference / KTO dataset tokenization: which tokens are targets, and errors."""

import json

import pytest
import torch

from rlhfkit.data.packing import pack
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft, load_unpaired
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def text(tok, ids):
    return tok.decode(ids.tolist(), skip_special_tokens=False)


def test_plain_input_output_targets_the_output_and_eos(tmp_path, tok):
    f = write(tmp_path / "d.jsonl", [{"q": "1+1=", "a": "2"}])
    (s,), skipped = load_sft(f, TextFormat(tok, input_template="Q:{}"), input_key="q", output_key="a")
    assert skipped == 0
    assert text(tok, s.prompt_ids) == "Q:1+1="
    assert s.response_ids.tolist() == [tok.convert_tokens_to_ids("2"), tok.eos_token_id]
    assert s.loss_mask.tolist() == [True, True]


def test_multi_turn_chat_targets_every_assistant_turn_only(tmp_path, tok):
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "no"}]
    f = write(tmp_path / "c.jsonl", [{"messages": conv}])
    (s,), _ = load_sft(f, TextFormat(tok, apply_chat_template=True), input_key="messages", output_key=None)
    # template: "role: content<eos>" per turn, generation prompt "assistant: "
    assert text(tok, s.prompt_ids) == "user: hi<eos>assistant: "
    targets = "".join(tok.convert_ids_to_tokens(s.response_ids[s.loss_mask].tolist()))
    ignored = "".join(tok.convert_ids_to_tokens(s.response_ids[~s.loss_mask].tolist()))
    assert targets == "yo<eos>no<eos>"
    assert ignored == "user: ok?<eos>assistant: "
    # the output_key default ("output") is absent from every record: conversations are detected
    (s2,), _ = load_sft(f, TextFormat(tok, apply_chat_template=True), input_key="messages")
    assert torch.equal(s2.loss_mask, s.loss_mask)


def test_pairs_from_strings_and_from_conversations_agree(tmp_path, tok):
    fmt = TextFormat(tok, apply_chat_template=True)
    f1 = write(tmp_path / "p.jsonl", [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}])

    def conv(a):
        return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": a}]

    f2 = write(tmp_path / "m.jsonl", [{"chosen": conv("4"), "rejected": conv("5")}])
    (a,), _ = load_pairs(f1, fmt)
    (b,), _ = load_pairs(f2, fmt, prompt_key=None)
    for x, y in [(a.chosen, b.chosen), (a.rejected, b.rejected)]:
        assert torch.equal(x.prompt_ids, y.prompt_ids) and torch.equal(x.response_ids, y.response_ids)
    assert "".join(tok.convert_ids_to_tokens(a.chosen.response_ids.tolist())) == "4<eos>"


def test_trl_conversational_data_with_an_explicit_prompt_keeps_the_prompt(tmp_path, tok):
    """TRL's conversational preference, prompt-completion and unpaired formats: the prompt is a message
    list and the answer its own list of assistant turns; each sample is the prompt's turns then the answer's,
    the same tokens as the string record {"prompt": "2+2?", "chosen": "4"} gives."""
    fmt = TextFormat(tok, apply_chat_template=True)
    user, four, five = ([{"role": r, "content": c}] for r, c in
                        [("user", "2+2?"), ("assistant", "4"), ("assistant", "5")])
    f1 = write(tmp_path / "p.jsonl", [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}])
    f2 = write(tmp_path / "trl.jsonl", [{"prompt": user, "chosen": four, "rejected": five, "completion": four,
                                         "label": True}])
    (a,), _ = load_pairs(f1, fmt)
    (b,), _ = load_pairs(f2, fmt)
    (c,), _ = load_sft(f2, fmt, input_key="prompt", output_key="completion")
    (d,), _ = load_unpaired(f2, fmt)  # TRL's unpaired column "completion", found without --data.output_key
    assert text(tok, b.chosen.prompt_ids) == "user: 2+2?<eos>assistant: "
    assert text(tok, b.rejected.response_ids) == "5<eos>"
    for x, y in [(a.chosen, b.chosen), (a.rejected, b.rejected), (a.chosen, c), (a.chosen, d.sample)]:
        assert torch.equal(x.prompt_ids, y.prompt_ids) and torch.equal(x.response_ids, y.response_ids)
    no_prompt = write(tmp_path / "np.jsonl", [{"chosen": four, "rejected": five}])
    with pytest.raises(DataError, match=r"np.jsonl, line 1: no key 'prompt' \(--data.prompt_key\)"):
        load_pairs(no_prompt, fmt)


def test_a_response_of_the_wrong_type_names_its_own_key(tmp_path, tok):
    """A CSV column of numbers reads as numbers: the error names the response's key, not the prompt's."""
    csv = tmp_path / "d.csv"
    csv.write_text("input,output,prompt,chosen,rejected,label\n1+1=,2,1+1=,2,3,true\n", encoding="utf-8")
    fmt = TextFormat(tok)
    for load, key in [(load_sft, "output"), (load_pairs, "chosen"), (load_unpaired, "output")]:
        with pytest.raises(DataError, match=rf"d\.csv, record 0, key '{key}': expected a string, got int"):
            load(csv, fmt)


def test_whole_texts_without_a_prompt_key_split_at_their_common_beginning(tmp_path, tok):
    """hh-rlhf's shape, TRL's implicit prompt: chosen and rejected are whole texts; with --data.prompt_key none
    their shared beginning (less a final space) is the prompt, the rest each answer."""
    f = write(tmp_path / "hh.jsonl", [{"chosen": "H: 2+2?\nA: It is 4", "rejected": "H: 2+2?\nA: It is 5"},
                                      {"chosen": "ab", "rejected": "xy"}])
    (a, b), _ = load_pairs(f, TextFormat(tok), prompt_key=None)
    assert text(tok, a.chosen.prompt_ids) == text(tok, a.rejected.prompt_ids) == "H: 2+2?\nA: It is"
    assert text(tok, a.chosen.response_ids) == " 4<eos>" and text(tok, a.rejected.response_ids) == " 5<eos>"
    assert text(tok, b.chosen.prompt_ids) + text(tok, b.chosen.response_ids) == "ab<eos>"  # nothing shared
    with pytest.raises(DataError, match=r"hh\.jsonl, line 1: no key 'prompt' \(--data.prompt_key\) for the answer "
                                        r"under 'chosen'; .* or to none when the chosen and rejected strings hold"):
        load_pairs(f, TextFormat(tok))


def test_kto_labels_must_be_booleans(tmp_path, tok):
    f = write(tmp_path / "k.jsonl", [{"prompt": "a", "output": "b", "label": True},
                                     {"prompt": "a", "output": "c", "label": "yes"}])
    with pytest.raises(DataError, match=r"line 2, key 'label': expected true or false"):
        load_unpaired(f, TextFormat(tok))


def test_kto_reads_trls_unpaired_layout_and_keeps_a_named_key(tmp_path, tok):
    """TRL's KTO data names the answer `completion`: read without --data.output_key, the same samples as
    OpenRLHF's `output`; a record that has `output` keeps it, and a key the user names is never swapped."""
    rows = [{"prompt": "2+2?", "completion": "4", "label": True}, {"prompt": "2+3?", "completion": "6", "label": False}]
    trl = write(tmp_path / "trl.jsonl", rows)
    openrlhf = write(tmp_path / "o.jsonl", [{"prompt": r["prompt"], "output": r["completion"], "label": r["label"]}
                                            for r in rows])
    got, _ = load_unpaired(trl, TextFormat(tok))
    want, _ = load_unpaired(openrlhf, TextFormat(tok))
    assert [text(tok, x.sample.response_ids) for x in got] == ["4<eos>", "6<eos>"]
    for x, y in zip(got, want):
        assert torch.equal(x.sample.prompt_ids, y.sample.prompt_ids) and x.desirable == y.desirable
        assert torch.equal(x.sample.response_ids, y.sample.response_ids)
    both = write(tmp_path / "b.jsonl", [{**rows[0], "output": "5"}])
    assert text(tok, load_unpaired(both, TextFormat(tok))[0][0].sample.response_ids) == "5<eos>"
    with pytest.raises(DataError, match=r"trl\.jsonl, line 1: no key 'answer' \(--data.output_key\)"):
        load_unpaired(trl, TextFormat(tok), output_key="answer")
    partly = write(tmp_path / "p.jsonl", [rows[0], {"prompt": "a", "label": True}])
    with pytest.raises(DataError, match=r"p\.jsonl, line 1: no key 'output' \(--data.output_key\)"):
        load_unpaired(partly, TextFormat(tok))


def test_missing_key_names_file_line_and_flag(tmp_path, tok):
    f = write(tmp_path / "d.jsonl", [{"prompt": "a", "chosen": "b"}])
    with pytest.raises(DataError, match=r"d.jsonl, line 1: no key 'rejected' \(--data.rejected_key\)"):
        load_pairs(f, TextFormat(tok))


def test_long_samples_are_skipped_and_counted(tmp_path, tok):
    f = write(tmp_path / "d.jsonl", [{"input": "a", "output": "b"}, {"input": "a" * 50, "output": "b"}])
    samples, skipped = load_sft(f, TextFormat(tok), max_len=10)
    assert len(samples) == 1 and skipped == 1
    with pytest.raises(DataError, match="longer than --data.max_len 1"):
        load_sft(f, TextFormat(tok), max_len=1)


def test_text_format_refuses_contradictions(tok):
    with pytest.raises(ConfigError, match="choose one"):
        TextFormat(tok, apply_chat_template=True, input_template="{}")
    with pytest.raises(ConfigError, match="no '{}'"):
        TextFormat(tok, input_template="Q:")


def test_pack_positions_restart_and_response_positions_point_into_each_sample(tmp_path, tok):
    f = write(tmp_path / "d.jsonl", [{"input": "ab", "output": "c"}, {"input": "xyz", "output": "uv"}])
    samples, _ = load_sft(f, TextFormat(tok))
    p = pack(samples, tok.pad_token_id)
    # sample 0: a b | c <eos>  (4 tokens); sample 1: x y z | u v <eos> (6 tokens)
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]
    assert p.starts.tolist() == [0, 4]
    pos = p.response_positions()
    assert pos[0, :2].tolist() == [1, 2] and pos[1].tolist() == [6, 7, 8]
    assert p.loss_mask.tolist() == [[True, True, False], [True, True, True]]


def test_compared_answers_end_at_eos_like_generated_responses(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = tok.chat_template.replace("<eos>' }}", "<eos>\n' }}")  # SmolLM2-style "\n" after EOS
    f = write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "ab", "rejected": "c"}])
    (pair,), _ = load_pairs(f, TextFormat(tok, apply_chat_template=True))
    assert "".join(tok.convert_ids_to_tokens(pair.chosen.response_ids.tolist())) == "ab<eos>"
    # SFT keeps the template's text after EOS (it is not a target)
    f2 = write(tmp_path / "s.jsonl", [{"input": "q", "output": "ab"}])
    (s,), _ = load_sft(f2, TextFormat(tok, apply_chat_template=True))
    assert tok.convert_ids_to_tokens(s.response_ids.tolist())[-2:] == ["<eos>", "\n"]
    assert s.loss_mask.tolist()[-2:] == [True, True]
