"""Mistral's tool-call format of tokenizer v11 and later, `[TOOL_CALLS]NAME[ARGS]{json}` per call: the
parser is picked for a chat template that writes calls that way (and the older `[TOOL_CALLS][...]`
parser for one that does not), and the calls the template renders parse back to the same calls."""

from rlhfkit.agents.tools import detect_parser, parse_tool_calls
from rlhfkit.agents.tools.schema import ToolCall

from .conftest import char_tokenizer

# The shape of recent Mistral chat templates (Mistral Small 3.2, Magistral, Devstral): tools listed in
# [AVAILABLE_TOOLS], each call of an assistant turn written as [TOOL_CALLS]name[ARGS]arguments
V11_TEMPLATE = (
    "{{- bos_token }}{%- if tools %}{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] or '' }}"
    "{%- for tool in message['tool_calls'] or [] %}{%- set arguments = tool['function']['arguments'] %}"
    "{%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}"
    "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}{%- endfor %}{{- eos_token }}"
    "{%- elif message['role'] == 'tool' %}{{- '[TOOL_RESULTS]' + message['content'] + '[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}")
# before v11: the calls as one JSON list after [TOOL_CALLS]
V3_TEMPLATE = V11_TEMPLATE.replace(
    "{%- for tool in message['tool_calls'] or [] %}{%- set arguments = tool['function']['arguments'] %}"
    "{%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}"
    "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}{%- endfor %}",
    "{%- if message['tool_calls'] %}{{- '[TOOL_CALLS]' + message['tool_calls']|map(attribute='function')|list|tojson }}"
    "{%- endif %}")
SPECIALS = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]",
            "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


def mistral_tok(template):
    tok = char_tokenizer(template, SPECIALS)
    tok.bos_token, tok.eos_token = "<s>", "</s>"
    return tok


def test_the_v11_template_picks_the_v11_parser_and_the_older_one_keeps_its_own():
    assert detect_parser(mistral_tok(V11_TEMPLATE)) == "mistral_v11"
    assert detect_parser(mistral_tok(V3_TEMPLATE)) == "mistral"


def test_v11_calls_parse_with_text_before_them_several_calls_and_a_call_id():
    tok = mistral_tok(V11_TEMPLATE)
    content, calls, errors = parse_tool_calls('Let me add.[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}</s>', tok)
    assert content == "Let me add." and calls == [ToolCall("add", {"a": 3, "b": 4}, "call_0")] and not errors
    _, calls, errors = parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]neg[ARGS]{"x": 5}</s>', tok)
    assert calls == [ToolCall("add", {"a": 1, "b": 2}, "call_0"), ToolCall("neg", {"x": 5}, "call_1")] and not errors
    _, calls, _ = parse_tool_calls('[TOOL_CALLS]add[CALL_ID]a1B2c3D4e[ARGS]{"a": 1}</s>', tok)
    assert calls == [ToolCall("add", {"a": 1}, "call_0")]
    content, calls, _ = parse_tool_calls("[THINK]3 + 4 is 7.[/THINK]The answer is 7.</s>", tok)
    assert content == "The answer is 7." and calls == []
    # a malformed call is an error line; the well-formed one beside it still counts
    _, calls, errors = parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1,[TOOL_CALLS]neg[ARGS]{"x": 5}</s>', tok)
    assert calls == [ToolCall("neg", {"x": 5}, "call_1")] and len(errors) == 1 and "malformed" in errors[0]
    # the older parser reads none of these calls
    _, calls, _ = parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}</s>', tok, "mistral")
    assert calls == []


def test_the_calls_the_template_renders_parse_back_to_the_same_calls():
    tok = mistral_tok(V11_TEMPLATE)
    calls = [{"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}},
             {"type": "function", "function": {"name": "neg", "arguments": {"x": -2}}}]
    rendered = tok.apply_chat_template([{"role": "user", "content": "3+4?"},
                                        {"role": "assistant", "content": "", "tool_calls": calls}], tokenize=False)
    turn = rendered.split("[/INST]", 1)[1]
    assert turn == '[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}[TOOL_CALLS]neg[ARGS]{"x": -2}</s>'
    _, parsed, errors = parse_tool_calls(turn, tok)
    assert [(c.name, c.arguments) for c in parsed] == [("add", {"a": 3, "b": 4}), ("neg", {"x": -2})] and not errors
