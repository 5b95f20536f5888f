"""Preference training on the supervised step loop: reward models (Bradley-Terry), DPO / IPO /
cDPO, and KTO. Each trainer supplies only its micro-batch loss; the math is core's
(`pairwise_loss`, `dpo_loss`, `kto_loss`), the logprob forward is `models.response_logprobs`.

A micro-batch of b pairs is one batch of 2b rows (chosen rows, then rejected rows). Losses from
core are means over the micro-batch; multiplying by b / (pairs in the step) makes the sum over
micro-batches the mean over the optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rlhfkit.core.losses import center_penalty, dpo_loss, kto_loss, pairwise_loss, sft_loss
from rlhfkit.core.masks import masked_sum
from rlhfkit.data.supervised import TokenSample
from rlhfkit.models import response_logprobs, save_hf_folder
from rlhfkit.models.precision import autocast_ctx, model_device
from rlhfkit.models.reward import batch_scores, save_reward_model
from rlhfkit.trainers.supervised.loop import (
    StepLoop,
    build_learner,
    make_batch,
    planned_steps,
)


class _PreferenceLoop:
    def __init__(self, cfg, model: torch.nn.Module, tokenizer, items: Sequence, eval_items: Sequence = (),
                 tracker=None):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.eval_items = list(eval_items)
        self.learner = build_learner(model, cfg.adam, cfg.train, planned_steps(len(items), cfg.train),
                                     cfg.muon, cfg.model)
        self.loop = StepLoop(self.learner, items, cfg.train, tracker, self.evaluate if self.eval_items else None,
                             aux_loss_coef=cfg.model.aux_loss_coef)

    def fit(self) -> list[dict[str, float]]:
        return self.loop.fit(self.micro_loss)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Metrics of the loss on the eval items, averaged over micro-batches by item count."""
        self.model.eval()
        sums: dict[str, float] = {}
        mbs = self.cfg.train.micro_batch_size
        for i in range(0, len(self.eval_items), mbs):
            _, metrics = self.micro_loss(self.eval_items[i : i + mbs], self.eval_items)
            for k, v in metrics.items():
                sums[f"eval/{k}"] = sums.get(f"eval/{k}", 0.0) + v
        self.model.train()
        return sums

    def save(self, path: str | Path) -> Path:
        return save_hf_folder(self.model, self.tokenizer, path)


# ---------------------------------------------------------------------------------- reward model


class RMLoop(_PreferenceLoop):
    """Bradley-Terry: loss = mean(-log sigmoid(r(chosen) - r(rejected) [- margin])), r read at the
    last token; the margin (each pair's, `PairSample.margin`) with --model.margin_loss_enable; plus
    --model.center_rewards_coef times mean((r(chosen) + r(rejected))^2) where it is above 0."""

    def scores(self, samples: Sequence[TokenSample]) -> torch.Tensor:
        """Scores [N] of prompt + response samples (with their images, a reward model over images); with
        --ds.packing_samples in one packed row, each read at its sample's last token (models.reward.packed_scores)."""
        batch = make_batch(samples, self.tokenizer.pad_token_id, self.cfg.ds.packing_samples)
        with autocast_ctx(self.cfg.model.autocast, model_device(self.model).type):
            return batch_scores(self.model, batch)

    def micro_loss(self, pairs: list, step_pairs: list) -> tuple[torch.Tensor, dict[str, float]]:
        b, w = len(pairs), len(pairs) / len(step_pairs)
        s = self.scores([p.chosen for p in pairs] + [p.rejected for p in pairs])
        margin = None
        if self.cfg.model.margin_loss_enable:
            margin = torch.tensor([p.margin for p in pairs], dtype=s.dtype, device=s.device)
        loss, m = pairwise_loss(s[:b], s[b:], margin)
        if self.cfg.model.center_rewards_coef > 0:
            loss = loss + self.cfg.model.center_rewards_coef * center_penalty(s[:b], s[b:])
        return loss * w, {"loss": float(loss.detach()) * w, "accuracy": float(m["accuracy"]) * w,
                          "reward_margin": float(m["reward_margin"]) * w,
                          "chosen_reward": float(s[:b].detach().mean()) * w,
                          "rejected_reward": float(s[b:].detach().mean()) * w}

    @torch.no_grad()
    def reward_stats(self, pairs: Sequence) -> tuple[float, float]:
        """Mean and std of the scores of every chosen and rejected response in `pairs`."""
        self.model.eval()
        mbs, out = self.cfg.train.micro_batch_size, []
        for i in range(0, len(pairs), mbs):
            chunk = pairs[i : i + mbs]
            out.append(self.scores([p.chosen for p in chunk] + [p.rejected for p in chunk]))
        s = torch.cat(out)
        return float(s.mean()), float(s.std(unbiased=False).clamp(min=1e-6))

    def save(self, path: str | Path, mean: float = 0.0, std: float = 1.0) -> Path:
        """A full sequence-classification folder (LoRA merged) with `mean`/`std` in its config; a reward
        model on a backbone (over images, or of an architecture with no sequence-classification class):
        the folder of models/backbone_reward.py (and the tokenizer)."""
        if hasattr(self.model, "merge_and_unload"):
            self.model = self.model.merge_and_unload()
        self.model.config.mean, self.model.config.std = mean, std
        return save_reward_model(self.model, self.tokenizer, path)


