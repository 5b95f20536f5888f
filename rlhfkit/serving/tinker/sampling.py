"""ModelHost's `sample` (host.py), kept in its own file: several clients' sample requests in one
engine call, each prompt through its sampler's weights, and the logprobs each request asks for
besides its samples (serving.tinker.scoring).

Prompts may hold images on a vision-language base model (serving.tinker.images): they are
expanded to their tokens and pixel tensors first, sampled by the VLM engine (rollout.vision: each
prompt prefilled with its images, its samples decoded from that cache) and scored by forwards with
the same images, so the sampled logprobs are those of a training forward over the prompt, its
images and the sample.
"""

from __future__ import annotations

import contextlib
import uuid

import torch

from rlhfkit.errors import DataError, RlhfkitError
from rlhfkit.models.lora_rows import RowAdapters
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.stops import cut_at_stop_strings, split_stops
from rlhfkit.rollout.vision import VisionEngine
from rlhfkit.serving.tinker.scoring import score
from rlhfkit.serving.tinker.wire import SampleOptions, Sequence, TopK


class SamplingMixin:
    """ModelHost's sampling methods (module docstring). They read the host's `base`, `peft`,
    `tokenizer`, `images`, `batch_tokens`, `logits`, `max_context_length`, `_sampling_target` and
    `trim_samplers`."""

    def check_prompt(self, prompt: list[int], max_tokens: int = 0) -> None:
        """DataError for a prompt without tokens, a token outside the vocabulary, or a prompt and
        `max_tokens` longer than the model's context (vLLM refuses such a request too)."""
        vocab = self.base.get_input_embeddings().num_embeddings
        if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
            raise DataError(f"prompt: needs at least one token, each in [0, {vocab})")
        context = self.max_context_length
        if context is not None and len(prompt) + max_tokens > context:
            raise DataError(f"prompt: {len(prompt)} tokens and max_tokens {max_tokens} are more than the model's "
                            f"context of {context} tokens; lower max_tokens or shorten the prompt")

    def sample(self, sessions: list[str], prompts: list[list], n: int, params: dict, seeds: list[int | None],
               options: list[SampleOptions]) -> list[tuple[list[Sequence], list[float] | None, TopK | None]
                                                     | RlhfkitError]:
        """`n` samples of each prompt (token ids, with a WireImage where an image chunk sits), prompt i
        with sampling session sessions[i]'s weights; the prompts of one module in one engine call
        (LoRA samplers and the base: the shared peft model, each row with its own adapter,
        models.lora_rows). Prompt i's samples depend only on it, its weights and seeds[i] (a random
        seed where None), so a request gives the same answer alone or batched with others. Per
        prompt its (sequences, prompt logprobs or None, prompt top-k or None), the logprobs
        options[i] asks for computed by serving.tinker.scoring, or the RlhfkitError that refused it
        (an unknown session, a bad token or image), which fails it alone."""
        out: list = [None] * len(prompts)
        inputs: dict[int, tuple] = {}  # prompt i -> (token ids, its images' tensors or None)
        groups: dict[int, tuple[torch.nn.Module, list[tuple[int, str | None]]]] = {}
        stop_ids, stop_texts = self._stops(params.get("stop"))
        sp = engine_params(params, n, stop_ids)
        for i, (session, prompt) in enumerate(zip(sessions, prompts)):
            try:
                inputs[i] = self.images.expand(prompt, "prompt")
                self.check_prompt(inputs[i][0], sp.max_new_tokens)
                module, name = self._sampling_target(session)
            except RlhfkitError as exc:
                out[i] = exc
                continue
            groups.setdefault(id(module), (module, []))[1].append((i, name))
        seeds = [seed if seed is not None else int(uuid.uuid4().int % (1 << 62)) for seed in seeds]
        for module, rows in groups.values():
            first = {name: k for k, name in enumerate(dict.fromkeys(name for _, name in rows))}
            rows.sort(key=lambda row: first[row[1]])  # each adapter's rows together: one LoRA matmul each
            idx, names = [i for i, _ in rows], [name for _, name in rows]
            trajs = self._generate(module, names, [inputs[i] for i in idx], sp, [seeds[i] for i in idx])
            for k, (i, name) in enumerate(rows):
                seqs = [cut_at_stop_strings(t, stop_texts, self.tokenizer) for t in trajs[k * n:(k + 1) * n]]
                tokens = [t.response_ids.tolist() for t in seqs]
                prompt, vision = inputs[i]
                got = score(self._score_forward(module, name, vision), prompt, tokens, options[i], sp.temperature,
                            self.batch_tokens)
                out[i] = ([Sequence(ids, t.logprobs.tolist(), "length" if t.truncated else "stop",
                                    got.sample_topk[s] if got.sample_topk is not None else None)
                           for s, (ids, t) in enumerate(zip(tokens, seqs))], got.prompt_logprobs, got.prompt_topk)
        self.trim_samplers()
        return out

    def _generate(self, module: torch.nn.Module, names: list[str | None], inputs: list[tuple], sp: SamplingParams,
                  seeds: list[int]):
        """One engine call over the prompts `inputs` ((token ids, images or None) each), prompt i's
        rows with adapter names[i] of the peft model; the VLM engine on a vision-language model."""
        prompts = [tokens for tokens, _ in inputs]
        engine_cls, extra = HFEngine, {}
        if self.images.processor is not None:
            engine_cls, extra = VisionEngine, {"vision": [vision for _, vision in inputs]}
        if module is self.peft and len(set(names)) > 1:
            with RowAdapters(module) as rows:
                engine = engine_cls(module, self.tokenizer, row_hook=lambda r: rows.set_rows([names[i] for i in r]))
                return engine.generate(prompts, sp, seeds=seeds, **extra)
        with self._one_adapter(module, names[0]):
            return engine_cls(module, self.tokenizer).generate(prompts, sp, seeds=seeds, **extra)

    def _one_adapter(self, module: torch.nn.Module, name: str | None):
        """The context of a forward of `module` with adapter `name` (None: the base under the peft model)."""
        if module is not self.peft:
            return contextlib.nullcontext()
        if name is None:
            return module.disable_adapter()
        module.set_adapter(name)
        return contextlib.nullcontext()

    def _score_forward(self, module: torch.nn.Module, name: str | None, vision):
        """`forward(rows) -> logits [b, W, V]` of `module` with adapter `name` over token rows that
        each start with a prompt whose images are `vision` (or None), without gradients."""
        def forward(rows: list[list[int]]) -> torch.Tensor:
            module.eval()
            with torch.no_grad(), self._one_adapter(module, name):
                return self.logits(module, rows, [vision] * len(rows))
        return forward

    def _stops(self, stop) -> tuple[tuple[int, ...], tuple[str, ...]]:
        if not stop:
            return (), ()
        try:
            return split_stops([stop] if isinstance(stop, (str, int)) else list(stop), self.tokenizer)
        except (TypeError, ValueError) as exc:
            raise DataError(f"sampling_params.stop: {exc}") from exc


def engine_params(params: dict, n: int, stop_ids: tuple[int, ...]) -> SamplingParams:
    """The engine's SamplingParams of a request's `sampling_params` (max_tokens 16 where absent);
    DataError for a value that is not a number."""
    try:
        return SamplingParams(max_new_tokens=int(params.get("max_tokens") or 16),
                              temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                              top_k=int(params.get("top_k", -1)), n=n, stop_token_ids=stop_ids)
    except (TypeError, ValueError) as exc:
        raise DataError(f"sampling_params {params!r}: {exc}; give numbers") from exc
