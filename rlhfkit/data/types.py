"""Typed batches that flow between rollout, rewards and trainers.

A `Trajectory` is one sampled response (token-in, token-out): the engine's own token ids and
their logprobs, never re-tokenized text. `loss_mask` is True on action tokens (the ones the
policy generated and is trained on) and False on environment feedback appended by agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FINISH_STOP = "stop"  # a stop token (EOS or a user stop id) was generated; it is kept in response_ids
FINISH_LENGTH = "length"  # max_new_tokens (or a token budget) was reached


@dataclass
class PromptItem:
    """A tokenized prompt of the dataset.

      text    the string given to the tokenizer (input template or chat template applied)
      ids     its token ids
      label   the dataset's label value (e.g. the reference answer), None without a label key
      raw     the dataset's prompt value before templating: a string or a list of
              {"role", "content"} messages (reward functions of TRL's contract see this)
      record  the whole dataset row (every column reaches the reward function by name)
      vision  the processor's image tensors (data.images.VisionInputs) of a prompt with images,
              else None; `ids` then hold each image's tokens
      images  its opened images (PIL), for an executor that renders the prompt again through the
              processor (tool calling: the tool schemas join it), else None
    """

    text: str
    ids: list[int]
    label: Any = None
    raw: Any = None
    record: dict[str, Any] = field(default_factory=dict)
    vision: Any = None
    images: list | None = None


@dataclass
class Trajectory:
    """One sampled response to one prompt.

    Shapes: P = prompt length, R = response length.
      prompt_ids   LongTensor [P]
      response_ids LongTensor [R]   everything after the prompt (actions and feedback tokens)
      loss_mask    BoolTensor [R]   True = an action token that counts in the loss
      logprobs     FloatTensor [R]  the rollout policy's logprob of each response token under the
                                    sampling temperature (0.0 where loss_mask is False)
      versions     LongTensor [R] or None  the policy version that produced each token (feedback
                                    tokens: the version of the action before them); None: all
                                    `version`. `version` is then the oldest of them.
      experts      [P + R, L, k] uint8/int16 or None  a mixture-of-experts policy's routing in the
                                    engine (--actor.routing_replay): the k experts each of its L MoE
                                    layers chose for each prompt and response token, as the codes of
                                    core.moe (missing_code where the engine did not compute the token);
                                    None: not recorded.
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    finish_reason: str
    version: int
    group_id: int = 0  # index of the prompt this sample answers (samples of one prompt share it)
    info: dict[str, Any] = field(default_factory=dict)
    versions: torch.Tensor | None = None
    experts: torch.Tensor | None = None

    @property
    def vision(self):
        """The prompt's image tensors (data.images.VisionInputs, set by a vision engine), else None."""
        return self.info.get("vision")

    @property
    def response_length(self) -> int:
        return int(self.response_ids.numel())

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FINISH_LENGTH
