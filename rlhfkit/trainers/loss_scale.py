"""Dynamic loss scaling for float16 training, as DeepSpeed's fp16 mode does it (its DynamicLossScaler
with the defaults OpenRLHF runs it with; Micikevicius et al. 2018, "Mixed Precision Training",
arXiv:1710.03740).

float16 holds magnitudes from ~6e-8 (subnormal) to 65504: small gradients of activations computed in
fp16 round to zero in the backward pass. The loss is multiplied by `scale` before backward, so the
whole backward runs `scale` times larger; the Learner divides the gradients by `scale` again (once per
optimizer step, fused with the clipping multiply) before clipping and the optimizer step. When a
gradient overflowed (inf / NaN), the step is skipped and `update(overflow=True)` lowers the scale;
after `window` steps in a row without an overflow it is raised again.

The rules (DeepSpeed's, with `consecutive_hysteresis` off):
- an overflow with `hysteresis` left > 1 spends one unit of it and keeps the scale; with 1 left it
  halves the scale (never below `min_scale`);
- a step with no overflow doubles the scale when `window` steps have passed since the last overflow
  (or since the start), and refills the hysteresis then.
So with the defaults (2^16, window 1000, hysteresis 2, min 1) the first overflow only spends the
hysteresis, every later one halves the scale until a doubling refills it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.errors import ConfigError

FACTOR = 2.0  # DeepSpeed's scale_factor: the scale halves on an overflow and doubles after a window


@dataclass
class DynamicLossScale:
    """The scale the loss is multiplied by before backward, and its rule of change (module docstring).

    `initial_scale_power`: the first scale is 2**power; `window`: good steps in a row before the scale
    doubles; `hysteresis`: overflows tolerated before the scale halves; `min_scale`: its floor."""

    initial_scale_power: int = 16
    window: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0

    def __post_init__(self):
        if self.window < 1 or self.hysteresis < 1 or self.min_scale <= 0 or not 0 <= self.initial_scale_power <= 64:
            raise ConfigError(f"loss scaling: window ({self.window}) and hysteresis ({self.hysteresis}) must be >= 1, "
                              f"min_scale ({self.min_scale}) > 0 and initial_scale_power ({self.initial_scale_power}) "
                              "in [0, 64] (--train.loss_scale.*)")
        self.scale = max(FACTOR ** self.initial_scale_power, self.min_scale)
        self.hysteresis_left = self.hysteresis
        self.iteration = 0  # update() calls so far
        self.last_overflow = -1  # the iteration of the last overflow (-1: none yet)

    def update(self, overflow: bool) -> None:
        """After an optimizer step (taken, or skipped for `overflow`): change the scale by the rules."""
        if overflow:
            if self.hysteresis_left <= 1:
                self.scale = max(self.scale / FACTOR, self.min_scale)
            else:
                self.hysteresis_left -= 1
            self.last_overflow = self.iteration
        elif (self.iteration - self.last_overflow) % self.window == 0:
            self.scale *= FACTOR
            self.hysteresis_left = self.hysteresis
        self.iteration += 1

    @property
    def at_floor(self) -> bool:
        """Whether an overflow can no longer lower the scale (it is at `min_scale`, no hysteresis left)."""
        return self.scale <= self.min_scale and self.hysteresis_left <= 1

    def state_dict(self) -> dict:
        return {"scale": self.scale, "hysteresis_left": self.hysteresis_left, "iteration": self.iteration,
                "last_overflow": self.last_overflow}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.hysteresis_left = float(state["scale"]), int(state["hysteresis_left"])
        self.iteration, self.last_overflow = int(state["iteration"]), int(state["last_overflow"])


def loss_scale_for(compute_dtype: str, settings) -> DynamicLossScale | None:
    """The loss scale of a forward computing in `compute_dtype` ("float16": a `DynamicLossScale` from a
    LossScaleConfig-like `settings`, unless its `enable` is false; any other dtype: None)."""
    if compute_dtype != "float16" or not settings.enable:
        return None
    return DynamicLossScale(settings.initial_scale_power, settings.window, settings.hysteresis, settings.min_scale)
