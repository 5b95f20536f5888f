"""OpenRLHF's data options of the supervised commands: several datasets read as one (--dataset a,b
and --dataset_probs), continued pretraining's whole-text samples (--pretrain_mode), the pair's
margin key (--margin_loss) and a chat template given on the command line (--tokenizer_chat_template)."""

import pytest
import torch

from rlhfkit.api.supervised import set_chat_template
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.records import Blend, as_source, blend_order, read_records
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import tiny_tokenizer
from tests.unit.data.test_supervised import tok, write  # noqa: F401  (tok: the tokenizer fixture)


@pytest.fixture
def two(tmp_path):
    a = write(tmp_path / "a.jsonl", [{"input": f"a{i}", "output": "x"} for i in range(3)])
    b = write(tmp_path / "b.jsonl", [{"input": f"b{i}", "output": "y"} for i in range(5)])
    return a, b


def test_comma_separated_datasets_without_probabilities_are_concatenated(two):
    a, b = two
    source = as_source(f"{a},{b}")
    assert isinstance(source, Blend) and source.probs is None
    assert [r.data["input"] for r in read_records(source)] == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4"]
    assert read_records(source)[3].where == f"{b}, line 1"  # errors name the part and its line
    assert as_source(str(a)) == str(a)  # one dataset: read as before


def test_probabilities_mix_as_openrlhf_blending_datasets_does(two):
    """The order is datasets.interleave_datasets' with OpenRLHF's arguments (what its
    blending_datasets returns for these two files), and every record of each file appears."""
    import datasets

    a, b = two
    records = [r.data["input"] for r in read_records(as_source(f"{a}, {b}", "0.3,0.7", seed=7))]
    parts = [datasets.load_dataset("json", data_files=str(p))["train"] for p in (a, b)]
    theirs = datasets.interleave_datasets(parts, probabilities=[0.3, 0.7], seed=7, stopping_strategy="all_exhausted")
    assert records == theirs["input"]
    assert {f"a{i}" for i in range(3)} | {f"b{i}" for i in range(5)} <= set(records)
    assert records != [r.data["input"] for r in read_records(as_source(f"{a},{b}", "0.3,0.7", seed=8))]


def test_blend_order_by_hand():
    assert blend_order([2, 1], None, 0) == [(0, 0), (0, 1), (1, 0)]
    order = blend_order([2, 3], (0.5, 0.5), 0)
    # each source is read to its end at least once, in its own order, restarting when it runs out
    for k, n in ((0, 2), (1, 3)):
        rows = [i for s, i in order if s == k]
        assert rows[:n] == list(range(n)) and all(rows[j] == j % n for j in range(len(rows)))


def test_max_samples_cuts_each_dataset_before_blending(two):
    a, b = two
    got = [r.data["input"] for r in read_records(as_source(f"{a},{b}", max_count=2))]
    assert got == ["a0", "a1", "b0", "b1"]


@pytest.mark.parametrize("probs,needle", [
    ("0.5", "has 1 probabilities for 2 dataset(s)"),
    ("0.5,0.6", "must be > 0 and sum to 1"),
    ("0,1", "must be > 0 and sum to 1"),
    ("half,half", "expected comma-separated numbers"),
])
def test_bad_probabilities_are_config_errors(two, probs, needle):
    a, b = two
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        as_source(f"{a},{b}", probs)


def test_pretrain_mode_trains_on_every_token_of_the_text(tmp_path, tok):
    f = write(tmp_path / "t.jsonl", [{"input": "abcd", "output": "ignored"}, {"input": "q"},
                                     {"input": "abcdefgh"}])
    fmt = TextFormat(tok, input_template="Q:{}")  # no template in pretrain mode
    samples, skipped = load_sft(f, fmt, max_len=6, pretrain_mode=True)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert skipped == 1  # "q": one token, nothing to predict
    first, cut = samples
    assert first.prompt_ids.tolist() == ids("a") and first.response_ids.tolist() == ids("bcd")  # no EOS
    assert first.loss_mask.tolist() == [True] * 3
    assert torch.cat([cut.prompt_ids, cut.response_ids]).tolist() == ids("abcdef")  # cut to max_len
    with pytest.raises(DataError, match="2 tokens or more"):
        load_sft(write(tmp_path / "s.jsonl", [{"input": "q"}]), fmt, pretrain_mode=True)


def test_pairs_carry_their_margin_key(tmp_path, tok):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b", "margin": 1.5}, {"prompt": "p", "chosen": "a",
                                                                            "rejected": "b", "margin": None},
            {"prompt": "p", "chosen": "a", "rejected": "b"}]
    pairs, _ = load_pairs(write(tmp_path / "p.jsonl", rows), TextFormat(tok))
    assert sorted(p.margin for p in pairs) == [0.0, 0.0, 1.5]
    with pytest.raises(DataError, match="key 'margin': expected a number"):
        load_pairs(write(tmp_path / "q.jsonl", [{**rows[0], "margin": "big"}]), TextFormat(tok))


def test_the_command_line_chat_template_renders_the_data_and_is_saved(tmp_path, tok):
    template = "{% for m in messages %}({{ m['content'] }}){% endfor %}"
    cfg = SFTConfig.from_args(["--data.apply_chat_template", "--data.tokenizer_chat_template", template])
    t = tiny_tokenizer()
    set_chat_template(t, cfg.data)
    f = write(tmp_path / "c.jsonl", [{"input": "hi", "output": "yo"}])
    (s,), _ = load_sft(f, TextFormat(t, apply_chat_template=True))
    assert t.decode(torch.cat([s.prompt_ids, s.response_ids]).tolist()) == "(hi)(yo)"
    t.save_pretrained(tmp_path / "tok")
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "tok").chat_template == template
    (tmp_path / "t.jinja").write_text(template)  # a file holding the template
    t2 = tiny_tokenizer()
    set_chat_template(t2, SFTConfig.from_args(["--data.apply_chat_template", "--data.tokenizer_chat_template",
                                                str(tmp_path / "t.jinja")]).data)
    assert t2.chat_template == template
    t3 = tiny_tokenizer()  # without --data.apply_chat_template it is not read (as in OpenRLHF)
    set_chat_template(t3, SFTConfig.from_args(["--data.tokenizer_chat_template", template]).data)
    assert t3.chat_template == tok.chat_template
