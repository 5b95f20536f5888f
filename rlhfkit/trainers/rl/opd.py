"""On-policy distillation (`rlhfkit train opd`, `train rl --algo.teacher_model_name_or_path`): the RL
loop's score stage and update with a frozen teacher that shares the student's tokenizer.

`TeacherScorer` gives the score stage per-token rewards from the teacher's logprobs of the student's
own samples; `TeacherLossUpdate` adds the top-k reverse KL to the teacher as a loss in the update.
(Knowledge distillation on fixed data is trainers/supervised/kd.py.)
"""

from __future__ import annotations

import torch

from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.distill import topk_reverse_kl
from rlhfkit.core.kl import approx_kl
from rlhfkit.data.batch import collate, pad_response_values
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.models import response_logits, response_logprobs
from rlhfkit.models.precision import autocast_ctx, on_device
from rlhfkit.trainers.rl.experience import Experience, forward_passes
from rlhfkit.trainers.rl.scoring import Scored, Scorer
from rlhfkit.trainers.rl.update import PolicyUpdate


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

    def micro_step(self, exp: Experience, rows: torch.Tensor, layout, kl_coef: float, counts: dict) -> dict:
        out = super().micro_step(exp, rows, layout, kl_coef, counts)
        mb = exp.select(rows, layout).batch
        logits = response_logits(self.policy, mb)
        with torch.no_grad(), on_device(self.teacher if self.teacher_offload else None, logits.device):
            teacher_logits = response_logits(self.teacher, mb).to(logits.device)
        kl = topk_reverse_kl(logits, teacher_logits, self.teacher_topk, self.losses.temperature)
        mask = mb.loss_mask.to(kl.device)
        self.learner.backward(self.teacher_coef * aggregate_loss(kl, mask, self.losses.agg, **counts))
        out["opd/topk_kl"] = (kl.detach() * mask).sum()  # read with the step's other sums
        return out

    def idle_pass(self, exp: Experience, rows: torch.Tensor, layout, train_actor: bool = True) -> None:
        super().idle_pass(exp, rows, layout, train_actor)
        if train_actor:  # and the teacher term's second forward/backward of the policy
            mb = exp.select(rows, layout).batch
            self.learner.backward(response_logits(self.policy, mb).float().sum() * 0.0)
