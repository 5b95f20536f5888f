"""A stand-in for the `vllm` package, for tests in processes that cannot have vLLM (no GPU, no vllm
wheel here): put `tests/fakes` (and the repository root) on a process's PYTHONPATH, e.g. through Ray's
`runtime_env`, and `import vllm` finds this.

`LLM` is the unit tests' `FakeLLM` (its `collective_rpc` runs the real `WeightSyncExtension` on one
worker; sleep / wake / prefix-cache calls are recorded) over the model folder loaded with transformers:
weight syncs go through the extension's load path into that model, and `generate` samples real tokens
from it with rlhfkit's HFEngine, one request at a time with the request's own seed, returning vLLM's
output shape (token ids, a {token: Logprob} per token, finish reason). What it does not model: vLLM's
kernels, paged KV cache, scheduling, tensor parallelism, GPUs.

A vision-language model folder is loaded with its processor behind rlhfkit's VisionEngine: a request's
`multi_modal_data` images are expanded into the prompt as vLLM's multimodal processor of the family would
(`vllm_expansion` of tests/unit/rollout/test_vllm_vision.py: the placeholders re-expanded with the HF
processor, or Gemma 3's replacement and newline merges), and the real tiny model samples with the HF
processor's pixel tensors of the images, so tokens and logprobs are real. vLLM's logit bias is not applied
(the VisionEngine keeps the placeholder tokens from being sampled itself).

With FAKE_VLLM_LOG set, every engine appends JSON lines to that file: `init` (its keyword arguments),
`generate` (the prompts it got and how many images each carried) and `load` (how many tensors, and a digest
of the model's weights after the load), each with the process id, so a test can tell which engine got which
prompts, images and weights. With FAKE_VLLM_DUMP set (a folder), every load also saves the model's whole state
dict after it there, as `<pid>-<n>.safetensors` (n: that engine's loads so far, from 0), so a test can compare
what an engine holds after each sync with the weights it computes itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from types import SimpleNamespace

import torch

from rlhfkit.data.types import FINISH_STOP
from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.precision import DTYPES
from rlhfkit.models.vision import is_vision_folder, load_processor, load_vision_model
from rlhfkit.rollout.base import SamplingParams as EngineParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.vision import VisionEngine
from tests.unit.rollout.test_vllm_colocated import FakeLLM
from tests.unit.rollout.test_vllm_vision import vllm_expansion


def record(event: str, **fields) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the model's state dict, name by name (the tests compute it on the trainer's side)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class SamplingParams(SimpleNamespace):
    """vLLM's SamplingParams: its keyword arguments as attributes."""


class Logprob(SimpleNamespace):
    """vLLM's Logprob: `.logprob`."""


class HFModel:
    """What vLLM's model runner holds, over an HF model: `load_weights` takes HF-named tensors."""

    def __init__(self, hf: torch.nn.Module):
        self.hf, self.loads = hf, 0

    def parameters(self):
        return self.hf.parameters()

    def load_weights(self, weights) -> None:
        state = dict(weights)
        result = self.hf.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise KeyError(f"load_weights got names the model lacks: {result.unexpected_keys[:3]}")
        record("load", tensors=len(state), digest=weights_digest(self.hf))
        folder = os.environ.get("FAKE_VLLM_DUMP")
        if folder:
            from safetensors.torch import save_file

            held = {k: t.detach().contiguous().clone() for k, t in self.hf.state_dict().items()}
            save_file(held, os.path.join(folder, f"{os.getpid()}-{self.loads}.safetensors"))
        self.loads += 1


class LLM(FakeLLM):
    def __init__(self, model: str, dtype: str = "auto", logprobs_mode: str = "raw_logprobs", **kwargs):
        if logprobs_mode != "processed_logprobs":
            raise ValueError("rlhfkit's engine asks for processed_logprobs")
        plain = {k: v for k, v in kwargs.items() if isinstance(v, (int, float, str))}
        record("init", model=model, dtype=dtype, limit_mm_per_prompt=kwargs.get("limit_mm_per_prompt"), **plain)
        self.processor = load_processor(model) if is_vision_folder(model) else None
        if self.processor is not None:
            hf = load_vision_model(model, dtype=DTYPES.get(dtype, torch.float32)).eval()
            self.engine = VisionEngine(hf, self.processor.tokenizer)
        else:
            hf = load_causal_lm(model, dtype=DTYPES.get(dtype, torch.float32)).eval()
            self.engine = HFEngine(hf, load_tokenizer(model))
        super().__init__(HFModel(hf))
        self.model_type = hf.config.model_type

    def generate(self, requests, sampling_params, use_tqdm=False):
        self.calls.append(("generate", len(requests)))
        record("generate", prompts=[r["prompt_token_ids"] for r in requests],
               images=[len(r.get("multi_modal_data", {}).get("image", [])) for r in requests])
        return [self._one(r, sp) for r, sp in zip(requests, sampling_params)]

    def _one(self, request, sp):
        params = EngineParams(max_new_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p,
                              top_k=sp.top_k, n=1, stop_token_ids=tuple(sp.stop_token_ids))
        prompt, images = request["prompt_token_ids"], {}
        if "multi_modal_data" in request:  # expanded as vLLM's processor of the family would
            prompt, vision = vllm_expansion(self.processor, self.model_type, request)
            images = {"vision": [vision]}
        t = self.engine.generate([prompt], params, seeds=None if sp.seed is None else [sp.seed], **images)[0]
        ids = t.response_ids.tolist()
        logprobs = [{i: Logprob(logprob=float(lp))} for i, lp in zip(ids, t.logprobs)]
        out = SimpleNamespace(token_ids=ids, logprobs=logprobs,
                              finish_reason="stop" if t.finish_reason == FINISH_STOP else "length")
        return SimpleNamespace(outputs=[out])
