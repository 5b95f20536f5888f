"""Constrained sampling (structured outputs) in the HF engine, on a tiny random Llama over a character-level
tokenizer that has JSON's characters: at temperature 1 every constrained sample is JSON valid under its schema
(the same call without the constraint gives no JSON), each of a prompt's samples has its own grammar state,
unconstrained rows sample bit for bit as without constraints, and the recorded logprobs are the model's own
(the trainer's forward). The vLLM engine's kwargs carry the schema to vLLM's structured outputs."""

import json
import sys
from types import SimpleNamespace

import pytest
import torch

llguidance = pytest.importorskip("llguidance")

from rlhfkit.data.batch import collate  # noqa: E402
from rlhfkit.models import response_logprobs  # noqa: E402
from rlhfkit.rollout import vllm as V  # noqa: E402
from rlhfkit.rollout.base import SamplingParams  # noqa: E402
from rlhfkit.rollout.constrained import Constraint, ConstraintError, Grammars  # noqa: E402
from rlhfkit.rollout.hf import HFEngine  # noqa: E402
from tests.unit.agents.conftest import tiny_chat_model  # noqa: E402

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
PARAMS = SamplingParams(max_new_tokens=160, n=4, temperature=1.0)


@pytest.fixture(scope="module")
def tiny_json():
    """A tiny Llama (random, seeded) over `char_tokenizer` (printable characters, <|im_end|> as EOS)."""
    model, tok = tiny_chat_model()
    return model.eval(), tok


