"""Constrained sampling (structured outputs): a response that must be JSON, of a given JSON schema or any
object, sampled under a grammar (the `structured` extra: `pip install 'rlhfkit[structured]'`, llguidance).

`Constraint` says what a prompt's responses must be; an engine's `generate(..., constraints=[...])` takes one
per prompt (None: unconstrained). The HF engine builds one llguidance matcher per sampled row (each of a
prompt's n samples has its own state): at each decode step the row's token is chosen among the tokens its
grammar allows, the matcher then takes the token; once the grammar is complete only the stop tokens (EOS
and the request's stop ids) remain, and where it may end or go on, the stop tokens are allowed beside its
tokens. As vLLM's raw logprobs, the recorded logprob is the model's own, log_softmax(logits / T) over the whole
vocabulary (the mask is a truncation like top-k): the RL ratio then compares the model's own logprobs, those
the trainer's forward computes, and a constrained sample is a sample the unconstrained policy would give
less often. The vLLM engine hands the schema to vLLM's own structured-output sampling parameters
(`vllm_structured_outputs`). A response cut by `max_new_tokens` before its grammar ends is not valid JSON
(finish reason "length"), as with OpenAI and vLLM.

Rows without a constraint cost nothing: a chunk with none keeps no matchers and the decode loop checks one
attribute per step. A constrained chunk reads its sampled tokens back to the host at every step (free on
the CPU; a sync per step on a GPU) until its last constrained row finishes (its matchers are then dropped).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.errors import ConfigError

INSTALL = "pip install 'rlhfkit[structured]'"


class ConstraintError(ConfigError):
    """A constraint that cannot be sampled under: a schema llguidance does not take, or no llguidance."""


@dataclass(frozen=True)
class Constraint:
    """What a prompt's responses must be: JSON valid under the JSON schema `schema` (as JSON text, so the
    constraint is hashable; its keys in the client's order, which the grammar gives the properties), or, with
    `schema` None, any JSON object (OpenAI's json_object)."""

    schema: str | None = None

    @classmethod
    def json_schema(cls, schema: dict) -> Constraint:
        return cls(json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(None)

    def schema_dict(self) -> dict | None:
        return None if self.schema is None else json.loads(self.schema)


def _llguidance():
    try:
        import llguidance  # noqa: PLC0415 - the structured extra
    except ImportError as exc:
        raise ConstraintError(f"structured outputs (response_format json_object / json_schema) need llguidance: "
                              f"{INSTALL}") from exc
    return llguidance


def grammar(c: Constraint) -> str:
    """The llguidance grammar of `c` (a JSON schema grammar, whitespace between tokens allowed as vLLM's
    guidance backend does by default); `ConstraintError` names what is wrong with the schema."""
    return _grammar(_llguidance(), c)


@functools.lru_cache(maxsize=64)
def _grammar(llg, c: Constraint) -> str:
    """`grammar`, validated once per constraint (an agent's calls send the same schema again and again)."""
    try:
        text = llg.LLMatcher.grammar_from_json_schema(c.schema if c.schema is not None else '{"type": "object"}')
    except ValueError as exc:
        raise ConstraintError(f"the JSON schema is not a JSON object: {exc}") from exc
    error = llg.LLMatcher.validate_grammar(text)
    if error and not error.startswith("WARNING"):
        raise ConstraintError(f"the JSON schema cannot be sampled under: {' '.join(error.split())[:300]}")
    return text


def check(c: Constraint) -> None:
    """Raise `ConstraintError` when `c` cannot be sampled under (no llguidance, a schema it refuses)."""
    grammar(c)


def vllm_structured_outputs(c: Constraint) -> dict:
    """Keyword arguments of vLLM's `StructuredOutputsParams` for `c`: {"json": schema} or {"json_object": True}."""
    return {"json_object": True} if c.schema is None else {"json": c.schema_dict()}


class _TokenBytes:
    """A tokenizer as llguidance's `TokenizerWrapper` reads it: each id's bytes (its text decoded alone), the
    special ids, EOS, and encoding a string."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eos_token_id, self.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
        self.special_token_ids = sorted(set(tokenizer.all_special_ids))
        self.tokens = [tokenizer.decode([i], skip_special_tokens=False).encode() for i in range(len(tokenizer))]

    def __call__(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])


def ll_tokenizer(llg, tokenizer):
    """llguidance's tokenizer of a HF one: read from its tokenizers JSON where llguidance knows its decoder
    (byte-level BPE, byte fallback), else from each id's decoded text (a word- or character-level vocabulary)."""
    import llguidance.hf  # noqa: PLC0415 - the structured extra

    try:
        return llguidance.hf.from_tokenizer(tokenizer)
    except ValueError:
        pass
    try:
        return llg.LLTokenizer(llg.TokenizerWrapper(_TokenBytes(tokenizer)))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConstraintError(f"structured outputs cannot read the policy's tokenizer "
                              f"({type(tokenizer).__name__}): {exc}") from exc


class Grammars:
    """An engine's llguidance tokenizer (built once, on the first constrained generation) and a compiled matcher of
    each of its `KEEP` latest constraints, never fed: a row's matcher is a copy of it (compiling costs what the
    schema's size does, 0.13 s for 2000 properties; a copy, microseconds)."""

    KEEP = 64

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._lltok = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()

    def matcher(self, c: Constraint):
        compiled = self._compiled.pop(c, None)
        if compiled is None:
            llg = _llguidance()
            if self._lltok is None:
                self._lltok = ll_tokenizer(llg, self.tokenizer)
            compiled = llg.LLMatcher(self._lltok, grammar(c), log_level=0)
            if compiled.is_error():
                error = " ".join(compiled.get_error().split())
                raise ConstraintError(f"the JSON schema cannot be sampled under: {error[:300]}")
        self._compiled[c] = compiled  # the latest used last
        while len(self._compiled) > self.KEEP:
            self._compiled.popitem(last=False)
        return compiled.deep_copy()

    def rows(self, constraints: Sequence[Constraint | None], n: int, stop_ids: torch.Tensor) -> RowMatchers | None:
        """The matchers of a chunk whose prompt i has `constraints[i]` (its n rows each one of their own);
        None when no prompt is constrained."""
        if all(c is None for c in constraints):
            return None
        matchers = [None if c is None else self.matcher(c) for c in constraints for _ in range(n)]
        return RowMatchers(matchers, stop_ids, self._lltok.vocab_size)


class RowMatchers:
    """A chunk's grammar matchers, one per row (None: an unconstrained row); `allowed` masks a decode step's
    logits, `advance` feeds the matchers the step's sampled tokens. `vocab` is llguidance's vocabulary size."""

    def __init__(self, matchers: list[Any], stop_ids: torch.Tensor, vocab: int):
        self.matchers = matchers
        self.stop_ids, self._stops = stop_ids, set(stop_ids.tolist())
        self._bits = torch.empty(len(matchers), -(-vocab // 32), dtype=torch.int32)  # a step's packed masks
        self._powers = 1 << torch.arange(8, dtype=torch.uint8)
        self._on: tuple | None = None  # (device, bit powers, stop ids) there: moved once, not at every step

    def constrains(self, active: torch.Tensor) -> bool:
        """Whether any of the chunk rows `active` has a grammar (else the decode loop drops the matchers)."""
        return any(self.matchers[row] is not None for row in active.tolist())

    def allowed(self, active: torch.Tensor, vocab: int, device) -> torch.Tensor:
        """[len(active), vocab] bool on `device`: per batch row (its chunk row in `active`) the tokens it may take,
        the stop tokens too where its grammar may end (or is complete: the stop tokens alone). The matchers write
        their packed masks into one buffer, unpacked at once on `device` (unpacked per row, it cost 3x more)."""
        from llguidance.torch import fill_next_token_bitmask  # noqa: PLC0415 - the structured extra

        rows = active.tolist()
        bits, free, ends = self._bits[: len(rows)], [False] * len(rows), [False] * len(rows)
        for pos, row in enumerate(rows):
            m = self.matchers[row]
            if m is None:
                bits[pos], free[pos] = -1, True
            elif m.is_stopped():  # complete (or in error): the response ends
                bits[pos], ends[pos] = 0, True
            else:
                fill_next_token_bitmask(m, bits, pos)
                ends[pos] = m.is_accepting()
        ends_t = torch.tensor(ends) | ~bits.ne(0).any(dim=-1)  # a grammar that allows nothing ends too
        if self._on is None or self._on[0] != device:
            self._on = (device, self._powers.to(device), self.stop_ids.to(device))
        _, powers, stop_ids = self._on
        packed = bits.to(device).view(torch.uint8).unsqueeze(-1)  # little-endian: token 8j + i is bit i of byte j
        allowed = (packed & powers).flatten(1).bool()
        if allowed.shape[1] < vocab:  # the model's rows past the tokenizer's: unconstrained rows only
            rest = torch.tensor(free, device=device).unsqueeze(-1).expand(-1, vocab - allowed.shape[1])
            allowed = torch.cat([allowed, rest], dim=1)
        allowed = allowed[:, :vocab]
        allowed[:, stop_ids] |= ends_t.to(device).unsqueeze(-1)
        return allowed

    def advance(self, active: torch.Tensor, tokens: torch.Tensor, alive: torch.Tensor) -> None:
        """Feed each live constrained row its sampled token (a stop token ends the row instead)."""
        for row, tok, live in zip(active.tolist(), tokens.tolist(), alive.tolist()):
            m = self.matchers[row]
            if m is not None and live and tok not in self._stops:
                m.consume_token(tok)
