"""The methods `VLLMEngine` adds to every vLLM worker (vLLM's `worker_extension_cls`).

vLLM imports this module by name inside its worker processes and mixes `WeightSyncExtension`
into its Worker class, so `self.model_runner` is the worker's. `LLM.collective_rpc(name, args)`
calls a method here on every worker (each tensor-parallel rank). Imports torch only: it must load
in a process that never imports the rest of rlhfkit.
"""

from __future__ import annotations

import torch


def pack_tensors(state) -> list[tuple[str, str, list[int], bytes]]:
    """HF-named tensors -> (name, dtype, shape, raw bytes): plain values that any RPC transport of
    vLLM carries unchanged (its msgpack encoder does not keep tensors nested in lists)."""
    out = []
    for name, t in state.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
    return out


def unpack_tensors(packed) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `pack_tensors`."""
    out = []
    for name, dtype, shape, raw in packed:
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out.append((name, flat.view(getattr(torch, dtype)).reshape(shape)))
    return out


class WeightSyncExtension:
    """Worker-side half of `VLLMEngine.update_weights`."""

    def _rlhfkit_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def rlhfkit_load_weights(self, packed) -> int:
        """Load HF-named tensors (`pack_tensors` form) into the running model in place and return
        how many were given. Uses the worker's `reload_weights` (vLLM >= 0.2x: it re-runs the
        kernel-format processing, e.g. the CPU backend's repacked linear weights, which a plain
        `model.load_weights` cannot write into), else the model's own `load_weights` (maps q/k/v
        and gate/up into fused layers and shards them for tensor parallelism)."""
        named = unpack_tensors(packed)
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        else:
            model = self._rlhfkit_model()
            device = next(model.parameters()).device
            model.load_weights(weights=((name, t.to(device)) for name, t in named))
        return len(named)

    def rlhfkit_weight_checksum(self) -> float:
        """Sum of every parameter (float64), to check in tests that weights arrived."""
        return float(sum(p.detach().double().sum() for p in self._rlhfkit_model().parameters()))
