"""Distillation from a frozen teacher that shares the student's tokenizer.

Knowledge distillation (`rlhfkit train kd`, `KDTrainer`): the supervised step loop on SFT data with

    loss = (1 - kd.coef) * NLL(response) + kd.coef * KL(teacher || student)

over response tokens, each term the token mean over the whole optimizer step. The mix is
OpenRLHF's `train_kd` (`gpt_loss * (1 - kd_coef) + distil_loss * kd_coef`); its distillation term
is the cross-entropy `-sum_v p_t log p_s`, which is the KL plus the teacher's entropy (a constant:
the same gradient); we log the KL itself, 0 when the student matches the teacher. The KL runs on
the two models' last hidden states and LM-head weights a chunk of positions at a time
(core.distill.linear_forward_kl), so the `[positions, vocabulary]` logits are never kept whole.

On-policy distillation (`rlhfkit train opd`, `train rl --algo.teacher_model_name_or_path`):
`TeacherScorer` gives the RL loop's score stage per-token rewards from the teacher's logprobs of
the student's own samples (see there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.distill import forward_kl_from_logits, linear_forward_kl, topk_reverse_kl
from rlhfkit.core.kl import approx_kl
from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import logprobs_and_entropy
from rlhfkit.errors import ConfigError
from rlhfkit.models import response_logits, response_logprobs
from rlhfkit.models.logprobs import backbone_response_hidden, split_backbone
from rlhfkit.models.precision import autocast_ctx, model_device, on_device
from rlhfkit.data.batch import collate, pad_response_values
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.trainers.build import load_policy
from rlhfkit.trainers.experience import Experience, forward_passes
from rlhfkit.trainers.scoring import Scored, Scorer
from rlhfkit.trainers.supervised import SFTTrainer, make_batch
from rlhfkit.trainers.update import PolicyUpdate


# ---------------------------------------------------------------------------------- the teacher
def load_teacher(path: str, dtype: str, student_tokenizer) -> torch.nn.Module:
    """The frozen teacher (eval mode, no gradients) at `path`; refused when its tokenizer is not
    the student's (distillation compares the two distributions token by token)."""
    teacher, tokenizer = load_policy(path, dtype)
    check_same_vocab(student_tokenizer, tokenizer, path)
    return teacher.eval().requires_grad_(False)


def check_same_vocab(student_tokenizer, teacher_tokenizer, teacher_path: str) -> None:
    """ConfigError unless both tokenizers map the same strings to the same ids."""
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ConfigError(
            f"the teacher {teacher_path} has another tokenizer ({len(teacher_tokenizer)} tokens, the student "
            f"{len(student_tokenizer)}): distillation compares the two models token by token; choose a teacher "
            "of the student's model family (the same tokenizer)")


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
class KDTrainer(SFTTrainer):
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


