"""torch.compile of a decoder's layers for the training forward/backward only.

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

import torch

from rlhfkit.errors import ConfigError


class CompiledLayers:
    """Compiled forwards of `model`'s decoder layers (`model.get_decoder().layers`)."""

    def __init__(self, model: torch.nn.Module):
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        if layers is None:
            raise ConfigError(f"--train.compile_enable: {type(model).__name__} has no decoder layers to compile "
                              "(model.get_decoder().layers); drop the flag")
        if next(model.parameters()).device.type == "cpu" and not any(
                shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
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
