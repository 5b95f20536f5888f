"""Tool calling on the published chat templates of four families (Qwen2.5, Qwen3, Llama 3.1,
Llama 3.2), as TRL's wheel ships them (trl/chat_templates/*.jinja; skipped where trl is not
installed): schemas rendered through `tools=`, two calls and a malformed call parsed, tool results
rendered as the template's tool turns, the token-prefix property, Qwen3's re-rendering detected.

Each template is given to a character-level tokenizer with the family's special tokens: every
text has one tokenization there, so a prefix mismatch can only come from the template."""

import importlib.util
import json
from pathlib import Path

import pytest

from rlhfkit.agents.tools import PROMPT_OK, RERENDER, ToolSet, ToolTemplate

from .conftest import char_tokenizer


def _templates() -> Path | None:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
    return folder if folder.is_dir() else None


TEMPLATES = _templates()
pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="trl (which ships the published chat templates) "
                                                          "is not installed")

QWEN = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
LLAMA = ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
         "<|python_tag|>")
FAMILIES = {  # template file -> (special tokens, a call as the family writes it, how two calls are joined)
    "qwen2_5": (QWEN, lambda n, a: "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>", "\n"),
    "qwen3": (QWEN, lambda n, a: "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>", "\n"),
    "llama3_1": (LLAMA, lambda n, a: json.dumps({"name": n, "parameters": a}), "; "),
    "llama3_2": (LLAMA, lambda n, a: json.dumps({"name": n, "parameters": a}), "; "),
}


GENERATION_PROMPT = {"<|im_end|>": "<|im_start|>assistant\n",
                     "<|eot_id|>": "<|start_header_id|>assistant<|end_header_id|>\n\n"}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def lookup(key: str) -> str:
    """Look a fact up.

    Args:
        key: what to look up
    """
    return key


def family(name):
    specials, write, join = FAMILIES[name]
    tok = char_tokenizer((TEMPLATES / f"{name}.jinja").read_text(), specials)
    return tok, write, join, "<|eot_id|>" if specials is LLAMA else "<|im_end|>"


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_schemas_render_through_the_template(name):
    tok, *_ = family(name)
    tt = ToolTemplate(tok, ToolSet([multiply, lookup]).schemas)
    assert tt.native  # these templates render tools=: no rlhfkit default prompt
    prompt = tt.render([{"role": "user", "content": "What is 12*34?"}])
    assert '"name": "multiply"' in prompt and '"description": "Look a fact up."' in prompt
    assert "You can call tools." not in prompt


@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_calls_and_a_malformed_one_parse(name):
    tok, write, join, end = family(name)
    tt = ToolTemplate(tok, ToolSet([multiply, lookup]).schemas)
    two = write("multiply", {"a": 12, "b": 34}) + join + write("lookup", {"key": "capital of France"}) + end
    content, calls, errors = tt.parse(ids(tok, two))
    assert [(c.name, c.arguments) for c in calls] == [("multiply", {"a": 12, "b": 34}),
                                                     ("lookup", {"key": "capital of France"})]
    assert errors == [] and content == ""
    bad = write("multiply", {"a": 12, "b": 34}) + join + write("lookup", {"key": "x"}).replace('"x"}', '"x"') + end
    _, calls, errors = tt.parse(ids(tok, bad))
    assert [c.name for c in calls] == ["multiply"] and len(errors) == 1 and "malformed" in errors[0]
    content, calls, errors = tt.parse(ids(tok, "It is 408." + end))
    assert content == "It is 408." and calls == [] and errors == []


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tool_results_render_as_tool_turns_and_keep_the_token_prefix(name):
    tok, write, _, end = family(name)
    tt = ToolTemplate(tok, ToolSet([multiply]).schemas)
    msgs = [{"role": "user", "content": "What is 12*34?"}]
    episode = tt.prompt_ids(msgs)
    for turn, result in enumerate(["408", "816"]):
        action = ids(tok, write("multiply", {"a": 12 * (turn + 1), "b": 34}) + end)
        _, calls, _ = tt.parse(action)
        tool = [{"role": "tool", "tool_call_id": calls[0].id, "name": "multiply", "content": result}]
        delta = tt.delta(action, True, tool)
        text = tok.decode(delta)
        assert result in text and text.endswith(GENERATION_PROMPT[end])
        episode += action + delta
        msgs += [{"role": "assistant", "content": tok.decode(action[:-1])}] + tool
        assert tt.prefix_check(msgs, episode) == PROMPT_OK  # the re-rendered conversation is what was sampled


