"""`tool_choice` and `parallel_tool_calls` enforced on the tokens, for every call syntax rlhfkit parses, on the
published chat templates (TRL's wheel) and Mistral's: a named function or "required" appends the call's opening
to the prompt's ids (never trained, not in the reply's token_ids) and the reply reads it with the sampled text;
the next turn continues token for token; `parallel_tool_calls` false cuts a turn after its first call.

Each template is given to a character-level tokenizer (one tokenization per text), and a scripted policy
writes the rest of a call only when the prompt ends in the call's forced opening: with nothing forced it
answers in words, so these tests fail when forcing is off."""

import asyncio
import json

import pytest

from rlhfkit.agents.endpoint import responses
from rlhfkit.agents.endpoint.episodes import EndpointLimits, Registry
from rlhfkit.agents.endpoint.handlers import Completions, Settings
from rlhfkit.agents.endpoint.segments import stitch
from rlhfkit.agents.endpoint.wire import BadRequest
from rlhfkit.agents.tools import ToolTemplate
from rlhfkit.rollout.base import SamplingParams

from .conftest import ScriptedEngine, char_tokenizer
from .test_tool_mistral_v11 import V3_TEMPLATE, V11_TEMPLATE, mistral_tok
from .test_tool_templates import GLM, LLAMA, QWEN, TEMPLATES, glm_call, xml_call

pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="trl (which ships the published chat templates) "
                                                          "is not installed")


def _tool(name, **params):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in params.items()}, "required": list(params)}}}


TOOLS = [_tool("add", a="integer", b="integer"), _tool("neg", x="integer")]
MSGS = [{"role": "user", "content": "3+4?"}]
ANSWER = "It is seven."


