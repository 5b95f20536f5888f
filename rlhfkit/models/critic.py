"""A value model: a causal-LM backbone (without its LM head) plus a scalar value head.

Saved as an HF base-model folder (config.json + model.safetensors, loadable with
`AutoModel.from_pretrained`) plus `value_head.safetensors`.

A vision-language model's critic keeps the VLM's whole base model (vision tower, projector and
language model; models.vision.base_model) as its backbone, so its values see the images: the
batch's image tensors reach its forward as they reach the policy's (models.logprobs.model_inputs).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from torch import nn

from rlhfkit.errors import ModelError
from rlhfkit.models.loading import load_causal_lm, load_errors, save_errors
from rlhfkit.models.logprobs import backbone_response_hidden, decoder_backbone
from rlhfkit.models.vision import (
    base_model,
    is_vision_folder,
    is_vision_model,
    load_vision_model,
)

VALUE_HEAD_FILE = "value_head.safetensors"


def critic_backbone(lm: nn.Module) -> nn.Module:
    """The module of `lm` a value head goes on: a vision-language model's base model (tower, projector
    and language model: the images reach the values), else the causal LM's decoder."""
    if is_vision_model(lm):
        return base_model(lm)
    decoder = decoder_backbone(lm)
    if decoder is None:
        raise ModelError(f"{type(lm).__name__} has no separate decoder backbone to put a value head on.")
    return decoder


class Critic(nn.Module):
    """values = value_head(backbone(input_ids).last_hidden_state), one scalar per position.

    The value head is zero-initialised (no random draw; initial values are 0, as with a
    baseline of 0), so a fresh critic is deterministic given its backbone.
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.get_text_config(decoder=True).hidden_size  # a VLM's: its language model's
        param = next(backbone.parameters())
        self.value_head = nn.Linear(hidden, 1, device=param.device, dtype=param.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_causal_lm(cls, path_or_model: str | os.PathLike | nn.Module, dtype: torch.dtype = torch.float32) -> Critic:
        """Build a critic on the backbone of a causal LM (a local folder, .gguf file or a module); of
        a vision-language model, on its base model (the images reach the values; module docstring).

        A module is deep-copied: the critic never shares weights with the policy passed in.
        """
        if isinstance(path_or_model, nn.Module):
            lm = path_or_model
        elif is_vision_folder(path_or_model):
            lm = load_vision_model(str(path_or_model), dtype=dtype)
        else:
            lm = load_causal_lm(path_or_model, dtype=dtype)
        backbone = critic_backbone(lm)
        return cls(copy.deepcopy(backbone) if lm is path_or_model else backbone)

    @classmethod
    def from_reward_model(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Critic:
        """A critic initialised from a reward model folder (`rlhfkit train rm`): its backbone, and
        its `score` head as the value head (bias 0), so initial values are the RM's scores."""
        from rlhfkit.models.reward import load_reward_model, score_head

        backbone, head = score_head(load_reward_model(path, dtype=dtype))
        critic = cls(backbone)
        with torch.no_grad():
            critic.value_head.weight.copy_(head.weight)
            if head.bias is not None:
                critic.value_head.bias.copy_(head.bias)
        return critic

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, L] (right-padded) -> values [B, L] float32."""
        hidden = self._hidden(input_ids, attention_mask)
        return self.value_head(hidden).squeeze(-1).float()

    def response_values(self, batch) -> torch.Tensor:
        """Values [B, R] float32 of the state before each response token of a batch (any layout
        `response_logprobs` takes).

        Entry (b, j) is the value at input position P_b + j - 1, the position whose logits
        predict response token j (same alignment as `response_logprobs`).
        """
        hidden = backbone_response_hidden(self.backbone, self.backbone, batch)
        return self.value_head(hidden).squeeze(-1).float()

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write the backbone as an HF folder plus `value_head.safetensors` into `path`."""
        from safetensors.torch import save_file

        folder = Path(path)
        with save_errors(folder):
            folder.mkdir(parents=True, exist_ok=True)
            self.backbone.save_pretrained(folder, safe_serialization=True)
            head = {k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
            save_file(head, str(folder / VALUE_HEAD_FILE))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Critic:
        """Load a critic written by `save_pretrained`."""
        from safetensors.torch import load_file
        from transformers import AutoModel

        folder = Path(path).expanduser()
        if not (folder / VALUE_HEAD_FILE).is_file():
            raise ModelError(
                f"{folder} is not a critic folder (no {VALUE_HEAD_FILE}); write one with "
                "Critic.save_pretrained, or build a fresh critic with Critic.from_causal_lm."
            )
        with load_errors("a critic", folder):
            backbone = AutoModel.from_pretrained(folder, dtype=dtype)
            critic = cls(backbone)
            critic.value_head.load_state_dict(load_file(str(folder / VALUE_HEAD_FILE)))
        return critic