def test_qwen3_rerendering_of_thinking_is_detected():
    tok, *_ = family("qwen3")
    tt = ToolTemplate(tok, [])
    msgs = [{"role": "user", "content": "Guess my number."}]
    episode = tt.prompt_ids(msgs)
    action = ids(tok, "<think>\nfive is central\n</think>\n\n5<|im_end|>")
    feedback = [{"role": "user", "content": "higher"}]
    episode += action + tt.delta(action, True, feedback)
    msgs += [{"role": "assistant", "content": tok.decode(action[:-1])}] + feedback
    # Qwen3 drops the <think> of turns before the last user message: not the sampled tokens
    assert tt.prefix_check(msgs, episode) == RERENDER
    assert "five is central" in tok.decode(episode) and "five is central" not in tt.render(msgs)


def xml_call(name, args):
    """A call as Qwen3-Coder, Qwen3.5+ and Nemotron 3 write it (the qwen3_coder parser)."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


XML_FAMILIES = [n for n in ("qwen3_5_think", "qwen3_6", "nemotron_3_nano")
                if TEMPLATES is not None and (TEMPLATES / f"{n}.jinja").exists()]


@pytest.mark.parametrize("name", XML_FAMILIES)
def test_xml_calls_parse_with_the_schemas_types_and_render_back(name):
    """These templates teach `<function=NAME><parameter=KEY>`: read as JSON (hermes) every call was malformed."""
    tok = char_tokenizer((TEMPLATES / f"{name}.jinja").read_text(), QWEN)
    tt = ToolTemplate(tok, ToolSet([multiply, lookup]).schemas)
    # their generation prompts open the turn in <think>: the model closes it, then answers or calls
    two = ("Two calls.\n</think>\n\nLet me compute.\n\n" + xml_call("multiply", {"a": 12, "b": 34}) + "\n"
           + xml_call("lookup", {"key": "capital\nof France"}) + "<|im_end|>")
    content, calls, errors = tt.parse(ids(tok, two))
    assert [(c.name, c.arguments) for c in calls] == [("multiply", {"a": 12, "b": 34}),  # ints, by the schema
                                                     ("lookup", {"key": "capital\nof France"})]
    assert errors == [] and content == "Let me compute."
    assert tt.parse(ids(tok, "Easy.\n</think>\n\nIt is 408.<|im_end|>")) == ("It is 408.", [], [])
    # the template renders the parsed calls back as the model wrote them
    msgs = [{"role": "user", "content": "What is 12*34?"},
            {"role": "assistant", "content": "", "tool_calls": [c.as_message_entry() for c in calls[:1]]}]
    msgs[1]["tool_calls"][0]["function"]["arguments"] = calls[0].arguments
    assert xml_call("multiply", {"a": 12, "b": 34}) in tt.render(msgs, add_generation_prompt=False)


GLM = ("<|system|>", "<|observation|>", "<|user|>", "<|assistant|>", "<|endoftext|>")  # eos: <|observation|>


def glm_call(name, args):
    """A call as GLM-4.5 and later write it (the glm45 parser)."""
    params = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
    return f"<tool_call>{name}\n{params}</tool_call>"


@pytest.mark.skipif(TEMPLATES is None or not (TEMPLATES / "glm4moe.jinja").exists(), reason="no GLM-4.5 template")
def test_glm_calls_parse_and_their_results_keep_the_token_prefix():
    tok = char_tokenizer((TEMPLATES / "glm4moe.jinja").read_text(), GLM)
    tt = ToolTemplate(tok, ToolSet([multiply, lookup]).schemas)
    two = ("<think>hmm</think>\nLet me compute.\n" + glm_call("multiply", {"a": 12, "b": 34}) + "\n"
           + glm_call("lookup", {"key": "capital of France"}) + "<|observation|>")
    content, calls, errors = tt.parse(ids(tok, two))
    assert [(c.name, c.arguments) for c in calls] == [("multiply", {"a": 12, "b": 34}),
                                                     ("lookup", {"key": "capital of France"})]
    assert errors == [] and content == "Let me compute."
    assert tt.parse(ids(tok, "<think></think>\nIt is 408.<|user|>")) == ("It is 408.", [], [])
    msgs = [{"role": "user", "content": "What is 12*34?"}]
    episode = tt.prompt_ids(msgs)
    action = ids(tok, "\n<think></think>\n" + glm_call("multiply", {"a": 12, "b": 34}) + "<|observation|>")
    tool = [{"role": "tool", "tool_call_id": "call_0", "name": "multiply", "content": "408"}]
    delta = tt.delta(action, True, tool)
    assert tok.decode(delta) == "\n<tool_response>\n408\n</tool_response><|assistant|>"
    episode += action + delta
    msgs += [{"role": "assistant", "content": tok.decode(action[:-1])}] + tool
    assert tt.prefix_check(msgs, episode) == PROMPT_OK


def test_a_template_teaching_a_call_format_no_parser_reads_is_warned_about(caplog):
    """Gemma 4 renders tools= in its own call syntax: parsed as Hermes, its calls would never run."""
    import logging

    known = ["qwen2_5", "qwen3_5_think", "glm4moe", "llama3_1"]
    for name in ["gemma4", *known]:
        if not (TEMPLATES / f"{name}.jinja").exists():
            pytest.skip(f"trl ships no {name} template")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlhfkit"):
            ToolTemplate(char_tokenizer((TEMPLATES / f"{name}.jinja").read_text(), QWEN), ToolSet([multiply]).schemas)
        warned = any("tool-call format rlhfkit does not read" in r.getMessage() for r in caplog.records)
        assert warned == (name == "gemma4"), name
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):  # a parser named: the user knows
        ToolTemplate(char_tokenizer((TEMPLATES / "gemma4.jinja").read_text(), QWEN), ToolSet([multiply]).schemas,
                     parser="hermes")
    assert not caplog.records


@pytest.mark.skipif(TEMPLATES is None or not (TEMPLATES / "qwen3_5_think.jinja").exists(), reason="no Qwen3.5")
def test_a_turn_the_template_opens_in_thinking_keeps_its_reasoning_out_of_the_content_and_calls():
    """Qwen3.5's generation prompt ends in `<think>\\n`: the model writes its reasoning, `</think>`, then
    the answer or calls. A call drafted in the reasoning is thought, not a call."""
    tok = char_tokenizer((TEMPLATES / "qwen3_5_think.jinja").read_text(), QWEN)
    tt = ToolTemplate(tok, ToolSet([multiply, lookup]).schemas)
    assert tt.turn_opening() == "<|im_start|>assistant\n<think>\n"
    action = "I multiply.\n</think>\n\n" + xml_call("multiply", {"a": 12, "b": 34}) + "<|im_end|>"
    content, calls, errors = tt.parse(ids(tok, action))
    assert (content, [c.name for c in calls], errors) == ("", ["multiply"], [])
    drafted = "Maybe " + xml_call("lookup", {"key": "x"}) + "? No.\n</think>\n\nIt is 408.<|im_end|>"
    assert tt.parse(ids(tok, drafted)) == ("It is 408.", [], [])
    plain = ToolTemplate(char_tokenizer((TEMPLATES / "qwen2_5.jinja").read_text(), QWEN), ToolSet([multiply]).schemas)
    assert plain.turn_opening() == "<|im_start|>assistant\n"  # nothing of the turn pre-written