def hermes(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def llama(name, args):
    return json.dumps({"name": name, "parameters": args})


def v11(name, args):
    return f"[TOOL_CALLS]{name}[ARGS]" + json.dumps(args)


ADD, NEG = ("add", {"a": 3, "b": 4}), ("neg", {"x": 5})
# family -> (tokenizer, how one call is written, how two are joined, how the turn ends, what the template
# pre-writes before the first call, the text forced by tool_choice add, the text forced by "required")
FAMILIES = {
    "qwen2_5": (lambda: char_tokenizer((TEMPLATES / "qwen2_5.jinja").read_text(), QWEN), hermes, "\n", "<|im_end|>",
                "", '<tool_call>\n{"name": "add", "arguments":', "<tool_call>\n"),
    "llama3_1": (lambda: char_tokenizer((TEMPLATES / "llama3_1.jinja").read_text(), LLAMA), llama, "; ", "<|eot_id|>",
                 "", '{"name": "add", "parameters":', '{"name":'),
    "qwen3_5_think": (lambda: char_tokenizer((TEMPLATES / "qwen3_5_think.jinja").read_text(), QWEN), xml_call, "\n",
                      "<|im_end|>", "</think>\n\n", "</think>\n\n<tool_call>\n<function=add>\n",
                      "</think>\n\n<tool_call>\n<function="),
    "glm4moe": (lambda: char_tokenizer((TEMPLATES / "glm4moe.jinja").read_text(), GLM), glm_call, "\n",
                "<|observation|>", "", "<tool_call>add\n", "<tool_call>"),
    "mistral": (lambda: mistral_tok(V3_TEMPLATE), None, None, "</s>", "",
                '[TOOL_CALLS] [{"name": "add", "arguments":', "[TOOL_CALLS]"),
    "mistral_v11": (lambda: mistral_tok(V11_TEMPLATE), v11, "", "</s>", "", "[TOOL_CALLS]add[ARGS]", "[TOOL_CALLS]"),
}


def turn(family, *calls):
    """What a model of `family` writes for `calls` (the whole turn, its end included)."""
    _, write, join, end, before, *_ = FAMILIES[family]
    if write is None:  # Mistral before v11: one JSON list
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + end  # as v0.3 writes
    return before + join.join(write(n, a) for n, a in calls) + end


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


class Endpoint:
    """Completions over a scripted engine: `policy(context) -> action`; `prompts` the ids the engine was given."""

    def __init__(self, tok, policy):
        self.tok, self.engine, self.registry = tok, ScriptedEngine(tok, policy), Registry()
        self.completions = Completions(tok, Settings(SamplingParams(max_new_tokens=400)), self.registry, self.generate)
        self.e = self.registry.open(0, 0, EndpointLimits(per_call=400, total=4000, context=8192))

    async def generate(self, prompt, params, seed, e, vision):
        return self.engine.generate([prompt], params)

    @property
    def prompts(self):
        return [p[0] for p, _ in self.engine.calls]

    def chat(self, **body):
        return asyncio.run(self.completions.chat(self.e, {"messages": MSGS, "tools": TOOLS, **body}))

    def trajectories(self):
        return stitch(self.e.calls, 0, 0, {}).trajectories


def writes_after(forced, rest, otherwise=ANSWER):
    """A policy that writes `rest` when the context ends with `forced`, else `otherwise` (no call)."""
    return lambda context: rest if context.endswith(forced) else otherwise


def calls_of(reply):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply["message"]["tool_calls"]]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("required", [False, True])
def test_a_forced_call_opens_the_turn_in_the_prompt_and_only_the_sampled_tokens_train(family, required):
    make, *_, end, _, named, opening = FAMILIES[family]
    tok = make()
    forced = opening if required else named
    whole = turn(family, ADD)
    assert whole.startswith(forced)
    sampled = whole[len(forced):]
    ep = Endpoint(tok, writes_after(forced, sampled, ANSWER + end))
    body = ep.chat(tool_choice="required" if required else {"type": "function", "function": {"name": "add"}})
    prompt = ToolTemplate(tok, TOOLS).prompt_ids(MSGS)
    assert ep.prompts == [prompt + ids(tok, forced)] == [body["prompt_token_ids"]]
    [reply] = body["choices"]
    assert reply["token_ids"] == ids(tok, sampled)
    assert calls_of(reply) == [ADD] and reply["finish_reason"] == "tool_calls"
    assert reply["message"]["content"] is None
    [traj] = ep.trajectories()
    assert traj.prompt_ids.tolist() == prompt + ids(tok, forced)  # the forced opening: context, never trained
    assert traj.response_ids.tolist() == ids(tok, sampled) and bool(traj.loss_mask.all())


@pytest.mark.parametrize("parallel", [True, False])
def test_the_next_turn_continues_the_forced_call_token_for_token_and_stays_one_trajectory(parallel):
    """With parallel calls off the turn is cut after its first call: the next prompt ends the turn as the
    template does (the model sampled no <|im_end|>)."""
    tok = FAMILIES["qwen2_5"][0]()
    named = FAMILIES["qwen2_5"][5]
    sampled = turn("qwen2_5", ADD)[len(named):]
    if not parallel:
        sampled = sampled.removesuffix("<|im_end|>") + "\n" + turn("qwen2_5", NEG)
    ep = Endpoint(tok, lambda ctx: sampled if ctx.endswith(named) else ANSWER + "<|im_end|>")
    first = ep.chat(tool_choice={"type": "function", "function": {"name": "add"}},
                    parallel_tool_calls=parallel)["choices"][0]
    [call] = first["message"]["tool_calls"]
    result = {"role": "tool", "tool_call_id": call["id"], "content": "7"}
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
    second = asyncio.run(ep.completions.chat(ep.e, {"messages": msgs, "tools": TOOLS}))
    assert second["choices"][0]["message"]["content"] == ANSWER
    tt = ToolTemplate(tok, TOOLS)
    prompt, forced, s1 = tt.prompt_ids(MSGS), ids(tok, named), first["token_ids"]
    assert tok.decode(s1) == turn("qwen2_5", ADD)[len(named):][:None if parallel else -len("<|im_end|>")]
    delta = tt.delta(s1, parallel, [result])
    assert tok.decode(delta).startswith("<|im_end|>") != parallel
    assert ep.prompts[1] == prompt + forced + s1 + delta == second["prompt_token_ids"]
    [traj] = ep.trajectories()
    s2 = ids(tok, ANSWER + "<|im_end|>")
    assert traj.prompt_ids.tolist() == prompt + forced
    assert traj.response_ids.tolist() == s1 + delta + s2
    assert traj.loss_mask.tolist() == [True] * len(s1) + [False] * len(delta) + [True] * len(s2)