# ---------------------------------------------------------------------------------- on-policy distillation
class TeacherScorer:
    """The RL score stage with a teacher (on-policy distillation: Agarwal et al. 2024, GKD,
    arXiv:2306.13649; Thinking Machines' "On-Policy Distillation", 2025; OpenRLHF's `train_opd`).

    `base` scores the task (a reward function; a zero one for pure distillation); then the teacher
    computes its logprob of every sampled response token, at the sampling `temperature`, in
    micro-batches of `micro_batch_size` rows. With `topk` 0 the per-token reward of a sampled token is
    `-coef * (log p_policy - log p_teacher)` (the policy's logprob is the engine's, recorded at
    sampling), handed on as `Scored.token_rewards` [B, R] beside the task's scalar reward; the
    advantage estimator decides the baseline (train opd: reinforce with gamma 0 and no whitening, so
    each token's advantage is its own reward: the gradient of OpenRLHF's sampled-token loss). With
    `topk` > 0 the teacher term is a loss in the update (`TeacherLossUpdate`) and only the metric is
    computed here. Metric opd/kl: the token mean of `kl_estimator` (core.approx_kl) over the samples.
    `device`: where the teacher runs; with `offload` it waits on the CPU between its passes.
    """

    def __init__(self, base: Scorer, teacher: torch.nn.Module, *, coef: float, topk: int, kl_estimator: str,
                 temperature: float, micro_batch_size: int, pad_id: int, autocast: str | None,
                 device: torch.device, offload: bool = False):
        self.base, self.teacher, self.coef, self.topk, self.kl_estimator = base, teacher, coef, topk, kl_estimator
        self.temperature, self.micro_batch_size, self.pad_id = temperature, micro_batch_size, pad_id
        self.autocast, self.device, self.offload = autocast, device, offload

    @property
    def tokenizer(self):
        return self.base.tokenizer

    def __call__(self, prompts: list[PromptItem], trajs: list[Trajectory]) -> Scored:
        scored = self.base(prompts, trajs)
        batch = collate(trajs, self.pad_id)
        mask = batch.loss_mask
        policy = pad_response_values([t.logprobs for t in trajs], mask.shape[1])
        teacher = self.teacher_logprobs(batch)
        count = mask.sum().clamp(min=1)
        metrics = {**scored.metrics,
                   "opd/kl": float((approx_kl(policy, teacher, self.kl_estimator) * mask).sum() / count)}
        token_rewards = scored.token_rewards
        if self.topk == 0:
            dense = torch.where(mask, -self.coef * (policy - teacher), 0.0)
            metrics["opd/reward"] = float(dense.sum() / count)
            if token_rewards is not None:
                width = mask.shape[1]
                dense = dense + torch.nn.functional.pad(token_rewards.float(), (0, width - token_rewards.shape[1]))
            token_rewards = dense
        return Scored(scored.rewards, scored.scores, token_rewards, metrics)

    def teacher_logprobs(self, batch) -> torch.Tensor:
        """The teacher's logprob [N, R] (on the CPU) of each response token of `batch`."""
        n = batch.response_ids.shape[0]
        chunks = [torch.arange(i, min(i + self.micro_batch_size, n)) for i in range(0, n, self.micro_batch_size)]

        def logp(mb):
            return response_logprobs(self.teacher, mb, temperature=self.temperature)[0]

        with autocast_ctx(self.autocast, self.device.type), on_device(self.teacher if self.offload else None,
                                                                       self.device):
            return forward_passes({"teacher": logp}, batch, chunks)["teacher"]

    def state_dict(self) -> dict:
        return self.base.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state)


class TeacherLossUpdate(PolicyUpdate):
    """The policy update plus `teacher_coef` x the top-k reverse KL to the teacher (core.distill.
    topk_reverse_kl over the policy's `teacher_topk` most likely tokens, at the sampling temperature),
    aggregated like the policy loss: OpenRLHF's `train_opd --opd.topk k`. The policy loss of the task
    advantages runs first (zero advantages: no gradient), then one more forward of the policy with its
    whole response logits for this term. Logged: opd/topk_kl (token mean)."""

    def __init__(self, *args, teacher: torch.nn.Module, teacher_coef: float, teacher_topk: int,
                 teacher_offload: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher, self.teacher_coef, self.teacher_topk = teacher, teacher_coef, teacher_topk
        self.teacher_offload = teacher_offload

    def micro_step(self, exp: Experience, rows: torch.Tensor, layout, kl_coef: float, counts: dict) -> dict[str, float]:
        out = super().micro_step(exp, rows, layout, kl_coef, counts)
        mb, _ = exp.select(rows, layout)
        logits = response_logits(self.policy, mb)
        with torch.no_grad(), on_device(self.teacher if self.teacher_offload else None, logits.device):
            teacher_logits = response_logits(self.teacher, mb).to(logits.device)
        kl = topk_reverse_kl(logits, teacher_logits, self.teacher_topk, self.losses.temperature)
        mask = mb.loss_mask.to(kl.device)
        self.learner.backward(self.teacher_coef * aggregate_loss(kl, mask, self.losses.agg, **counts))
        out["opd/topk_kl"] = float((kl.detach() * mask).sum())
        return out

    def idle_pass(self, exp: Experience, rows: torch.Tensor, layout) -> None:
        super().idle_pass(exp, rows, layout)
        mb, _ = exp.select(rows, layout)  # and the teacher term's second forward/backward of the policy
        self.learner.backward(response_logits(self.policy, mb).float().sum() * 0.0)
