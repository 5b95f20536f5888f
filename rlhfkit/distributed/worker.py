"""`RolloutWorker`: one Ray actor holding a generation engine: its own copy of the policy behind an
`HFEngine` (a `VisionEngine` when the model folder holds a vision-language model), or a `VLLMEngine`
(vLLM loads the model folder itself; OpenRLHF's vLLM engine actors).

Two concurrency groups: `generate` calls run one at a time in submission order; `update_weights`
runs beside them, so a weight transfer never waits for a generation to finish. A received state
is staged and loaded at the start of the next `generate` (never under a running one): a
generation uses the newest weights fully received when it starts, and every trajectory is
stamped with their version. With partial rollouts (`partial_tokens` > 0) a generation runs in
slices of that many tokens and loads newly staged weights between slices: it continues from its
tokens and KV cache with the new weights (HFEngine.start/resume), each token stamped with the
version that produced it. In synchronous mode the pool waits for every worker to acknowledge
a version before it asks for samples, so that version is exactly the trainer's. A state staged while
an older one waits is merged over it (a later sync may carry only the layers that changed).

Vision-language models: `generate` takes each prompt's images (`vision`, the trainer's
`data.images.VisionInputs`, shipped through the object store): an HF engine its image tensors, prefilled
with the prompt; a vLLM engine its decoded images, sent as vLLM's multi-modal data (its `vllm` settings
carry the image settings, api/vision.py's `vllm_image_settings`). The trajectories go back without them:
the pool puts the trainer's own copy back on each (`RayEnginePool.gather`), so the images cross the object
store once, one way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.host import apply_host_settings
from rlhfkit.models.lora import add_lora
from rlhfkit.models.precision import DTYPES
from rlhfkit.models.vision import (
    is_vision_folder,
    language_lora_targets,
    load_vision_model,
)
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.vision import VisionEngine
from rlhfkit.rollout.vllm import VLLMEngine

WORKER_GROUPS = {"generate": 1, "weights": 1}


class RolloutWorker:
    """A generation engine in a Ray actor, on one torch thread: an HFEngine over a policy copy loaded from
    `model_path` (+ `gguf_file`), or with `vllm` a VLLMEngine on the model folder.

    Args:
      delay_s: test-only slow-worker hook: seconds to sleep before staging new weights (a worker
        on a slow link lags behind the trainer's versions). Not a user flag.
      partial_tokens: tokens decoded between two loads of staged weights (0: a generation uses
        the weights it started with throughout; HF engine only).
      lora: the trainer's LoRA adapters as ``add_lora``'s ``(rank, alpha, target_modules, dropout)``,
        or None. The worker wraps its copy the same way, so it computes what the trainer's policy
        computes (the base times x plus the adapters' low-rank product), and the pool then sends
        only the adapter weights (the base is frozen and loaded from the same files).
      record_experts: a mixture-of-experts policy's routing is recorded on each trajectory (routing
        replay, HFEngine's record_experts); the trajectories carry it back to the trainer.
      load_in_4bit: QLoRA: the copy's linear layers load as the same 4-bit NF4 weights as the trainer's
        (bitsandbytes quantizes the same files the same way), the adapters over them as with `lora`.
      vllm: VLLMEngine's keyword arguments (eos_ids, dtype, seed, gpu_memory_utilization, ...): the
        worker holds a vLLM engine instead, which loads `model_path` and then what the pool sends
        (the full weights but a frozen tower, with LoRA merged into their layers) through its own load
        path; for a vision-language policy they include its image settings (image_prompt, banned_ids,
        max_images).
      keep_freed: --train.keep_freed_memory in this process (models.host.keep_freed_memory): the engine's
        bf16 weight copy, rebuilt at each weight version, reuses the pages of the last one.
      frozen_tower: a vision-language policy trained with --actor.freeze_visual_encoder: with
        `lora`, the adapters go outside the vision tower, as on the trainer's policy.
    """

    def __init__(self, model_path: str, gguf_file: str | None, dtype: str, autocast: str | None,
                 max_batch_size: int | None, num_threads: int = 1, device: str | None = None,
                 delay_s: float = 0.0, partial_tokens: int = 0, lora: tuple | None = None,
                 record_experts: bool = False, frozen_tower: bool = False, load_in_4bit: bool = False,
                 vllm: dict | None = None, keep_freed: bool = False):
        apply_host_settings(num_threads, keep_freed)
        if vllm is not None:
            if partial_tokens:
                raise ValueError("partial rollouts continue HF engine generations; a vLLM worker cannot")
            # version -1 until the pool sends the trainer's weights (it does so on creation)
            self.engine = VLLMEngine(model_path, version=-1, **vllm)
        else:
            self.engine = _hf_engine(model_path, gguf_file, dtype, autocast, max_batch_size, device, lora,
                                     record_experts, frozen_tower, load_in_4bit)
        self.delay_s, self.partial_tokens = delay_s, partial_tokens
        self._staged_cv = threading.Condition()
        self._staged: tuple[Mapping[str, torch.Tensor], int] | None = None

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        """Stage `state` at `version` (loaded by the next generate). Returns the version staged."""
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._staged_cv:
            if self._staged is None:
                self._staged = (state, version)
            elif self._staged[1] < version:  # not loaded yet: the newer tensors over it
                self._staged = ({**self._staged[0], **state}, version)
            self._staged_cv.notify_all()
        return version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int],
                 group_ids: Sequence[int] | None = None, want_version: int | None = None,
                 patience_s: float | None = 0.0, vision: Sequence | None = None) -> list[Trajectory]:
        """Generate with the newest weights received; with `want_version`, first wait up to
        `patience_s` seconds (None: as long as it takes) for that version to arrive. `vision`: each
        prompt's image tensors (VisionInputs or None) for a vision-language policy; the trajectories
        come back without them (module docstring)."""
        if want_version is not None:
            with self._staged_cv:
                self._staged_cv.wait_for(lambda: self._newest() >= want_version, timeout=patience_s)
        self._load_staged()
        images = engine_images(vision)
        if not self.partial_tokens:
            return without_images(self.engine.generate(prompts, params, seeds=seeds, group_ids=group_ids, **images))
        gen = self.engine.start(prompts, params, seeds=seeds, group_ids=group_ids, **images)
        while (out := self.engine.resume(gen, self.partial_tokens)) is None:
            self._load_staged()  # weights that arrived meanwhile: the rest of the generation uses them
        return without_images(out)

    def _newest(self) -> int:
        return max(self.engine.version, self._staged[1] if self._staged is not None else -1)

    def _load_staged(self) -> None:
        with self._staged_cv:
            staged, self._staged = self._staged, None
        if staged is not None and staged[1] > self.engine.version:
            self.engine.update_weights(staged[0], staged[1])


def engine_images(vision: Sequence | None) -> dict:
    """The engine's keyword arguments for the prompts' image tensors: `{"vision": [...]}`, or {} when
    no prompt holds images (a text engine takes none)."""
    return {"vision": list(vision)} if vision is not None and any(v is not None for v in vision) else {}


def without_images(trajs: list[Trajectory]) -> list[Trajectory]:
    """`trajs` with their image tensors taken off (`info["vision"]`): the pool puts the trainer's back."""
    for t in trajs:
        t.info.pop("vision", None)
    return trajs


def _hf_engine(model_path: str, gguf_file: str | None, dtype: str, autocast: str | None, max_batch_size: int | None,
               device: str | None, lora: tuple | None, record_experts: bool, frozen_tower: bool,
               load_in_4bit: bool) -> HFEngine:
    """An HFEngine (a VisionEngine for a vision-language folder) over a frozen policy copy, LoRA-wrapped
    as the trainer's, on `device` (None: CUDA when present)."""
    tokenizer = load_tokenizer(model_path, gguf_file=gguf_file)
    vision = gguf_file is None and is_vision_folder(model_path)
    model = (load_vision_model(model_path, dtype=DTYPES[dtype], load_in_4bit=load_in_4bit) if vision
             else load_causal_lm(model_path, dtype=DTYPES[dtype], gguf_file=gguf_file, load_in_4bit=load_in_4bit))
    if device is None and torch.cuda.is_available():
        device = "cuda"
    if device is not None:
        model.to(device)
    if lora is not None:
        rank, alpha, targets, dropout = lora
        if vision and frozen_tower:  # as api.builder.build_models: no adapters in the frozen tower
            targets = language_lora_targets(model, targets)
        model = add_lora(model, rank, alpha, targets, dropout)
    model.requires_grad_(False)
    # version -1 until the pool sends the trainer's weights (it does so on creation)
    return (VisionEngine if vision else HFEngine)(
        model, tokenizer, max_batch_size=max_batch_size, autocast_dtype=DTYPES[autocast] if autocast else None,
        version=-1, record_experts=record_experts)