def test_the_responses_apis_named_function_is_forced():
    tok = FAMILIES["mistral_v11"][0]()
    forced, sampled = "[TOOL_CALLS]neg[ARGS]", '{"x": 5}</s>'
    ep = Endpoint(tok, writes_after(forced, sampled, ANSWER + "</s>"))
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {"input": "3+4?", "tools": tools, "tool_choice": {"type": "function", "name": "neg"}}
    out = asyncio.run(responses.serve(ep.completions, ep.e, body))
    [item] = out["output"]
    assert (item["type"], item["name"], json.loads(item["arguments"])) == ("function_call", *NEG)
    assert out["prompt_token_ids"][-len(ids(tok, forced)):] == ids(tok, forced)
    assert out["token_ids"] == ids(tok, sampled)


CUT = {  # family -> the sampled turn cut after its first call (parallel_tool_calls false)
    "qwen2_5": hermes(*ADD),
    "qwen3_5_think": "</think>\n\n" + xml_call(*ADD),
    "glm4moe": glm_call(*ADD),
    "mistral_v11": v11(*ADD),
}


@pytest.mark.parametrize("family", list(CUT))
def test_parallel_tool_calls_false_cuts_the_turn_after_its_first_call(family):
    tok = FAMILIES[family][0]()
    two = turn(family, ADD, NEG)
    ep = Endpoint(tok, lambda ctx: two)
    both = ep.chat()["choices"][0]
    assert calls_of(both) == [ADD, NEG] and both["token_ids"] == ids(tok, two)  # parallel by default
    [one] = ep.chat(parallel_tool_calls=False)["choices"]
    assert one["token_ids"] == ids(tok, CUT[family]) and calls_of(one) == [ADD]
    assert one["finish_reason"] == "tool_calls"
    assert ep.trajectories()[1].response_ids.tolist() == ids(tok, CUT[family])  # the tokens agree with the text


def test_one_call_of_a_forced_turn_and_none_of_those_drafted_in_the_reasoning():
    tok = char_tokenizer((TEMPLATES / "qwen3.jinja").read_text(), QWEN)
    named = '<tool_call>\n{"name": "add", "arguments":'
    rest = hermes(*ADD)[len(named):] + "\n" + hermes(*NEG) + "<|im_end|>"
    ep = Endpoint(tok, writes_after(named, rest))
    [one] = ep.chat(tool_choice={"type": "function", "function": {"name": "add"}},
                    parallel_tool_calls=False)["choices"]
    assert one["token_ids"] == ids(tok, hermes(*ADD)[len(named):]) and calls_of(one) == [ADD]
    drafted = "<think>\nmaybe " + hermes(*NEG) + "\n</think>\n\n" + hermes(*ADD) + "\n" + hermes(*NEG) + "<|im_end|>"
    ep = Endpoint(tok, lambda ctx: drafted)
    [one] = ep.chat(parallel_tool_calls=False)["choices"]
    assert one["token_ids"] == ids(tok, drafted[:drafted.index("</tool_call>\n<tool_call>") + len("</tool_call>")])
    assert calls_of(one) == [ADD]


@pytest.mark.parametrize("family", ["llama3_1", "mistral"])
def test_a_format_that_marks_no_end_of_a_call_keeps_the_first_call_and_the_sampled_tokens(family):
    tok = FAMILIES[family][0]()
    two = turn(family, ADD, NEG)
    ep = Endpoint(tok, lambda ctx: two)
    [one] = ep.chat(parallel_tool_calls=False)["choices"]
    assert calls_of(one) == [ADD] and one["token_ids"] == ids(tok, two)
    assert calls_of(ep.chat()["choices"][0]) == [ADD, NEG]


