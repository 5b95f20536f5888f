"""The methods `VLLMEngine` adds to every vLLM worker (vLLM's `worker_extension_cls`).

vLLM imports this module by name inside its worker processes and mixes `WeightSyncExtension`
into its Worker class, so `self.model_runner` is the worker's. `LLM.collective_rpc(name, args)`
calls a method here on every worker (each tensor-parallel rank). Imports torch only: it must load
in a process that never imports the rest of rlhfkit.
"""

from __future__ import annotations

import torch


class WeightSyncExtension:
    """Worker-side half of `VLLMEngine.update_weights`."""

    def rlhfkit_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named tensors into the running model in place (vLLM's own `load_weights` maps
        q/k/v and gate/up into its fused layers and shards them for tensor parallelism).
        Returns how many tensors were given."""
        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") else self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device)) for name, t in named))
        return len(named)

    def rlhfkit_weight_checksum(self) -> float:
        """Sum of every parameter (float64), to check in tests that weights arrived."""
        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") else self.model_runner.model
        return float(sum(p.detach().double().sum() for p in model.parameters()))
