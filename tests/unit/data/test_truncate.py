"""--data.truncation (verl's data.truncation): over-long prompts cut in tokens, the template's tokens kept.
The tiny tokenizer is one token per character (<eos> one token), so the counts are worked out by hand."""

import pytest

from rlhfkit.data.prompts import PromptExample, load_prompts, tokenize_prompts
from rlhfkit.data.truncate import content_span, keep, truncate_ids
from rlhfkit.errors import DataError
from rlhfkit.models.tiny import tiny_tokenizer

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abcdefghij"}]


def chat(tok, msgs=MSGS):
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_keep_left_right_middle():
    ids = list(range(10))
    assert keep(ids, 4, "left") == [6, 7, 8, 9]       # the end
    assert keep(ids, 4, "right") == [0, 1, 2, 3]      # the start
    assert keep(ids, 5, "middle") == [0, 1, 7, 8, 9]  # 5 // 2 = 2 from the start, 3 from the end (as verl)
    assert keep(ids, 10, "left") == ids and keep(ids, 0, "middle") == []


def test_chat_prompt_cut_inside_the_user_message():
    tok = tiny_tokenizer()
    text = chat(tok)
    assert text == "system: be brief<eos>user: abcdefghij<eos>assistant: "
    # 16 + 1 + 6 = 23 tokens before the content, 10 of it, 1 + 11 = 12 after: 45
    assert len(tok(text, add_special_tokens=False)["input_ids"]) == 45
    cut = {side: tok.decode(truncate_ids(tok, text, MSGS, 39, side)) for side in ("left", "right", "middle")}
    # 39 - 23 - 12 = 4 content tokens
    assert cut == {"left": "system: be brief<eos>user: ghij<eos>assistant: ",
                   "right": "system: be brief<eos>user: abcd<eos>assistant: ",
                   "middle": "system: be brief<eos>user: abij<eos>assistant: "}
    assert truncate_ids(tok, text, MSGS, 35, "left") is None   # 35 < 23 + 12 + 1: the frame alone does not fit
    assert truncate_ids(tok, text, MSGS, 36, "right") is not None


def test_a_prompt_not_found_in_the_rendered_text_is_not_cut():
    tok = tiny_tokenizer()
    assert content_span("Q: abc A:", "abc") == (3, 6)
    assert content_span("Q: abc A:", "abc\n") == (3, 6)  # a template that strips the text
    assert truncate_ids(tok, "Q: xyz A:", "abc", 5, "left") is None


def test_the_prompts_text_is_located_where_the_template_put_it_not_where_it_also_occurs():
    """A user message "an" is also in the generation prompt "assistant: ", its last occurrence: the span is where
    the chat template renders the message (found by rendering it again with a mark in its place)."""
    tok = tiny_tokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "an"}]
    text = chat(tok, msgs)
    assert text == "system: be brief<eos>user: an<eos>assistant: " and text.rfind("an") == 40
    assert content_span(text, msgs, tok) == (27, 29)
    # 16 + 1 + 6 = 23 tokens before "an", 2 of it ('a' 14, 'n' 27), 1 + 11 = 12 after: 37; 36 leaves 1 of it
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 37 and ids[23:25] == [14, 27]
    assert truncate_ids(tok, text, msgs, 36, "left") == ids[:23] + [27] + ids[25:]
    assert truncate_ids(tok, text, msgs, 36, "right") == ids[:23] + [14] + ids[25:]
    assert tok.decode(ids[:23] + [27] + ids[25:]) == "system: be brief<eos>user: n<eos>assistant: "
    # a string prompt through its input template: "an" is in the template's "(answer)" too
    ex = PromptExample(text="an (answer)", label=None, raw={"prompt": "an"}, index=0)
    items, _ = tokenize_prompts([ex], tok, 10, "prompt", truncation="left", input_template="{} (answer)")
    assert items[0].text == "n (answer)"  # 11 tokens: 1 of "an" kept, the template's 9 whole


def test_a_string_prompt_under_the_chat_template_is_located_as_its_user_message():
    """--data.apply_chat_template renders a string prompt as one user message: its text is located there as a
    message list's is, not searched ("an" is in the generation prompt "assistant: " too)."""
    tok = tiny_tokenizer()
    ex = load_prompts([{"prompt": "an"}], tokenizer=tok, input_key="prompt", apply_chat_template=True)
    assert ex[0].text == "user: an<eos>assistant: " and ex[0].raw == {"prompt": "an"}  # 6 + 2 + 12 = 20 tokens
    items, skipped = tokenize_prompts(ex, tok, 19, "prompt", truncation="left")
    assert ([i.text for i in items], skipped) == (["user: n<eos>assistant: "], 0)
    # the string rendered as it is (no template): the whole text is the prompt's
    assert content_span("an", "an", tok) == (0, 2)


def test_a_text_the_template_holds_twice_or_cannot_be_told_apart_is_not_cut():
    tok = tiny_tokenizer()
    # the template repeats the prompt: cutting one copy leaves the other whole, so neither is cut
    assert truncate_ids(tok, "abcdef / abcdef", "abcdef", 12, "left", input_template="{0} / {0}") is None
    # without the template, a text found twice is not told apart either; found once, it is taken
    assert content_span("an (answer)", "an") is None and content_span("abc (answer)", "abc") == (0, 3)


