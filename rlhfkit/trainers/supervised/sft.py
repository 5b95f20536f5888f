"""Supervised fine-tuning: next-token NLL on response tokens, on the shared step loop
(trainers/supervised/loop.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rlhfkit.core.losses import sft_loss
from rlhfkit.models import response_logprobs, save_hf_folder
from rlhfkit.models.precision import autocast_ctx, model_device
from rlhfkit.trainers.supervised.loop import (
    StepLoop,
    build_learner,
    make_batch,
    planned_steps,
)


class SFTLoop:
    """Next-token NLL on response tokens only (every assistant turn of a conversation).

    The loss is the token mean over the whole optimizer step (`sft_loss` with the step's token
    count), so packed and padded micro-batches, and any micro-batch size, give the same gradient.
    """

    def __init__(self, cfg, model: torch.nn.Module, tokenizer, samples: Sequence, eval_samples: Sequence = (),
                 tracker=None):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.eval_samples = list(eval_samples)
        steps = planned_steps(len(samples), cfg.train)
        self.learner = build_learner(model, cfg.adam, cfg.train, steps, cfg.muon, cfg.model)
        self.loop = StepLoop(self.learner, samples, cfg.train, tracker, self.evaluate if self.eval_samples else None,
                             aux_loss_coef=cfg.model.aux_loss_coef)

    def fit(self) -> list[dict[str, float]]:
        return self.loop.fit(self.micro_loss)

    def token_logprobs(self, samples: Sequence):
        batch = make_batch(samples, self.tokenizer.pad_token_id, self.cfg.ds.packing_samples)
        with autocast_ctx(self.cfg.model.autocast, model_device(self.model).type):
            logp = response_logprobs(self.model, batch)[0]
        return logp.float(), batch.loss_mask.to(logp.device)

    def micro_loss(self, samples: list, step_samples: list) -> tuple[torch.Tensor, dict[str, float]]:
        num_tokens = sum(int(s.loss_mask.sum()) for s in step_samples)
        logp, mask = self.token_logprobs(samples)
        loss, _ = sft_loss(logp, mask, "token_mean", num_tokens=num_tokens, dft=self.cfg.model.loss_type == "dft")
        return loss, {"loss": float(loss.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Token-mean NLL over the eval samples (micro-batched)."""
        self.model.eval()
        total, count = 0.0, 0
        mbs = self.cfg.train.micro_batch_size
        for i in range(0, len(self.eval_samples), mbs):
            logp, mask = self.token_logprobs(self.eval_samples[i : i + mbs])
            total += float((-logp * mask).sum())
            count += int(mask.sum())
        self.model.train()
        return {"eval/loss": total / max(count, 1)}

    def save(self, path: str | Path) -> Path:
        """An HF folder; with LoRA, peft's adapter folder (merge it with `rlhfkit lora merge`)."""
        return save_hf_folder(self.model, self.tokenizer, path)
