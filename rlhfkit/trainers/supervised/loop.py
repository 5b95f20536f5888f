"""The supervised side's shared step loop, algorithm-blind (SFT, RM, DPO, KTO, PRM and KD run on it).

    for epoch in max_epochs:
        for optimizer step (train.batch_size items, shuffled by the trainer's generator):
            for micro-batch (train.micro_batch_size items):
                loss = algorithm's micro_loss(micro-batch, whole step)   # already step-normalised
                backward
            Learner.step()  (clip, AdamW, warmup + cosine schedule)
            every train.eval_steps: eval
            log; callbacks (the API's checkpointer: every --ckpt.save_steps, see SupervisedState)

An algorithm (trainers/supervised/: sft.py, preference.py, prm.py, kd.py) only supplies
`micro_loss(items, step_items) -> (loss, metrics)`, where the loss is divided by counts of the
whole optimizer step, so gradients do not depend on the micro-batch size, and the metrics sum
over the micro-batches of a step to the step's value.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import torch

from rlhfkit.config.checks import compute_dtype, warmup_steps
from rlhfkit.data.batch import collate
from rlhfkit.data.packing import pack
from rlhfkit.errors import DataError
from rlhfkit.models.logprobs import note_once
from rlhfkit.models.moe import moe_top_k, record_routing, routing_loss
from rlhfkit.trainers.learner import Learner, muon_settings
from rlhfkit.trainers.loss_scale import loss_scale_for

MicroLoss = Callable[[list, list], tuple[torch.Tensor, dict[str, float]]]


def make_batch(samples: Sequence, pad_id: int, packing: bool):
    """A padded `TokenBatch`, or with `packing` a one-row `PackedBatch` (same response layout); samples
    with images stay padded rows (a packed row cannot hold their image tensors; one logged line)."""
    if packing and any(getattr(s, "vision", None) is not None for s in samples):
        note_once("samples with images: --ds.packing_samples cannot hold their image tensors; they run as "
                  "padded rows (same numbers, more compute)")
        packing = False
    return pack(samples, pad_id) if packing else collate(samples, pad_id)


def build_learner(module: torch.nn.Module, adam, train, total_steps: int, muon=None, precision=None) -> Learner:
    """A Learner from the `adam`, `train` and `muon` config sections (read only by trainers); `precision`:
    the model section (its dtype and autocast: float16 scales the loss, --train.loss_scale.*); None = float32."""
    scale = None if precision is None else loss_scale_for(compute_dtype(precision.dtype, precision.autocast),
                                                         train.loss_scale)
    return Learner(
        module, adam.lr, adam.betas, adam.eps, adam.weight_decay, total_steps=total_steps,
        warmup_steps=warmup_steps(train.lr_warmup_steps, train.lr_warmup_ratio, total_steps),
        scheduler=train.lr_scheduler,
        min_lr_ratio=train.min_lr_ratio, max_norm=train.max_norm, muon=muon_settings(train.optim, muon),
        loss_scale=scale,
    )


def planned_steps(n_items: int, train) -> int:
    """Optimizer steps of a run: full batches per epoch x epochs, capped by max_steps."""
    per_epoch = n_items // train.batch_size
    if per_epoch == 0:
        raise DataError(f"the training set has {n_items} usable items, fewer than --train.batch_size "
                         f"{train.batch_size}; lower the batch size or add data")
    total = per_epoch * train.max_epochs
    return min(total, train.max_steps) if train.max_steps is not None else total


class StepLoop:
    """Shuffled epochs of optimizer steps over `items`, each split into micro-batches.

    `callbacks`: `cb(loop, step, metrics)` after each step's logging (the API adds the
    checkpointer's). `state_dict()` holds the position in the data (the epoch's order, the next
    index in it, the order generator), the step counter and the Learner's optimizer, schedule and
    counters: restored with `load_state_dict`, the loop continues as if never stopped.
    """

    def __init__(self, learner: Learner, items: Sequence, train, tracker=None,
                 evaluate: Callable[[], dict[str, float]] | None = None, callbacks: Sequence[Callable] = (),
                 aux_loss_coef: float = 0.0):
        self.learner, self.items, self.train = learner, list(items), train
        # a mixture-of-experts model: its routers are recorded in each micro-batch (load metrics, and
        # aux_loss_coef x the load-balancing loss added to the loss, as OpenRLHF's --aux_loss_coef)
        self.moe, self.aux_loss_coef = moe_top_k(learner.module) is not None, aux_loss_coef
        self.tracker, self.evaluate = tracker, evaluate
        self.callbacks = list(callbacks)
        self.total_steps = planned_steps(len(self.items), train)
        self.gen = torch.Generator().manual_seed(train.seed)
        self.order: list[int] = []  # the current epoch's order of item indices
        self.pos = 0  # the next step's first index in `order`
        self.step = 0

    def fit(self, micro_loss: MicroLoss) -> list[dict[str, float]]:
        """Train from the current position (the start, or a checkpoint's) to total_steps; returns
        each step's metrics."""
        t = self.train
        history = []
        while self.step < self.total_steps:
            if self.pos + t.batch_size > len(self.order):  # a new epoch (the rest of the last one is dropped)
                self.order, self.pos = torch.randperm(len(self.items), generator=self.gen).tolist(), 0
            step_items = [self.items[i] for i in self.order[self.pos : self.pos + t.batch_size]]
            self.pos += t.batch_size
            metrics = self.optimizer_step(micro_loss, step_items)
            if self.evaluate is not None and t.eval_steps > 0 and self.step % t.eval_steps == 0:
                metrics.update(self.evaluate())
            if self.tracker is not None:
                self.tracker.log(self.step, metrics)
            history.append(metrics)
            for cb in self.callbacks:
                cb(self, self.step, metrics)
        return history

    def state_dict(self) -> dict:
        """Step, data position and the Learner's state (plain values and tensors; see trainers.checkpoint)."""
        return {"step": self.step, "order": self.order, "pos": self.pos, "gen": self.gen.get_state(),
                "learner": self.learner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.order, self.pos = state["step"], list(state["order"]), state["pos"]
        self.gen.set_state(state["gen"])
        self.learner.load_state_dict(state["learner"])

    def optimizer_step(self, micro_loss: MicroLoss, step_items: list) -> dict[str, float]:
        t0 = time.perf_counter()
        self.learner.module.train()
        sums: dict[str, float] = {}
        for m in range(0, len(step_items), self.train.micro_batch_size):
            items = step_items[m : m + self.train.micro_batch_size]
            with record_routing(self.learner.module) if self.moe else contextlib.nullcontext() as routing:
                loss, metrics = micro_loss(items, step_items)
            if routing is not None:
                aux, moe_metrics = routing_loss(routing)
                w = len(items) / len(step_items)  # the mean over the step's micro-batches
                loss = loss + self.aux_loss_coef * w * aux.to(loss.device) if self.aux_loss_coef else loss
                metrics = {**metrics, **{k: float(v) * w for k, v in moe_metrics.items()}}
            self.learner.backward(loss)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        sums.update(self.learner.step())
        self.step += 1
        sums["time/step"] = time.perf_counter() - t0
        return sums


class SupervisedState:
    """A supervised algorithm (any object with `loop`, `model` and `tokenizer`) as the `Checkpointer`'s
    trainer: the loop's state (trainers.checkpoint saves the global RNG states beside it), the model
    (an HF folder with its tokenizer) and, through the optional hooks `extra_state_dict()` and
    `load_extra_state_dict(state)`, the algorithm's own state. SFT, RM, DPO and KTO have none (a
    reference model is frozen)."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    @property
    def step(self) -> int:
        return self.algorithm.loop.step

    def state_dict(self) -> dict:
        state = {"loop": self.algorithm.loop.state_dict()}
        if hasattr(self.algorithm, "extra_state_dict"):
            state["algorithm"] = self.algorithm.extra_state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.algorithm.loop.load_state_dict(state["loop"])
        if hasattr(self.algorithm, "load_extra_state_dict"):
            self.algorithm.load_extra_state_dict(state["algorithm"])

    def checkpoint_modules(self) -> dict[str, tuple]:
        return {"model": (self.algorithm.model, self.algorithm.tokenizer)}

    def can_checkpoint(self) -> bool:
        """False while the last optimizer steps were skipped (non-finite): keep the last good checkpoint."""
        return self.algorithm.loop.learner.consecutive_skips == 0