def test_a_chat_template_that_rewrites_the_text_is_not_cut_where_the_text_also_occurs():
    """A template that upper-cases the user message: its "ist" is rendered "IST", and the only "ist" left is
    the generation prompt's ("assistant: "), which must not be cut; the prompt is skipped as the module says."""
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}<eos>{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    msgs = [{"role": "user", "content": "ist"}]
    text = chat(tok, msgs)
    assert text == "user: IST<eos>assistant: " and text.count("ist") == 1
    assert content_span(text, msgs, tok) is None
    assert truncate_ids(tok, text, msgs, 20, "left") is None
    # a string rendered as it is stays the whole text, whatever the tokenizer's chat template does
    assert content_span("ist", "ist", tok) == (0, 3)


def test_tokenize_prompts_skips_errs_or_cuts():
    tok = tiny_tokenizer()
    long = PromptExample(text=chat(tok), label="7", raw={"prompt": MSGS}, index=3)
    short = PromptExample(text="Q: 1+1 A:", label="2", raw={"prompt": "1+1"}, index=4)
    items, skipped = tokenize_prompts([long, short], tok, 39, "prompt")
    assert (len(items), skipped) == (1, 1)                                      # skip (the default)
    with pytest.raises(DataError, match=r"record 3: its prompt is 45 tokens, over --data.prompt_max_len 39"):
        tokenize_prompts([long, short], tok, 39, "prompt", truncation="error")
    items, skipped = tokenize_prompts([long, short], tok, 39, "prompt", truncation="left")
    assert skipped == 0 and [len(i.ids) for i in items] == [39, 9]
    assert items[0].text == "system: be brief<eos>user: ghij<eos>assistant: " and items[0].raw == MSGS
    assert items[1].text == "Q: 1+1 A:"                                         # short prompts are untouched
    # a plain prompt (no template): the whole text is the prompt's own
    plain = PromptExample(text="abcdefghij", label=None, raw={"prompt": "abcdefghij"}, index=0)
    assert tokenize_prompts([plain], tok, 4, "prompt", truncation="middle")[0][0].text == "abij"


def test_truncation_flag_is_checked():
    from rlhfkit.config import RLConfig, parse_config, validate
    from rlhfkit.config.rl import RL_ALIASES
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="--data.truncation: unknown value 'sides'"):
        validate(parse_config(RLConfig, ["--data.truncation", "sides"], aliases=RL_ALIASES))


def test_train_rl_reads_its_prompts_with_the_truncation_flag():
    """`train rl` (api.rl) tokenizes its prompts with --data.truncation: a chat prompt is cut, not skipped."""
    from rlhfkit.api.rl import _prompt_items
    from rlhfkit.config import RLConfig, parse_config
    from rlhfkit.config.rl import RL_ALIASES

    records = [{"prompt": MSGS, "answer": "7"}, {"prompt": "hi", "answer": "1"}]
    argv = ["--data.input_key", "prompt", "--data.label_key", "answer", "--data.apply_chat_template", "true",
            "--data.prompt_max_len", "39"]
    tok = tiny_tokenizer()
    for flags, texts, skipped in (
            ([], ["user: hi<eos>assistant: "], 1),
            (["--data.truncation", "left"], ["system: be brief<eos>user: ghij<eos>assistant: ",
                                             "user: hi<eos>assistant: "], 0)):
        cfg = parse_config(RLConfig, argv + flags, aliases=RL_ALIASES)
        items, n = _prompt_items(cfg, records, tok, None)
        assert (sorted(i.text for i in items), n) == (sorted(texts), skipped)
    # a string prompt's text is found through --data.input_template ("an" is in "(answer)" too)
    cfg = parse_config(RLConfig, ["--data.input_key", "prompt", "--data.input_template", "{} (answer)",
                                  "--data.prompt_max_len", "10", "--data.truncation", "left"], aliases=RL_ALIASES)
    assert [i.text for i in _prompt_items(cfg, [{"prompt": "an"}], tok, None)[0]] == ["n (answer)"]


def test_executors_that_render_the_record_again_refuse_a_cut():
    """A tool-calling executor renders each prompt from its record's messages (PromptItem.raw, left whole): a
    cut prompt would run uncut, so the cutting sides are refused with it; single-turn generation takes them."""
    from rlhfkit.agents import SingleTurnExecutor
    from rlhfkit.agents.tools.agent import ToolExecutor
    from rlhfkit.api.rl import _check_truncation
    from rlhfkit.config import RLConfig, parse_config
    from rlhfkit.config.rl import RL_ALIASES
    from rlhfkit.errors import ConfigError

    def add(a: int, b: int) -> int:
        """Add.

        Args:
          a: one.
          b: two.
        """
        return a + b

    cut = parse_config(RLConfig, ["--data.truncation", "left"], aliases=RL_ALIASES)
    with pytest.raises(ConfigError, match="--data.truncation left: ToolExecutor renders each prompt again"):
        _check_truncation(cut, ToolExecutor([add]))
    _check_truncation(cut, SingleTurnExecutor())
    _check_truncation(cut, None)
    _check_truncation(parse_config(RLConfig, ["--data.truncation", "skip"], aliases=RL_ALIASES), ToolExecutor([add]))


def test_a_tokenizer_without_offsets_is_a_config_error():
    """transformers 5's Python (non-fast) tokenizers ignore return_offsets_mapping: a ConfigError, no KeyError."""
    from transformers import ByT5Tokenizer

    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a fast tokenizer"):
        truncate_ids(ByT5Tokenizer(), "Q: abcdef A:", "abcdef", 6, "left")
