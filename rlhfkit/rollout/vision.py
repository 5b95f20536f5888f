"""`VisionEngine`: the HF engine for vision-language models, prompts with images.

Each prompt is its own chunk: its prefill runs the model over the prompt's ids with its image
tensors (`data.images.VisionInputs`: the vision tower encodes the images once, for all n samples),
then the KV cache is copied to the n samples and they decode from it as in `HFEngine`, with the
same samplers, per-prompt seeds, row dropping and version stamps. A prompt without images runs as
in `HFEngine`.

Positions: a model with 3-D rotary positions (Qwen2-VL's M-RoPE: time, height and width of each
image token) gets them from its own `get_rope_index` at the prefill; its decode positions are
then the text positions shifted by the prompt's rope delta (the highest 3-D position + 1 minus
the prompt length), as transformers' generate computes them. They are passed explicitly, so the
model's cached `rope_deltas` (which a training forward in between overwrites) are never read.

Placeholder tokens are never sampled: a response holding one would be taken by the trainer's
forward as a slot for image features (and fail, or be filled with an image). They are removed
from the choice like a top-k truncation: the logprob of the sampled token stays the one over the
whole vocabulary, which the trainer computes (a trained VLM gives them no probability anyway).

The per-token type ids (`models.vision.token_type_kwargs`) go with the prefill only: every
decoded token is text. A model decoded without a cache (its layers' cache cannot be copied per
sample: Qwen3.5's Gated DeltaNet) runs the whole sequences at every step, and each step gets what
the prefill got: the images once per row, the token types and the 3-D positions of the sequences.
Each trajectory carries its prompt's VisionInputs in `info["vision"]` (shared by its samples), from
which the trainer's forward gets the same images.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlhfkit.data.images import VisionInputs
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import ConfigError
from rlhfkit.models.precision import to_device
from rlhfkit.models.vision import PER_TOKEN_KEYS, base_model, concat_vision, token_type_kwargs
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.decode_state import DecodeState, PartialGeneration
from rlhfkit.rollout.hf import HFEngine


@dataclass
class VisionGeneration(PartialGeneration):
    """A PartialGeneration whose prompts carry their image tensors (None: a text-only prompt)."""

    vision: list = field(default_factory=list)


class VisionEngine(HFEngine):
    """HFEngine over a transformers vision-language model; `generate(..., vision=[...])` takes one
    VisionInputs (or None) per prompt. Arguments as HFEngine's. The model's image and video
    placeholder tokens are never sampled (`banned_ids`; module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer, **kwargs):
        super().__init__(model, tokenizer, **kwargs)
        self.keeps_turns = False  # a prompt's images are prefilled with it: no turn's cache is kept
        ids = placeholder_ids(model.config)
        self.banned_ids = torch.tensor(ids, dtype=torch.long) if ids else None

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 generator: torch.Generator | None = None, group_ids: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None, vision: Sequence | None = None,
                 constraints: Sequence | None = None) -> list[Trajectory]:
        """As HFEngine.generate; `vision[i]`: prompt i's image tensors or None."""
        return self.resume(self.start(prompts, params, generator, group_ids, seeds, vision, constraints))

    def start(self, prompts, params, generator=None, group_ids=None, seeds=None, vision=None,
              constraints=None) -> VisionGeneration:
        gen = super().start(prompts, params, generator, group_ids, seeds, constraints=constraints)
        vision = list(vision) if vision is not None else [None] * len(prompts)
        if len(vision) != len(prompts):
            raise ConfigError(f"vision has {len(vision)} entries for {len(prompts)} prompts")
        chunks = [(i, i + 1) for i in range(len(prompts))]  # one prompt (its images) per prefill
        return VisionGeneration(gen.prompts, gen.params, gen.stop_ids, gen.generator, gen.seeds, gen.group_ids,
                                chunks, constraints=gen.constraints, vision=vision)

    def _prefill_chunk(self, gen: PartialGeneration, start: int, stop: int, gens) -> DecodeState:
        vision = gen.vision[start] if isinstance(gen, VisionGeneration) else None
        if vision is None:
            return super()._prefill_chunk(gen, start, stop, gens)
        ids = torch.tensor([gen.prompts[start]], dtype=torch.long, device=self.device)
        extra, delta = self._image_inputs(ids, vision)
        if self.row_hook is not None:
            self.row_hook([start])
        state = self._prefill([gen.prompts[start]], gen.params, gen.generator, gens, extra=extra)
        state.next_pos = state.next_pos + delta
        state.inputs, state.first = vision, start
        state.step_inputs = {k: to_device(v[:, -1:], self.device) for k, v in vision.tensors.items()
                             if k in PER_TOKEN_KEYS} or None
        return state

    def _image_inputs(self, ids: torch.Tensor, vision: VisionInputs,
                      prompt: int | None = None) -> tuple[dict, int]:
        """(the forward's image inputs of rows `ids` [b, L] of one prompt with images `vision`: the image
        tensors once per row, the token type ids (a prefix LM's: the first `prompt` tokens its prefix, all
        of them without `prompt`), the model's own 3-D positions where it has them; the rope delta of the
        decode positions)."""
        device = self.device
        rows = ids.shape[0]
        tensors = concat_vision([vision] * rows, ids.shape[1])
        extra = {k: to_device(v, device) for k, v in tensors.items()}
        lengths = None if prompt is None else torch.full((rows,), prompt, dtype=torch.long)
        extra.update(token_type_kwargs(self.model, ids, lengths))
        rope = getattr(base_model(self.model), "get_rope_index", None)
        if rope is None:
            return extra, 0
        positions, deltas = rope(**_rope_arguments(rope, ids, torch.ones_like(ids), extra))
        extra["position_ids"] = positions
        return extra, int(deltas.reshape(-1)[0])

    def _uncached_logits(self, s: DecodeState) -> torch.Tensor:
        """Without a cache (a model with linear-attention layers, e.g. Qwen3.5) each step runs the whole
        sequences: with their images, token types and 3-D positions, as the prefill (the tower runs again)."""
        if s.inputs is None:
            return super()._uncached_logits(s)
        extra, _ = self._image_inputs(s.seqs, s.inputs, prompt=s.prefill_width)
        return self._forward(s.seqs, s.attention_mask, None, None, extra=extra)

    def _decode_extra(self, s: DecodeState) -> dict | None:
        """A cached decode step's per-token image inputs (Llama 3.2 Vision's cross-attention mask): the prompt's
        last token's (`s.step_inputs`, on the device since the prefill), for each row's new token."""
        if s.step_inputs is None:
            return None
        rows = s.attention_mask.shape[0]
        return {k: v.expand(rows, *v.shape[1:]).contiguous() for k, v in s.step_inputs.items()}

    def _trajectories(self, gen: PartialGeneration) -> list[Trajectory]:
        out = super()._trajectories(gen)
        n = gen.params.n
        for k, t in enumerate(out):
            vision = gen.vision[k // n] if isinstance(gen, VisionGeneration) else None
            if vision is not None:
                t.info["vision"] = vision
        return out


def placeholder_ids(config) -> list[int]:
    """The token ids that stand for image or video features in `config`'s model."""
    names = ("image_token_id", "image_token_index", "video_token_id")
    return sorted({int(v) for v in (getattr(config, n, None) for n in names) if v is not None})


def merge_vision(first: VisionInputs | None, second: VisionInputs | None) -> VisionInputs | None:
    """The image tensors of a context holding `first`'s images and then `second`'s (either may be None):
    each key's tensors concatenated, as one row of the trainer's forward takes them."""
    if first is None or second is None:
        return first if second is None else second
    return VisionInputs(concat_vision([first, second]), first.num_images + second.num_images,
                        first.images + second.images)


def _rope_arguments(rope, ids: torch.Tensor, mask: torch.Tensor, extra: dict) -> dict:
    """The keyword arguments `rope` (a model's get_rope_index) takes, from the prefill's inputs."""
    takes = inspect.signature(rope).parameters
    args = {"input_ids": ids, "attention_mask": mask}
    args.update({k: v for k, v in extra.items() if k in takes})
    return {k: v for k, v in args.items() if k in takes}
