"""Per-row LoRA adapters: one forward over a batch whose rows belong to different LoRA adapters of
the same peft model (several clients' adapters on one shared base, as served by `serve-training`).

peft applies its active adapter(s) to every row; its `adapter_names=` mixed batch is refused in
training mode. `RowAdapters` replaces, while it is entered, the forward of every LoRA linear with

    y_i = base(x_i) + scaling[a_i] * B[a_i] A[a_i] dropout(x_i)        a_i = the adapter of row i

computed per run of consecutive rows with the same adapter (one slice each, so rows grouped by
adapter cost one LoRA matmul per adapter), a row with no adapter (None) getting the base alone. A
row's output depends on its own adapter only, so a loss summed over the rows gives each adapter
exactly the gradient of its own rows' losses, and the others none. The rows are set before each
forward (`set_rows`), e.g. by a decode loop whose batch loses its finished rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Self

import torch

from rlhfkit.errors import ModelError


def runs(names: Sequence[str | None]) -> list[tuple[int, int, str | None]]:
    """The runs of equal consecutive names: (start, stop, name), in order."""
    out: list[tuple[int, int, str | None]] = []
    for i, name in enumerate(names):
        if out and out[-1][2] == name:
            out[-1] = (out[-1][0], i + 1, name)
        else:
            out.append((i, i + 1, name))
    return out


class RowAdapters:
    """While entered, every LoRA linear of `peft_model` applies row i's own adapter (`set_rows`),
    whichever adapter peft has active. `trainable`: adapters whose parameters require grad inside
    (for a backward through them); every requires_grad flag is restored at exit. Only plain LoRA on
    linear layers (no DoRA or other variants, no LoRA embeddings or quantized linears) is applied
    this way: ModelError otherwise."""

    def __init__(self, peft_model: torch.nn.Module, trainable: Iterable[str] = ()):
        from peft.tuners.lora import Linear

        self.layers = []
        for name, module in peft_model.named_modules():
            if not hasattr(module, "lora_A") or not len(module.lora_A):
                continue
            if not isinstance(module, Linear) or getattr(module, "lora_variant", None):
                raise ModelError(f"{name}: per-row LoRA adapters need plain LoRA on linear layers (not "
                                 f"{type(module).__name__} or a LoRA variant)")
            self.layers.append(module)
        self.trainable = set(trainable)
        self.rows: list[tuple[int, int, str | None]] = []
        self.batch = 0
        self._flags: list[tuple[torch.nn.Parameter, bool]] = []
        self._forwards: list[object] = []  # each layer's own instance-level forward, if it had one

    def set_rows(self, names: Sequence[str | None]) -> None:
        """The adapter of each row of the next forwards' batch (None: the base alone)."""
        self.rows, self.batch = runs(names), len(names)

    def __enter__(self) -> Self:
        for module in self.layers:
            self._forwards.append(module.__dict__.get("forward"))
            module.forward = _RowForward(module, self)
            for name in self.trainable & set(module.lora_A):
                for p in (*module.lora_A[name].parameters(), *module.lora_B[name].parameters()):
                    self._flags.append((p, p.requires_grad))
                    p.requires_grad_(True)
        return self

    def __exit__(self, *exc) -> None:
        for module, own in zip(self.layers, self._forwards):
            del module.forward
            if own is not None:
                module.forward = own
        self._forwards.clear()
        for p, flag in reversed(self._flags):
            p.requires_grad_(flag)
        self._flags.clear()


class _RowForward:
    """A LoRA linear's forward under `RowAdapters` (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, rows: RowAdapters):
        self.module, self.rows = module, rows

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        m = self.module
        out = m.base_layer(x, *args, **kwargs)
        if x.shape[0] != self.rows.batch:
            raise ModelError(f"per-row LoRA: a batch of {x.shape[0]} rows, {self.rows.batch} adapters set")
        parts = []
        for start, stop, name in self.rows.rows:
            part = out[start:stop]
            if name is not None and name in m.lora_A:
                xs = x[start:stop].to(m.lora_A[name].weight.dtype)
                part = (part + m.lora_B[name](m.lora_A[name](m.lora_dropout[name](xs))) * m.scaling[name]).to(out.dtype)
            parts.append(part)
        return parts[0] if len(parts) == 1 else torch.cat(parts)