def test_auto_and_none_are_as_before():
    """auto (absent, "auto", with parallel calls allowed): the template's prompt, the sampled turn, both calls;
    none: no calls read, nothing forced, nothing cut (even with parallel_tool_calls false)."""
    tok = FAMILIES["qwen2_5"][0]()
    two = turn("qwen2_5", ADD, NEG)
    ep = Endpoint(tok, lambda ctx: two)
    replies = [ep.chat(), ep.chat(tool_choice="auto"), ep.chat(tool_choice="auto", parallel_tool_calls=True)]
    prompt = ToolTemplate(tok, TOOLS).prompt_ids(MSGS)
    assert ep.prompts == [prompt] * 3 and all(r["prompt_token_ids"] == prompt for r in replies)
    for r in replies:
        [c] = r["choices"]
        assert c["token_ids"] == ids(tok, two) and calls_of(c) == [ADD, NEG] and c["finish_reason"] == "tool_calls"
        assert c["message"]["content"] is None and r["usage"]["completion_tokens"] == len(ids(tok, two))
    [plain] = ep.chat(tool_choice="none", parallel_tool_calls=False)["choices"]
    assert ep.prompts[-1] == prompt and plain["token_ids"] == ids(tok, two) and plain["message"]["tool_calls"] is None
    assert plain["message"]["content"] == two[:-len("<|im_end|>")] and plain["finish_reason"] == "stop"


