"""The algorithm-blind learner: AdamW (or Muon for the hidden weight matrices and AdamW for the rest),
warmup + cosine schedule, gradient accumulation, grad-norm clipping, skipped non-finite steps and an
optional EMA of the parameters.

With `muon` settings (OpenRLHF's --actor.optim muon) the parameters are split as OpenRLHF's DeepSpeed
Muon splits them: every 2-D matrix whose name contains neither "embed" nor "lm_head" is stepped by
torch.optim.Muon (momentum, Newton-Schulz orthogonalisation, the update scaled by sqrt(max(1, rows /
cols))), everything else (embeddings, the LM head, norms, biases) by AdamW with the Adam settings. The
weight decay applies to both; the schedule scales both learning rates by the same factor; gradient
clipping runs on the raw gradients of all parameters before either optimizer. FSDP2-sharded matrices
(DTensors) are stepped by `trainers.sharded_muon.ShardedMuon`: each update gathered and orthogonalised
whole, each rank applying its rows, so the step is the one-process step.

Parameters held in bfloat16 (`--actor.dtype bfloat16`) are trained as DeepSpeed's bf16 mode
does: the optimizer owns float32 master copies, each micro-batch's bf16 gradient is added into
a float32 gradient as soon as autograd produces it (a post-accumulate hook, so micro-batches sum
in float32), clipping, AdamW and the EMA run on the masters, and the module gets the rounded
masters back after each step. Adam updates far below a bf16 weight's spacing (lr 1e-6 on a
weight of 1.0: spacing 2^-7) are thus kept, not rounded away.

Parameters held in float16 (`--actor.dtype float16`) get the same float32 masters and gradient sums.
Where the forward computes in float16 (those parameters, or float16 autocast) the loop hands the Learner
a `trainers.loss_scale.DynamicLossScale`, DeepSpeed's fp16 mode: `backward` multiplies each
micro-batch's loss by the scale, and `step` divides the summed gradients by it once per optimizer
step, in the same pass as the clipping multiply (the clipping norm is that of the unscaled gradients).
An overflow (inf / NaN gradient) skips the step and lowers the scale; a window of steps without one
raises it. The scale is logged (`loss_scale`) and kept in `state_dict()`.

A non-finite loss or gradient (NaN / inf gradient norm) skips that optimizer step: the gradients
are dropped, the parameters, Adam moments, schedule and EMA stay as they were, the skip is counted
and logged, and `max_consecutive_skips` skips in a row raise a TrainingError (with loss scaling only
the skips once the scale is at its floor count toward it: before that an overflow is the scale's
search for its size, as in DeepSpeed).

It knows nothing about RL: a loop hands it losses that are already divided by the counts of
the whole optimizer step (see core.aggregate), calls `backward` once per micro-batch and
`step` once per optimizer step.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import asdict

import torch

from rlhfkit.core.ema import ema_update
from rlhfkit.errors import CheckpointError, ConfigError, TrainingError, one_line
from rlhfkit.models.host import own_memory
from rlhfkit.trainers.loss_scale import DynamicLossScale
from rlhfkit.trainers.sharded_muon import ShardedMuon, is_sharded

log = logging.getLogger("rlhfkit")


def lr_lambda(kind: str, total_steps: int, warmup_steps: int, min_lr_ratio: float):
    """Multiplier of the peak lr at optimizer step s (0-based): linear warmup from 0 (s / warmup_steps, as
    transformers' schedules that OpenRLHF and TRL use: the first step of a warmup has lr 0), then
    `constant`, `linear` (to 0 at `total_steps`, as transformers' linear schedule), `cosine` (to 0) or
    `cosine_with_min_lr` (to min_lr_ratio)."""
    floor = min_lr_ratio if kind == "cosine_with_min_lr" else 0.0

    def f(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return step / warmup_steps
        if kind == "constant":
            return 1.0
        span = max(total_steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / span, 1.0)
        if kind == "linear":
            return 1.0 - progress
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def adam_kernel(params: list[torch.Tensor]) -> dict[str, bool]:
    """AdamW's fused kernel (one pass over each parameter, moments and gradient) where it applies:
    plain CPU/CUDA float tensors. On a CPU it steps SmolLM2-135M's parameters in 0.06 s against 0.30 s
    for the default multi-tensor (foreach) path. Sharded (DTensor) parameters keep the default."""
    plain = all(type(p.detach()) is torch.Tensor and p.device.type in ("cpu", "cuda") and p.is_floating_point()
                for p in params)
    return {"fused": True} if params and plain else {}


MUON_EXCLUDED = ("embed", "lm_head")  # name parts of 2-D parameters that stay with AdamW (as OpenRLHF's split)


def muon_settings(optim: str, muon) -> dict | None:
    """torch.optim.Muon's keyword arguments (lr, momentum, ns_steps, nesterov) from an `optim` choice
    ("adam" or "muon") and a MuonConfig-like section; None for plain AdamW."""
    if optim == "muon" and muon is None:
        raise ConfigError("the optimizer is muon but no Muon settings were given (a muon section)")
    return asdict(muon) if optim == "muon" else None


def muon_mask(named: list[tuple[str, torch.Tensor]]) -> list[bool]:
    """Per parameter: True where Muon steps it (a 2-D matrix whose name has none of MUON_EXCLUDED)."""
    return [p.ndim == 2 and not any(part in name for part in MUON_EXCLUDED) for name, p in named]


class Learner:
    """Owns the optimizer state of one trainable module.

    `muon`: torch.optim.Muon's lr, momentum, ns_steps and nesterov for the hidden weight matrices
    (see the module docstring); None = AdamW for every parameter. `loss_scale`: the dynamic loss scale
    of a float16 forward (module docstring); None = losses and gradients as they are. `optimizer` is
    the AdamW (None when Muon takes every parameter), `muon` the Muon (None without one)."""

    def __init__(
        self,
        module: torch.nn.Module,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        total_steps: int = 1,
        warmup_steps: int = 0,
        scheduler: str = "constant",
        min_lr_ratio: float = 0.0,
        max_norm: float = 1.0,
        ema_beta: float | None = None,
        max_consecutive_skips: int = 0,
        name: str = "actor",
        muon: dict | None = None,
        loss_scale: DynamicLossScale | None = None,
    ):
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        own_memory(self.params)  # written in place at every step: never through a file mapping
        # float32 masters for low-precision parameters (see the module docstring); else the params
        self.master = None
        if any(p.dtype in (torch.bfloat16, torch.float16) for p in self.params):
            self.master = [p.detach().to(torch.float32, copy=True) for p in self.params]
            for p, m in zip(self.params, self.master, strict=True):
                p.register_post_accumulate_grad_hook(functools.partial(_accumulate_into, m))
        self.train_params = self.master if self.master is not None else self.params
        low = [p.dtype for p in self.params if p.dtype in (torch.bfloat16, torch.float16)]
        self.param_dtype = str(low[0]).removeprefix("torch.") if low else "float32"  # the dtype its masters round to
        to_muon = muon_mask(named) if muon is not None else [False] * len(named)
        adam_params = [p for p, m in zip(self.train_params, to_muon, strict=True) if not m]
        muon_params = [p for p, m in zip(self.train_params, to_muon, strict=True) if m]
        self.optimizer = self.muon = None
        if adam_params or not muon_params:
            self.optimizer = _make(name, "AdamW", "the learning rate must be > 0, betas in [0, 1), eps > 0 and the "
                                   "weight decay >= 0", lambda: torch.optim.AdamW(
                                       adam_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       **adam_kernel(adam_params)))
        if muon_params:  # FSDP2-sharded matrices: each orthogonalised whole (trainers.sharded_muon)
            kind = ShardedMuon if is_sharded(muon_params) else torch.optim.Muon
            self.muon = _make(name, "Muon", "its learning rate and momentum must be >= 0 and ns_steps < 100",
                              lambda: kind(muon_params, weight_decay=weight_decay, **muon))
        self.optimizers = [o for o in (self.optimizer, self.muon) if o is not None]
        factor = lr_lambda(scheduler, total_steps, warmup_steps, min_lr_ratio)
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in self.optimizers]
        self.scheduler = self.schedulers[0]  # the AdamW's (Muon's alone when it takes every parameter)
        self.max_norm = max_norm
        self.ema_beta = ema_beta
        self.ema = [p.detach().clone() for p in self.train_params] if ema_beta is not None else None
        self.steps = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.max_consecutive_skips = max_consecutive_skips
        self.name = name
        self.loss_scale = loss_scale

    def backward(self, loss: torch.Tensor) -> None:
        """`loss.backward()`; with a loss scale, of `loss` times the scale (`step` divides the gradients by it)."""
        (loss * self.loss_scale.scale if self.loss_scale is not None else loss).backward()

    def _grad_norm(self) -> torch.Tensor:
        """The gradients' total norm, the gradients unscaled (loss scaling) and clipped (max_norm > 0)."""
        if self.loss_scale is not None:
            return unscale_and_clip(self.train_params, self.max_norm, self.loss_scale.scale)
        if self.max_norm and self.max_norm > 0:
            return clip_grad_norm(self.train_params, self.max_norm)
        grads = [p.grad.detach().norm() for p in self.train_params if p.grad is not None]
        return torch.stack(grads).norm() if grads else torch.zeros(())

    def step(self) -> dict[str, float]:
        """Unscale, clip, step and zero the gradients. A non-finite gradient norm skips the update."""
        grad_norm = self._grad_norm()
        metrics = {"grad_norm": float(grad_norm), "lr": self.scheduler.get_last_lr()[0]}
        if self.muon is not None:
            metrics["muon_lr"] = self.schedulers[-1].get_last_lr()[0]
        finite = bool(torch.isfinite(grad_norm))
        searching = self.loss_scale is not None and not self.loss_scale.at_floor  # an overflow lowers the scale
        if self.loss_scale is not None:
            self.loss_scale.update(overflow=not finite)
            metrics["loss_scale"] = self.loss_scale.scale
        if finite:
            for optimizer, scheduler in zip(self.optimizers, self.schedulers, strict=True):
                optimizer.step()
                scheduler.step()
            self._copy_masters_to_params()
            if self.ema is not None:
                ema_update(self.ema, [p.detach() for p in self.train_params], self.ema_beta)
            self.steps += 1
            self.consecutive_skips = 0
        elif searching:
            self.skipped_steps += 1
            log.info("%s: skipped optimizer step %d: the float16 gradients overflowed; loss scale now %g (%d "
                     "skipped in all)", self.name, self.steps + self.skipped_steps, self.loss_scale.scale,
                     self.skipped_steps)
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            log.warning("%s: skipped optimizer step %d: non-finite gradient norm (%s), i.e. a NaN/inf loss "
                        "or gradient (%d in a row, %d in all)", self.name, self.steps + self.skipped_steps,
                        float(grad_norm), self.consecutive_skips, self.skipped_steps)
        metrics["skipped_steps"] = float(self.skipped_steps)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        if self.master is not None:  # bf16 gradients left by a backward outside this learner's hooks
            for p in self.params:
                p.grad = None
        if 0 < self.max_consecutive_skips <= self.consecutive_skips:
            raise TrainingError(
                f"{self.name}: {self.consecutive_skips} optimizer steps in a row had a non-finite (NaN/inf) loss "
                "or gradient, so training stopped; lower the learning rate or check the data and reward, then "
                "resume from the last good checkpoint with --ckpt.load_enable true "
                "(--train.max_skipped_steps sets the limit)"
            )
        return metrics

    def state_dict(self) -> dict:
        """Optimizer, scheduler, EMA and counters (plain values and tensors; see trainers.checkpoint);
        with Muon its optimizer and scheduler under "muon"."""
        muon = None if self.muon is None else {"optimizer": self.muon.state_dict(),
                                               "scheduler": self.schedulers[-1].state_dict()}
        return {"optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "scheduler": self.scheduler.state_dict(), "muon": muon,
                "ema": self.ema, "master": self.master, "steps": self.steps, "skipped_steps": self.skipped_steps,
                "consecutive_skips": self.consecutive_skips, "param_dtype": self.param_dtype,
                "loss_scale": self.loss_scale.state_dict() if self.loss_scale is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`; an "optimizer" (also Muon's) or "ema" of None is left as it is (a sharded
        checkpoint restores those itself: distributed.fsdp_checkpoint)."""
        self.check_optimizer(state)
        muon = state.get("muon")
        if state["optimizer"] is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if muon is not None:
            if muon["optimizer"] is not None:
                self.muon.load_state_dict(muon["optimizer"])
            self.schedulers[-1].load_state_dict(muon["scheduler"])
        if self.ema is not None and state["ema"] is not None:
            with torch.no_grad():
                for e, v in zip(self.ema, state["ema"], strict=True):
                    e.copy_(v)
        self._check_precision(state)
        if self.master is not None:
            with torch.no_grad():
                for m, v in zip(self.master, state["master"], strict=True):
                    m.copy_(v)
            self._copy_masters_to_params()
        self.steps, self.skipped_steps = state["steps"], state["skipped_steps"]
        self.consecutive_skips = state["consecutive_skips"]
        if self.loss_scale is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])

    def _check_precision(self, state: dict) -> None:
        """CheckpointError unless `state` was written with float32 masters and a loss scale where this run has them."""
        if (self.master is None) != (state.get("master") is None):
            written = state.get("param_dtype") or ("float32" if state.get("master") is None else "bfloat16")
            raise CheckpointError(
                f"{self.name}: the checkpoint was written with {written} parameters, this run has {self.param_dtype}; "
                f"resume with the dtype it was written with (--actor.dtype / --model.dtype {written})")
        if (self.loss_scale is None) != (state.get("loss_scale") is None):
            written, here = ("without", "with") if self.loss_scale is not None else ("with", "without")
            raise CheckpointError(
                f"{self.name}: the checkpoint was written {written} float16 loss scaling, this run is {here} it; "
                "resume with the dtype, autocast and --train.loss_scale.enable it was written with")

    def check_optimizer(self, state: dict) -> None:
        """CheckpointError unless `state` (a `state_dict()`) was written with this learner's optimizer choice."""
        if (self.muon is None) != (state.get("muon") is None):
            written, here = ("muon", "adam") if state.get("muon") is not None else ("adam", "muon")
            raise CheckpointError(
                f"{self.name}: the checkpoint was written with the {written} optimizer, this run uses {here}; resume "
                f"with the optimizer it was written with (--actor.optim / --critic.optim / --train.optim {written})")

    def _copy_masters_to_params(self) -> None:
        if self.master is not None:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)


def _make(name: str, kind: str, rule: str, build):
    """`build()`, an optimizer; the ValueError of settings it refuses as a one-line ConfigError. The
    config's ranges refuse these first; this covers callers that build a Learner themselves."""
    try:
        return build()
    except ValueError as exc:
        raise ConfigError(f"{name}: {kind} refuses its settings ({one_line(exc)}); {rule}") from exc


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_(params, max_norm)`, the same gradients and norm, except that with a
    plain CPU norm within `max_norm` the gradients are not multiplied by its clamped coefficient 1.0 (an
    identity torch runs to spare a GPU the read of the norm; on the CPU reading it is free, and the
    multiply is a pass over every gradient: 17 ms of a 0.8 s update of SmolLM2-135M on 2 cores)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    # torch's coefficient, compared as torch would clamp it (NaN: the step is skipped anyway)
    if type(norm) is not torch.Tensor or norm.device.type != "cpu" or bool(max_norm / (norm + 1e-6) < 1.0):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def unscale_and_clip(params: list[torch.Tensor], max_norm: float, scale: float) -> torch.Tensor:
    """The total norm of `params`' gradients divided by `scale` (loss scaling), and the gradients
    multiplied by min(1, max_norm / (norm + 1e-6)) / scale in one pass (max_norm <= 0: by 1 / scale),
    as `clip_grad_norm` would clip the unscaled gradients. A non-finite norm (an overflow) leaves them
    unwritten: the step is skipped."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads) / scale
    if not bool(torch.isfinite(norm)):
        return norm
    clip = min(1.0, max_norm / (float(norm) + 1e-6)) if max_norm and max_norm > 0 else 1.0
    coef = clip / scale
    if all(type(g) is torch.Tensor for g in grads):
        torch._foreach_mul_(grads, coef)
    else:  # DTensor gradients (FSDP2)
        for g in grads:
            g.mul_(coef)
    return norm


def _accumulate_into(master: torch.Tensor, param: torch.Tensor) -> None:
    """Post-accumulate-grad hook: add the parameter's fresh low-precision gradient into its float32
    master's and free it, so the sum over micro-batches is a float32 sum."""
    if master.grad is None:
        master.grad = param.grad.float()
    else:
        master.grad.add_(param.grad)
    param.grad = None
