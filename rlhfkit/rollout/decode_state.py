"""The state of an `HFEngine` generation between its calls: `PartialGeneration` (the prompts cut into
chunks, the finished chunks and the one in progress) and `DecodeState` (one chunk's tokens, KV cache,
samplers and finished rows). Kept apart from the engine's loop (rollout/hf.py) so that engines built
on it (rollout/vision.py) share the same records."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlhfkit.rollout.base import SamplingParams


@dataclass
class DecodeState:
    """One chunk of a generation between two `HFEngine.resume` calls: B = prompts x n rows, each
    with up to max_new tokens. `logits` [b, V] are the next-token logits of the b rows still
    decoding (`active` [b], in the order of the KV `cache` rows; `seqs` [b, P + step] replaces the
    cache for a model without one), computed by the weights of `logits_version`; `rows` is `active` on
    the device and `alive` [b] marks the rows with no stop token yet (a finished row stays in the
    batch until the next stop check). tokens, logprobs, versions [B, max_new]; lengths, stopped [B]:
    on the model's device until the chunk is finished, then on the CPU. `width`: the prompt width
    of a static cache (None for a growing one). The sampler is the generation's own `generator`
    (its state carries over between calls) or, with per-prompt seeds, `uniforms` [prompts, max_new, n]
    on the device: every draw of the chunk's per-prompt generators, made once at the prefill."""

    params: SamplingParams
    generator: torch.Generator | None
    uniforms: torch.Tensor | None
    cache: object
    seqs: torch.Tensor | None
    logits: torch.Tensor
    logits_version: int
    attention_mask: torch.Tensor
    next_pos: torch.Tensor
    active: torch.Tensor
    rows: torch.Tensor
    alive: torch.Tensor
    finite: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    versions: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor
    width: int | None = None
    step: int = 0
    finished: bool = False
    keep: list[tuple[object, list[int]]] | None = None  # per row: its episode key and prompt (kept turns)
    prefill_width: int = 0  # the cache columns of the prefill (the row's response tokens follow)
    kv_version: int = 0  # the weights that computed the cache (rows are kept only under them)
    first: int = 0  # the generation's index of the chunk's first prompt (row r is prompt first + r // n)
    inputs: object = None  # an engine's inputs of the chunk beyond its ids (a VisionEngine's image tensors)
    step_inputs: dict | None = None  # and of each cached decode step, [1, 1, ...] each (per-token image inputs)
    prompt_experts: list | None = None  # with record_experts: per prompt its tokens' experts [P, layers, k]
    experts: torch.Tensor | None = None  # and per row each response token's [B, max_new, layers, k]
    seen: torch.Tensor | None = None  # with a repetition penalty: per row the tokens of its prompt and response [B, V]
    room: torch.Tensor | None = None  # per row the response tokens its model's learned positions leave [B] (or None)
    matchers: object = None  # with constraints: the rows' grammar matchers (rollout.constrained.RowMatchers)


@dataclass
class PartialGeneration:
    """A generation that `HFEngine.resume` runs, possibly across several calls (and weight
    updates): its prompts cut into chunks, the finished chunks' states and the one in progress."""

    prompts: list[list[int]]
    params: SamplingParams
    stop_ids: torch.Tensor
    generator: torch.Generator | None
    seeds: list[int] | None
    group_ids: list[int] | None
    chunks: list[tuple[int, int]]
    done: list[DecodeState] = field(default_factory=list)
    state: DecodeState | None = None
    episode_keys: list | None = None
    constraints: list | None = None  # per prompt its Constraint or None (None: no prompt is constrained)
