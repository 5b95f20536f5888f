"""Process reward models: training on step labels (`rlhfkit train prm`). Their per-step rewards in RL
(`rlhfkit train rl --reward.model_name_or_path PRM_FOLDER`) are rewards/reward_model.py's ProcessRewardFn.

Training (OpenRLHF's train_prm; Lightman et al. 2023, arXiv:2305.20050; Math-Shepherd, Wang et al.
2024, arXiv:2312.08935): a causal LM reads a text whose steps each end with a placeholder token;
at each placeholder, the logits of the two reward tokens (good, bad) give P(good step)
= softmax([z_good, z_bad])[0], and the loss is the cross-entropy against the step's label
(1 / 0 for reward-token labels, the float for soft labels), averaged over the step ends of the
whole optimizer step. Accuracy: P(good) > 0.5 agrees with label > 0.5. With --ds.packing_samples a
micro-batch's samples run end to end in one row (data.steps.pack_steps): the same logits at the same step
ends as padded rows, without the padding's compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rlhfkit.data.steps import (
    StepBatch,
    StepSample,
    collate_steps,
    pack_steps,
    single_token_id,
)
from rlhfkit.models import save_hf_folder
from rlhfkit.models.logprobs import runnable_layout
from rlhfkit.models.precision import autocast_ctx, model_device
from rlhfkit.models.reward import mark_prm, step_logits
from rlhfkit.trainers.supervised.loop import StepLoop, build_learner, planned_steps


def prm_loss(logits: torch.Tensor, targets: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, dict]:
    """Cross-entropy over the (good, bad) reward-token logits at step ends.

    logits [N, 2] (good, bad); targets [N] P(good) wanted (1 / 0 for hard labels); `num_steps`: the
    step ends of the whole optimizer step (loss and accuracy are divided by it, so micro-batches sum
    to the step's mean). Returns (loss, {"loss", "accuracy"} detached)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    targets = targets.to(logp)
    nll = -(targets * logp[:, 0] + (1.0 - targets) * logp[:, 1])
    loss = nll.sum() / num_steps
    correct = ((logp[:, 0] > logp[:, 1]) == (targets > 0.5)).float().sum() / num_steps
    return loss, {"loss": loss.detach(), "accuracy": correct}


def step_batch(samples: Sequence[StepSample], pad_id: int, packing: bool) -> StepBatch:
    """`samples` in one packed row (`packing`) or as padded rows."""
    return pack_steps(samples) if packing else collate_steps(samples, pad_id)


class PRMLoop:
    """A process reward model on step-labelled samples (`data.steps.StepSample`), saved as a causal-LM
    folder whose config records the placeholder and reward tokens."""

    def __init__(self, cfg, model: torch.nn.Module, tokenizer, samples: Sequence[StepSample],
                 eval_samples: Sequence[StepSample] = (), tracker=None):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.eval_samples = list(eval_samples)
        self.reward_ids = [single_token_id(tokenizer, t, "--data.reward_tokens")
                           for t in cfg.data.reward_tokens]
        self.learner = build_learner(model, cfg.adam, cfg.train, planned_steps(len(samples), cfg.train),
                                     cfg.muon, cfg.model)
        evaluate = self.evaluate if self.eval_samples else None
        self.loop = StepLoop(self.learner, samples, cfg.train, tracker, evaluate,
                             aux_loss_coef=cfg.model.aux_loss_coef)

    def fit(self) -> list[dict[str, float]]:
        return self.loop.fit(self.micro_loss)

    def logits(self, samples: Sequence[StepSample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward-token logits [N, 2], targets [N]) at the step ends of `samples`: in one packed row with
        --ds.packing_samples (as padded rows for a model that cannot keep packed samples apart), else padded."""
        batch = runnable_layout(self.model, step_batch(samples, self.tokenizer.pad_token_id,
                                                       self.cfg.ds.packing_samples))
        device = model_device(self.model)

        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        with autocast_ctx(self.cfg.model.autocast, device.type):
            z = step_logits(self.model, batch.input_ids.to(device), moved(batch.attention_mask),
                            batch.step_mask.to(device), self.reward_ids, position_ids=moved(batch.position_ids))
        return z, batch.targets[batch.step_mask].to(z.device)

    def micro_loss(self, samples: list, step_samples: list) -> tuple[torch.Tensor, dict[str, float]]:
        num_steps = sum(int(s.step_mask.sum()) for s in step_samples)
        loss, metrics = prm_loss(*self.logits(samples), num_steps)
        return loss, {k: float(v) for k, v in metrics.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss and accuracy over every step end of the eval samples (micro-batched)."""
        self.model.eval()
        mbs = self.cfg.train.micro_batch_size
        parts = [self.logits(self.eval_samples[i : i + mbs]) for i in range(0, len(self.eval_samples), mbs)]
        self.model.train()
        z, targets = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        loss, metrics = prm_loss(z, targets, max(targets.numel(), 1))
        return {"eval/loss": float(loss), "eval/accuracy": float(metrics["accuracy"])}

    def save(self, path: str | Path) -> Path:
        """A full causal-LM folder (LoRA merged) whose config.json records it is a PRM."""
        if hasattr(self.model, "merge_and_unload"):
            self.model = self.model.merge_and_unload()
        mark_prm(self.model, self.cfg.data.placeholder_token, self.cfg.data.reward_tokens)
        return save_hf_folder(self.model, self.tokenizer, path)