def matches(text: str, schema: dict = SCHEMA) -> bool:
    """Whether `text` is JSON valid under `schema` (jsonschema when installed, else SCHEMA's checks by hand)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    try:
        import jsonschema
    except ImportError:
        return isinstance(value, dict) and set(value) == {"n"} and type(value["n"]) is int
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def texts(tok, trajs) -> list[str]:
    return [tok.decode(t.response_ids, skip_special_tokens=True) for t in trajs]


def prompt_of(tok, text="hi"):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_every_constrained_sample_is_json_of_the_schema_and_unconstrained_ones_are_not(tiny_json):
    model, tok = tiny_json
    engine, c = HFEngine(model, tok), Constraint.json_schema(SCHEMA)
    for seed in range(4):
        trajs = engine.generate([prompt_of(tok)], PARAMS, seeds=[seed], constraints=[c])
        out = texts(tok, trajs)
        assert all(matches(x) for x in out), out
        assert all(t.finish_reason == "stop" and t.response_ids[-1] == tok.eos_token_id for t in trajs)
        assert len(set(out)) > 1  # each sample follows its own grammar state
        free = texts(tok, engine.generate([prompt_of(tok)], PARAMS, seeds=[seed]))
        assert not any(matches(x) for x in free), free


def test_json_object_gives_an_object(tiny_json):
    model, tok = tiny_json
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=300, n=4, temperature=1.0)
    trajs = engine.generate([prompt_of(tok)], params, seeds=[5], constraints=[Constraint.json_object()])
    done = [x for x, t in zip(texts(tok, trajs), trajs) if t.finish_reason == "stop"]  # random keys run long
    assert done and all(isinstance(json.loads(x), dict) for x in done), done


def test_the_recorded_logprobs_are_the_models_own(tiny_json):
    """The grammar masks the choice only: each token's logprob is log_softmax over the whole vocabulary, what the
    trainer's forward computes (so the masked tokens' probability is missing from the sum: below 1)."""
    model, tok = tiny_json
    c = Constraint.json_schema(SCHEMA)
    trajs = HFEngine(model, tok).generate([prompt_of(tok)], PARAMS, seeds=[3], constraints=[c])
    batch = collate(trajs, pad_id=tok.pad_token_id)
    logp, _ = response_logprobs(model, batch, temperature=1.0)
    for i, t in enumerate(trajs):
        torch.testing.assert_close(t.logprobs, logp[i][batch.loss_mask[i]], atol=1e-5, rtol=0)
    assert max(t.logprobs.max().item() for t in trajs) < -0.5  # a random model: no token is near certain


def test_sample_chooses_among_the_allowed_tokens_and_keeps_the_models_logprob():
    """Worked by hand: logits [0, ln 2, ln 4] (probabilities 1/7, 2/7, 4/7) with token 2 masked: greedy takes token 1
    and records log(2/7); a sample over the allowed ones never takes token 2."""
    from rlhfkit.rollout.sampling import sample

    logits = torch.log(torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]]))
    allowed = torch.tensor([[True, True, False], [True, False, False]])
    tok, lp = sample(logits, SamplingParams(temperature=0.0), None, allowed=allowed)
    assert tok.tolist() == [1, 0]
    torch.testing.assert_close(lp, torch.log(torch.tensor([2 / 7, 1 / 7])))
    u = torch.linspace(0, 0.999, 50)
    tok, lp = sample(logits[:1].expand(50, 3), SamplingParams(temperature=1.0), None, u,
                     allowed=allowed[:1].expand(50, 3))
    assert set(tok.tolist()) == {0, 1} and (tok == 1).sum() > (tok == 0).sum()  # 2:1 among the allowed
    torch.testing.assert_close(lp, torch.log(torch.tensor([1 / 7, 2 / 7]))[tok])


def test_a_free_row_beside_a_masked_one_draws_as_in_a_batch_without_masks():
    """softmax(x) and exp(log_softmax(x)) differ in the last bits: a uniform on a boundary of the second (the
    unmasked path's) takes another token under the first. Row 0 (every token allowed) must get the token it gets
    in a batch without `allowed`, row 1 (masked) its own."""
    from rlhfkit.rollout.sampling import sample

    torch.manual_seed(0)
    logits = torch.randn(1, 64) * 3
    params = SamplingParams(temperature=0.7)
    cdf = torch.log_softmax(logits / 0.7, -1).exp()[0].double().cumsum(0)
    u = torch.tensor([float(cdf[2] / cdf[-1])])  # the boundary between tokens 2 and 3
    alone, lp_alone = sample(logits, params, None, u)
    allowed = torch.ones(2, 64, dtype=torch.bool)
    allowed[1, 5:] = False
    tok, lp = sample(logits.expand(2, 64), params, None, u.expand(2), allowed=allowed)
    assert tok[0] == alone and lp[0] == lp_alone and tok[1] < 5


def test_unconstrained_rows_sample_bit_for_bit_as_without_constraints(tiny_json):
    model, tok = tiny_json
    engine = HFEngine(model, tok)
    prompts, params = [prompt_of(tok, "ab"), prompt_of(tok, "xyz")], SamplingParams(max_new_tokens=12, n=2,
                                                                                    temperature=1.0)
    plain = engine.generate(prompts, params, seeds=[1, 2])
    assert engine.start(prompts, params, seeds=[1, 2], constraints=[None, None]).constraints is None  # no matchers
    nones = engine.generate(prompts, params, seeds=[1, 2], constraints=[None, None])
    mixed = engine.generate(prompts, params, seeds=[1, 2], constraints=[Constraint.json_schema(SCHEMA), None])
    for a, b in zip(plain, nones):
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    for a, b in zip(plain[2:], mixed[2:]):  # prompt 1's rows beside a constrained prompt
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    assert all(x.startswith("{") for x in texts(tok, mixed[:2]))


def test_a_complete_grammar_allows_only_the_stop_tokens(tiny_json):
    model, tok = tiny_json
    stop_ids = torch.tensor([tok.eos_token_id, 7])
    rows = Grammars(tok).rows([Constraint.json_schema(SCHEMA), None], 1, stop_ids)
    m = rows.matchers[0]
    vocab = len(tok)
    first = rows.allowed(torch.tensor([0, 1]), vocab, "cpu")
    assert first[1].all() and first[0, tok.convert_tokens_to_ids("{")] and not first[0, stop_ids].any()
    assert not first[0, tok.convert_tokens_to_ids("a")]
    assert m.consume_tokens(prompt_of(tok, '{"n":12}'))
    [done] = rows.allowed(torch.tensor([0]), vocab, "cpu")
    assert done.nonzero().squeeze(-1).tolist() == sorted(stop_ids.tolist())


def test_a_chunk_is_constrained_while_a_constrained_row_is_in_its_batch(tiny_json):
    _, tok = tiny_json
    rows = Grammars(tok).rows([None, Constraint.json_object(), None], 1, torch.tensor([tok.eos_token_id]))
    assert rows.constrains(torch.tensor([0, 1, 2])) and rows.constrains(torch.tensor([1]))
    assert not rows.constrains(torch.tensor([0, 2]))  # the decode loop then drops the matchers


def test_vllm_gets_the_schema_as_its_structured_outputs(monkeypatch):
    p = SamplingParams(max_new_tokens=5)
    assert "structured_outputs" not in V.sampling_kwargs(p, [2], seed=1)
    kw = V.sampling_kwargs(p, [2], seed=1, constraint=Constraint.json_schema(SCHEMA))
    assert kw["structured_outputs"] == {"json": SCHEMA}
    assert V.sampling_kwargs(p, [2], seed=1, constraint=Constraint.json_object())["structured_outputs"] == {
        "json_object": True}
    fake = SimpleNamespace(SamplingParams=lambda **k: k)
    params_module = SimpleNamespace(StructuredOutputsParams=lambda **k: ("SO", k))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params_module)
    assert V.vllm_params(fake, kw)["structured_outputs"] == ("SO", {"json": SCHEMA})
    assert V.vllm_params(fake, V.sampling_kwargs(p, [2], seed=1)) == V.sampling_kwargs(p, [2], seed=1)


def test_the_schemas_property_order_is_the_replys(tiny_json):
    """As OpenAI and vLLM, properties come in the schema's order (a `reasoning` field before its `answer`): the
    constraint keeps the client's key order, the grammar takes {"b", "a"} in that order and refuses the other."""
    _, tok = tiny_json
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
              "required": ["b", "a"], "additionalProperties": False}
    grammars, stop_ids = Grammars(tok), torch.tensor([tok.eos_token_id])
    [m] = grammars.rows([Constraint.json_schema(schema)], 1, stop_ids).matchers
    assert m.consume_tokens(prompt_of(tok, '{"b":1,"a":2}')) and m.is_accepting()
    [m] = grammars.rows([Constraint.json_schema(schema)], 1, stop_ids).matchers
    assert not m.consume_tokens(prompt_of(tok, '{"a":'))