# ---------------------------------------------------------------------------------- DPO


def token_logprobs(model, samples: Sequence, pad_id: int, packing: bool,
                   autocast: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [N, R] of each sample's response tokens in float32, their loss mask [N, R])."""
    batch = make_batch(samples, pad_id, packing)
    with autocast_ctx(autocast, model_device(model).type):
        logp = response_logprobs(model, batch)[0].float()
    return logp, batch.loss_mask.to(logp.device)


def sequence_logprobs(model, samples: Sequence, pad_id: int, packing: bool, autocast: str | None) -> torch.Tensor:
    """Summed response logprobs [N] of each sample (N = len(samples))."""
    return masked_sum(*token_logprobs(model, samples, pad_id, packing, autocast), dim=-1)


class DPOLoop(_PreferenceLoop):
    """DPO (Rafailov et al. 2023), IPO (`--model.ipo_enable`), cDPO (`--model.label_smoothing`)
    against a frozen reference model; with --model.nll_loss_coef c, plus c times the chosen
    responses' NLL (each response's token mean, averaged over the step's pairs: OpenRLHF's DPO + NLL,
    the NLL term of RPO, Pang et al. 2024, arXiv:2404.19733)."""

    def __init__(self, cfg, model, tokenizer, items, eval_items=(), tracker=None, ref=None):
        super().__init__(cfg, model, tokenizer, items, eval_items, tracker)
        self.ref = ref

    def seq_logp(self, model, samples) -> torch.Tensor:
        return sequence_logprobs(model, samples, self.tokenizer.pad_token_id, self.cfg.ds.packing_samples,
                                 self.cfg.model.autocast)

    def micro_loss(self, pairs: list, step_pairs: list) -> tuple[torch.Tensor, dict[str, float]]:
        b, w, m = len(pairs), len(pairs) / len(step_pairs), self.cfg.model
        rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        logp, mask = token_logprobs(self.model, rows, self.tokenizer.pad_token_id, self.cfg.ds.packing_samples,
                                    m.autocast)
        pi = masked_sum(logp, mask, dim=-1)
        with torch.no_grad():
            ref = self.seq_logp(self.ref, rows)
        loss, met = dpo_loss(pi[:b], pi[b:], ref[:b], ref[b:], beta=m.beta, label_smoothing=m.label_smoothing,
                             ipo=m.ipo_enable)
        out = {"loss": float(loss.detach()) * w, "accuracy": float(met["accuracy"]) * w,
               "margin": float(met["margin"]) * w,
               "chosen_reward": float(met["chosen_rewards"].mean()) * w,
               "rejected_reward": float(met["rejected_rewards"].mean()) * w}
        total = loss * w
        if m.nll_loss_coef > 0:
            nll, _ = sft_loss(logp[:b], mask[:b], "seq_mean_token_mean", num_seqs=len(step_pairs))
            total = total + m.nll_loss_coef * nll
            out["nll_loss"] = float(nll.detach())
        return total, out


class KTOLoop(DPOLoop):
    """KTO (Ethayarajh et al. 2024) on unpaired desirable / undesirable examples.

    The reference point uses mismatched pairs: the prompt of example i with the response of
    example i+1 (mod b) of the same micro-batch (OpenRLHF shifts by one within a batch too).
    Departure: the mismatched pair is made by concatenating tokens, not by re-rendering text.
    """

    def micro_loss(self, items: list, step_items: list) -> tuple[torch.Tensor, dict[str, float]]:
        b, w, m = len(items), len(items) / len(step_items), self.cfg.model
        samples = [it.sample for it in items]
        kl = [TokenSample(samples[i].prompt_ids, samples[(i + 1) % b].response_ids, samples[(i + 1) % b].loss_mask,
                          vision=samples[i].vision)  # the prompt's images (a VLM's)
              for i in range(b)]
        pi = self.seq_logp(self.model, samples + kl)
        good = torch.tensor([it.desirable for it in items], device=pi.device)
        with torch.no_grad():
            ref = self.seq_logp(self.ref, samples + kl)
        loss, met = kto_loss(pi[:b][good], pi[:b][~good], pi[b:], ref[:b][good], ref[:b][~good], ref[b:],
                             beta=m.beta, desirable_weight=m.desirable_weight,
                             undesirable_weight=m.undesirable_weight)
        out = {"loss": float(loss.detach()) * w, "kl": float(met["kl"]) * w}
        for name in ("chosen_rewards", "rejected_rewards"):
            if met[name].numel():
                out[name[:-1]] = float(met[name].mean()) * w
        return loss * w, out
