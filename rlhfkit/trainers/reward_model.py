"""A trained reward model as an RL reward function (`train rl --reward.model_name_or_path`).

It follows the reward-function contract of rewards/base.py: `queries` (prompt + response
text, special tokens kept) are tokenized with the reward model's own tokenizer (the RM may not
share the policy's vocabulary, as in OpenRLHF), scored at the last token, and normalised with
the `mean` / `std` that `rlhfkit train rm` stored in the RM's config:
reward = (score - mean) / std. The raw score is logged as `reward_extra/rm_score`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhfkit.models import load_tokenizer
from rlhfkit.models.precision import model_device, on_device
from rlhfkit.models.reward import load_reward_model, normalization, reward_scores
from rlhfkit.rewards.base import RewardOutput


class RewardModelFn:
    """reward_func(queries, prompts, labels, **kwargs) backed by a sequence-classification RM."""

    def __init__(self, path: str | Path, micro_batch_size: int = 8, normalize: bool = True,
                 model=None, tokenizer=None, device: torch.device | str = "cpu", offload: bool = False):
        """`device`: where it scores; `offload`: kept on the CPU between calls, moved to `device` for each."""
        self.model = (model or load_reward_model(path)).eval().requires_grad_(False)
        self.device, self.offload = torch.device(device), offload
        if not offload:
            self.model.to(self.device)
        self.tokenizer = tokenizer or load_tokenizer(path)
        self.micro_batch_size = micro_batch_size
        self.mean, self.std = normalization(self.model) if normalize else (0.0, 1.0)

    @torch.no_grad()
    def __call__(self, queries: list[str], prompts: list[str], labels: list, **kwargs) -> RewardOutput:
        with on_device(self.model, self.device if self.offload else None):
            scores = torch.cat([self._score(queries[i : i + self.micro_batch_size]).cpu()
                                for i in range(0, len(queries), self.micro_batch_size)])
        rewards = (scores - self.mean) / self.std
        return RewardOutput(rewards=rewards, scores=rewards.clone(), extra_logs={"rm_score": scores})

    def _score(self, texts: list[str]) -> torch.Tensor:
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        device = model_device(self.model)
        return reward_scores(self.model, input_ids.to(device), attention.to(device))