def test_logits_past_the_tokenizers_vocabulary_are_masked_in_constrained_rows_only(tiny_json):
    """A model whose logits have more rows than its tokenizer has ids (Qwen's padded embeddings): a constrained
    row may not take the ids past the tokenizer's, an unconstrained row may (its mask is all true)."""
    _, tok = tiny_json
    rows = Grammars(tok).rows([Constraint.json_object(), None], 1, torch.tensor([tok.eos_token_id]))
    mask = rows.allowed(torch.tensor([0, 1]), len(tok) + 40, "cpu")
    assert mask.shape == (2, len(tok) + 40) and mask[1].all() and not mask[0, len(tok):].any()
    assert mask[0, tok.convert_tokens_to_ids("{")] and not mask[0, tok.convert_tokens_to_ids("a")]


def test_a_schemas_grammar_is_compiled_once_for_all_its_rows_and_calls(tiny_json, monkeypatch):
    """Compiling a matcher costs what the schema's size does (a 2000-property schema: 0.13 s each); the rows of a
    chunk, and later generations under the same schema, copy one compiled matcher, each with its own state."""
    _, tok = tiny_json
    grammars, stop_ids = Grammars(tok), torch.tensor([tok.eos_token_id])
    grammars.rows([Constraint.json_object()], 1, stop_ids)  # the llguidance tokenizer, built once
    built, real = [], llguidance.LLMatcher

    class Counted:  # llguidance's LLMatcher, its constructions counted
        grammar_from_json_schema, validate_grammar = real.grammar_from_json_schema, real.validate_grammar

        def __new__(cls, *args, **kwargs):
            built.append(args[1])
            return real(*args, **kwargs)

    monkeypatch.setattr(llguidance, "LLMatcher", Counted)
    c = Constraint.json_schema(SCHEMA)
    first = grammars.rows([c, None, c], 3, stop_ids).matchers
    again = grammars.rows([c], 2, stop_ids).matchers
    assert len(built) == 1
    assert first[0].consume_tokens(prompt_of(tok, '{"n":1}')) and first[0].is_accepting()
    assert not any(m.is_accepting() for m in first[1:3] + first[6:] + again if m is not None)


def test_a_schema_is_validated_once_for_all_the_requests_that_send_it(monkeypatch):
    """The endpoint checks each request's schema on its event loop (0.14 s for 2000 properties): an agent whose
    every call sends the same schema has it validated once."""
    from rlhfkit.rollout.constrained import check

    validated, real = [], llguidance.LLMatcher

    class Counted:  # llguidance's LLMatcher, its grammar validations counted
        grammar_from_json_schema = real.grammar_from_json_schema

        @staticmethod
        def validate_grammar(text):
            validated.append(text)
            return real.validate_grammar(text)

    monkeypatch.setattr(llguidance, "LLMatcher", Counted)
    schema = {"type": "object", "properties": {"validated_once": {"type": "boolean"}}}
    for _ in range(3):
        check(Constraint.json_schema(schema))
    assert len(validated) == 1
    for _ in range(2):
        with pytest.raises(ConstraintError, match="Invalid type: objekt"):  # a refusal is not kept
            check(Constraint.json_schema({"type": "objekt", "title": "validated_once"}))
    assert len(validated) == 3


def test_a_refused_schema_is_named_in_one_line_with_what_is_wrong():
    """llguidance's message spans lines (a regex error points at the pattern): all of it, on one line."""
    from rlhfkit.rollout.constrained import check

    with pytest.raises(ConstraintError, match=r"regex parse error: \(\( \^ error: unclosed group") as info:
        check(Constraint.json_schema({"type": "string", "pattern": "(("}))
    assert "\n" not in str(info.value)
