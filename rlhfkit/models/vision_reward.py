"""Reward models over images: a vision-language model's base model (vision tower, projector and
language model, no LM head) with a scalar `score` head read at each sequence's last token, as
OpenRLHF's reward model reads a text one (docs/vision.md).

transformers has no sequence-classification class for most vision-language models, so the folder
`rlhfkit train rm` writes for one is the layout of models/backbone_reward.py (a backbone, its head in
reward_head.safetensors, reward_head.json) with FORMAT in reward_head.json and the processor's files
(tokenizer, image processor, chat template: `AutoProcessor.from_pretrained`). The backbone is the VLM's base
model (`AutoModel.from_pretrained(folder)` loads it, e.g. `Qwen2VLModel`), given the ids, the mask and the
processor's image tensors.
"""

from __future__ import annotations

import os

import torch

from rlhfkit.models.backbone_reward import (
    BackboneRewardModel,
    draw_score_head,
    head_format,
    load_backbone_reward_model,
)
from rlhfkit.models.vision import base_model, load_vision_model

FORMAT = "rlhfkit.vision_reward_model"


class VisionRewardModel(BackboneRewardModel):
    """A reward model on a VLM's base model: its forward takes the rows' image tensors
    (models/backbone_reward.py); its folder names FORMAT."""

    format = FORMAT


def init_vision_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32, seed: int = 0,
                             load_in_4bit: bool = False) -> VisionRewardModel:
    """A reward model on the base model of the VLM in folder `path` (its LM head dropped); the new `score`
    head is drawn from `seed` (models.backbone_reward.draw_score_head). With `load_in_4bit` (QLoRA) the
    language model's linear layers are 4-bit NF4 (models.vision.load_vision_model), the tower, projector
    and head not."""
    base = base_model(load_vision_model(str(path), dtype=dtype, load_in_4bit=load_in_4bit))
    model = VisionRewardModel(base)
    model.is_loaded_in_4bit = load_in_4bit  # what peft reads to wrap 4-bit layers with its 4-bit LoRA layers
    return draw_score_head(model, seed)


def is_vision_reward_folder(path: str | os.PathLike) -> bool:
    """Whether `path` holds a reward model over images (its reward_head.json names FORMAT)."""
    return head_format(path) == FORMAT


def load_vision_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> VisionRewardModel:
    """A reward model over images written by `save_backbone_reward_model` (`rlhfkit train rm`)."""
    from rlhfkit.models.vision import check_torchvision

    if is_vision_reward_folder(path):
        check_torchvision()
    return load_backbone_reward_model(path, dtype, VisionRewardModel, "a reward model over images")
