"""Knowledge distillation from a frozen teacher that shares the student's tokenizer.

`rlhfkit train kd` (`KDLoop`): the supervised step loop on SFT data with

    loss = (1 - kd.coef) * NLL(response) + kd.coef * KL(teacher || student)

over response tokens, each term the token mean over the whole optimizer step. The mix is
OpenRLHF's `train_kd` (`gpt_loss * (1 - kd_coef) + distil_loss * kd_coef`); its distillation term
is the cross-entropy `-sum_v p_t log p_s`, which is the KL plus the teacher's entropy (a constant:
the same gradient); we log the KL itself, 0 when the student matches the teacher. The KL runs on
the two models' last hidden states and LM-head weights a chunk of positions at a time
(core.distill.linear_forward_kl), so the `[positions, vocabulary]` logits are never kept whole. On-policy distillation
(the RL side) is trainers/rl/opd.py; the teacher is loaded by models.loading.load_teacher.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhfkit.core.distill import forward_kl_from_logits, linear_forward_kl
from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import logprobs_and_entropy
from rlhfkit.errors import ConfigError
from rlhfkit.models import response_logits
from rlhfkit.models.logprobs import backbone_response_hidden, split_backbone
from rlhfkit.models.precision import autocast_ctx, model_device, on_device
from rlhfkit.trainers.supervised.loop import make_batch
from rlhfkit.trainers.supervised.sft import SFTLoop


def plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(backbone, LM-head weight [V, H]) when the logits are a bias-free linear map of the backbone's
    last hidden state; None otherwise (the logits then come from the model's forward)."""
    parts = split_backbone(model)
    if parts is None or type(parts[1]) is not torch.nn.Linear or parts[1].bias is not None:
        return None
    return parts[0], parts[1].weight


def shared_rows(w_s: torch.Tensor, w_t: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two heads cut to the tokenizer's `vocab` rows when their padded sizes differ (e.g. a
    family whose sizes pad the embedding differently); unchanged when they agree."""
    if w_s.shape[0] == w_t.shape[0]:
        return w_s, w_t
    return w_s[:vocab], w_t[:vocab]


# ---------------------------------------------------------------------------------- KD
class KDLoop(SFTLoop):
    """SFT with a forward-KL term to a frozen teacher (`ref`), weighted by --kd.coef.

    `ref` is the teacher (the frozen model the supervised builder loads beside the student); with
    --teacher.offload it waits on the CPU and moves to the student's device for each of its passes.
    Metrics of a step: loss, nll (the SFT term), kl (token-mean KL(teacher || student)).
    """

    def __init__(self, cfg, model: torch.nn.Module, tokenizer, samples: Sequence, eval_samples: Sequence = (),
                 tracker=None, ref: torch.nn.Module | None = None):
        if ref is None:
            raise ConfigError("knowledge distillation needs a teacher: --teacher.model_name_or_path")
        super().__init__(cfg, model, tokenizer, samples, eval_samples, tracker)
        self.teacher = ref

    def micro_loss(self, samples: list, step_samples: list) -> tuple[torch.Tensor, dict[str, float]]:
        num_tokens = sum(int(s.loss_mask.sum()) for s in step_samples)
        logp, kl, mask = self.token_terms(samples)
        nll = (-logp * mask).sum() / num_tokens
        kd = (kl * mask).sum() / num_tokens
        coef = self.cfg.kd.coef
        loss = (1 - coef) * nll + coef * kd
        return loss, {"loss": float(loss.detach()), "nll": float(nll.detach()), "kl": float(kd.detach())}

    def token_terms(self, samples: Sequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(student logprobs of the response tokens, KL(teacher || student) per position, loss mask),
        each [B, R] on the student's device."""
        batch = make_batch(samples, self.tokenizer.pad_token_id, self.cfg.ds.packing_samples)
        device = model_device(self.model)
        labels = batch.response_ids.to(device)
        student, teacher = plain_head(self.model), plain_head(self.teacher)
        with autocast_ctx(self.cfg.model.autocast, device.type):
            with torch.no_grad(), on_device(self.teacher if self.cfg.teacher.offload else None, device):
                t_out = (response_logits(self.teacher, batch) if student is None or teacher is None
                         else backbone_response_hidden(self.teacher, teacher[0], batch))
                # (a copy when offloaded: the teacher's own weight goes back to the CPU after this block)
                t_weight = None if teacher is None else teacher[1].detach().to(device, copy=self.cfg.teacher.offload)
            t_out = t_out.to(device)
            if student is None or teacher is None:  # a head that is not a plain linear map: whole logits
                logits = response_logits(self.model, batch)
                logp = logprobs_and_entropy(logits, labels)[0]
                kl = forward_kl_from_logits(logits, t_out)
            else:
                hidden = backbone_response_hidden(self.model, student[0], batch)
                logp = linear_logprobs_and_entropy(hidden, student[1], labels, with_entropy=False)[0]
                w_s, w_t = shared_rows(student[1], t_weight, len(self.tokenizer))
                kl = linear_forward_kl(hidden, w_s, t_out, w_t, self.cfg.kd.chunk_size)
        return logp.float(), kl, batch.loss_mask.to(device)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Token-mean NLL and KL(teacher || student) over the eval samples (micro-batched)."""
        self.model.eval()
        nll, kl, count = 0.0, 0.0, 0
        mbs = self.cfg.train.micro_batch_size
        for i in range(0, len(self.eval_samples), mbs):
            logp, kl_tok, mask = self.token_terms(self.eval_samples[i : i + mbs])
            nll += float((-logp * mask).sum())
            kl += float((kl_tok * mask).sum())
            count += int(mask.sum())
        self.model.train()
        return {"eval/loss": nll / max(count, 1), "eval/kl": kl / max(count, 1)}


