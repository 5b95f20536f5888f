"""torch.compile of a decoder's layers for the training forward/backward (`CompiledLayers`), and of
the model's one-token decode step over a static KV cache for the rollout (`compile_decode_step`).

Eager PyTorch runs RMSNorm, RoPE, SwiGLU, the residual adds and autocast's casts one op at a
time, each a pass over memory; inductor fuses them into a few loops (docs/performance.md:
the 128-sample SmolLM2 update 6.77 -> 5.73 s on 2 cores). The compiled forwards are swapped
in only inside `CompiledLayers.active()`, so the rollout's decode loop (KV cache, one-token
attention) and the no-grad old/reference passes stay eager. `dynamic=True`: micro-batch shapes
change every step, and each new shape must not recompile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import weakref

import torch

from rlhfkit.errors import ConfigError


class CompiledLayers:
    """Compiled forwards of `model`'s decoder layers (`decoder.layers`, models.logprobs.decoder_backbone)."""

    def __init__(self, model: torch.nn.Module):
        from rlhfkit.models.logprobs import decoder_backbone

        layers = getattr(decoder_backbone(model), "layers", None)
        if layers is None:
            raise ConfigError(f"--train.compile_enable: {type(model).__name__} has no decoder layers to compile "
                              "(decoder.layers); drop the flag")
        if next(model.parameters()).device.type == "cpu" and not has_cxx():
            raise ConfigError("--train.compile_enable needs a C++ compiler for torch.compile's CPU backend (g++ or "
                              "clang++ on PATH, or CXX=...); install one (e.g. apt install g++) or drop the flag")
        self.layers = list(layers)
        self.forwards = [torch.compile(layer.forward, dynamic=True) for layer in self.layers]

    @contextlib.contextmanager
    def active(self):
        """Inside, calling a layer runs its compiled forward (module hooks still run around it)."""
        for layer, forward in zip(self.layers, self.forwards, strict=True):
            layer.forward = forward
        try:
            yield
        finally:
            for layer in self.layers:
                del layer.forward  # the class's forward again


def has_cxx() -> bool:
    """A C++ compiler on PATH (torch.compile's CPU backend builds its kernels with it)."""
    return any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))


# The compiled decode steps of this process: model -> {torch.compile mode: the step, or None once it
# failed}. An HFEngine is built per rollout or per call (bench, eval), and a new torch.compile wrapper
# per engine would be a new function for dynamo and inductor; one per model (and mode) is reused by
# every engine over it. The step takes the model as an argument and holds no reference to it, so the
# weak key lets the model be freed.
_DECODE_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile_decode_step(model: torch.nn.Module, on_cpu: bool = False):
    """A torch.compile'd `model(**kwargs)` for the rollout's one-token decode steps (fixed shapes: [B, 1]
    tokens over a static KV cache of fixed length), called as `step(model, **kwargs)`; or None where the
    engine should decode eagerly (the reason noted). Every call with the same model in this process
    (every HFEngine over it) gets the same function, so a new engine does not compile again.

    On CUDA, mode "reduce-overhead" replays each step as a CUDA graph. On the CPU it is None unless
    `on_cpu` (tests of the compiled path, benches): a SmolLM2 decode step there is ~87% aten::mm, and
    inductor's fused loops measured no faster than the eager loop (docs/performance.md) after a first
    compile of ~90 s. `dynamic=True`: the rows (B) shrink as rows finish and the cache length changes
    with the prompts, and neither may recompile."""
    from rlhfkit.models.logprobs import note_once

    device = next(model.parameters()).device
    if device.type == "cpu" and not on_cpu:
        note_once("--rollout.compile_decode: off on the CPU, where the compiled decode step measured no faster "
                  "than the eager loop (docs/performance.md); the rollout decodes eagerly")
        return None
    if device.type == "cpu" and not has_cxx():
        note_once("--rollout.compile_decode: no C++ compiler (g++/clang++) for torch.compile's CPU backend; "
                  "the rollout decodes eagerly")
        return None
    mode = "reduce-overhead" if device.type == "cuda" else None
    steps = _DECODE_STEPS.setdefault(model, {})
    if mode not in steps:
        steps[mode] = torch.compile(_call, dynamic=True, mode=mode)
    return steps[mode]


def decode_step_failed(model: torch.nn.Module, step) -> None:
    """`step` (from `compile_decode_step`) raised for `model`: later engines over it decode eagerly
    instead of trying again."""
    steps = _DECODE_STEPS.get(model, {})
    for mode, fn in steps.items():
        if fn is step:
            steps[mode] = None


def _call(model: torch.nn.Module, **kwargs):
    return model(**kwargs)