@pytest.mark.parametrize("body, says", [
    ({"tool_choice": "required", "tools": None}, "has no tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "mul"}}}, "'mul', which is not among"),
    ({"tool_choice": "any"}, 'give "none", "auto", "required"'),
    ({"tool_choice": {"type": "function"}}, 'give "none", "auto", "required"'),
    ({"parallel_tool_calls": "no"}, "give true or false"),
])
def test_tool_choice_of_the_wrong_form_is_a_400_naming_the_field(body, says):
    ep = Endpoint(FAMILIES["qwen2_5"][0](), lambda ctx: ANSWER)
    with pytest.raises(BadRequest, match=says):
        ep.chat(**body)
    assert ep.prompts == []


def test_a_template_whose_call_syntax_is_unknown_refuses_a_forced_call_in_one_line():
    """Gemma 4 writes calls in its own syntax (no parser reads it): "required" is a 400, auto is served."""
    if not (TEMPLATES / "gemma4.jinja").exists():
        pytest.skip("trl ships no gemma4 template")
    tok = char_tokenizer((TEMPLATES / "gemma4.jinja").read_text(), QWEN)
    ep = Endpoint(tok, lambda ctx: ANSWER)
    with pytest.raises(BadRequest) as exc:
        ep.chat(tool_choice="required")
    message = str(exc.value)
    assert "a format no parser reads, parsed as hermes, so rlhfkit cannot force one" in message and "\n" not in message
    assert ep.prompts == [] and ep.chat()["choices"][0]["message"]["content"] == ANSWER


@pytest.mark.parametrize("family", list(CUT))
def test_parallel_tool_calls_false_keeps_a_turn_of_one_call_whole(family):
    """Nothing but the turn's end follows the first call: the sample is kept as sampled, its end token trained
    (cut, the model would never be taught to end its turn after a call)."""
    tok = FAMILIES[family][0]()
    one = turn(family, ADD)
    ep = Endpoint(tok, lambda ctx: one)
    [reply] = ep.chat(parallel_tool_calls=False)["choices"]
    assert reply["token_ids"] == ids(tok, one) and calls_of(reply) == [ADD] and reply["finish_reason"] == "tool_calls"
    assert ep.trajectories()[0].response_ids.tolist() == ids(tok, one)


def test_closing_tags_a_policy_writes_in_the_forced_calls_arguments_do_not_move_the_cut():
    """`</tool_call>` in a string argument of the only call: nothing is cut (the reply is the one parallel calls
    get); `</think>` in the forced call's arguments: the forced call holds no reasoning, the cut stays after it."""
    tok = FAMILIES["qwen2_5"][0]()
    named, choice = FAMILIES["qwen2_5"][5], {"type": "function", "function": {"name": "add"}}
    inside = ' {"a": "x</tool_call>y", "b": 4}}\n</tool_call><|im_end|>'
    ep = Endpoint(tok, writes_after(named, inside))
    cut, whole = [ep.chat(tool_choice=choice, parallel_tool_calls=p)["choices"][0] for p in (False, True)]
    assert cut["token_ids"] == whole["token_ids"] == ids(tok, inside) and cut["message"] == whole["message"]
    think = ' {"a": "</think>", "b": 4}}\n</tool_call>'
    ep = Endpoint(tok, writes_after(named, think + "\n" + hermes(*NEG) + "<|im_end|>"))
    [one] = ep.chat(tool_choice=choice, parallel_tool_calls=False)["choices"]
    assert one["token_ids"] == ids(tok, think) and calls_of(one) == [("add", {"a": "</think>", "b": 4})]


def test_a_stop_string_in_the_forced_opening_leaves_the_replys_text_whole():
    """Stop strings are looked for in the sampled text, as the sampled tokens are cut: not in the forced opening,
    which is the prompt's (a model that wrote a malformed call gets its whole text back, up to the stop)."""
    tok = FAMILIES["qwen2_5"][0]()
    ep = Endpoint(tok, writes_after("<tool_call>\n", '{"name": "add", "arguments": {"a": 3\n</tool_call><|im_end|>'))
    [reply] = ep.chat(tool_choice="required", stop=["\n"])["choices"]
    assert reply["token_ids"] == ids(tok, '{"name": "add", "arguments": {"a": 3\n')
    assert not reply["message"]["tool_calls"]
    assert reply["message"]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 3'


def test_a_call_forced_on_every_turn_trains_none_of_the_forced_openings():
    """A client that asks for a call on every turn ("required", as smolagents): the second turn's opening, after
    the tool's result, is context (loss mask 0) like the first's, and the episode stays one trajectory."""
    tok = FAMILIES["qwen2_5"][0]()
    opening = "<tool_call>\n"
    first, second = [hermes(*c)[len(opening):] + "<|im_end|>" for c in (ADD, NEG)]
    ep = Endpoint(tok, lambda ctx: (second if "<tool_response>" in ctx else first) if ctx.endswith(opening) else ANSWER)
    r1 = ep.chat(tool_choice="required")["choices"][0]
    [call] = r1["message"]["tool_calls"]
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": "7"}]
    body = asyncio.run(ep.completions.chat(ep.e, {"messages": msgs, "tools": TOOLS, "tool_choice": "required"}))
    [r2] = body["choices"]
    assert calls_of(r2) == [NEG] and body["prompt_token_ids"][-len(opening):] == ids(tok, opening)
    [traj] = ep.trajectories()
    response, mask = traj.response_ids.tolist(), traj.loss_mask.tolist()
    assert traj.prompt_ids.tolist() + response == body["prompt_token_ids"] + r2["token_ids"]
    assert [t for t, m in zip(response, mask) if m] == r1["token_ids"] + r2["token_ids"]


def test_a_policy_that_reopens_the_forced_mistral_call_keeps_its_first_written_call():
    """Mistral v11's call ends where the next `[TOOL_CALLS]` opens: a model that writes one right after the forced
    opening (an empty call) is cut before its own second call, not to nothing."""
    tok = FAMILIES["mistral_v11"][0]()
    first = v11(*NEG)
    ep = Endpoint(tok, writes_after("[TOOL_CALLS]", first + v11(*ADD) + "</s>"))
    [one] = ep.chat(tool_choice="required", parallel_tool_calls=False)["choices"]
    assert one["token_ids"] == ids(tok, first) and calls_of(one) == [NEG]
