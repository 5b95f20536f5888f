"""Reward models over images: a vision-language model's base model (vision tower, projector and
language model, no LM head) with a scalar `score` head read at each sequence's last token, as
OpenRLHF's reward model reads a text one (docs/vision.md).

transformers has no sequence-classification class for most vision-language models, so the folder
`rlhfkit train rm` writes for one is its own documented layout (`save_vision_reward_model`):

  config.json, model.safetensors   the base model: `AutoModel.from_pretrained(folder)` loads it (e.g.
                                   `Qwen2VLModel`); config.json also holds `mean` and `std`, the scores'
                                   statistics (OpenRLHF's names, as a text reward model's config holds them)
  the processor's files            tokenizer, image processor, chat template: `AutoProcessor.from_pretrained`
  reward_head.safetensors          one tensor, `score.weight` [1, hidden], no bias
  reward_head.json                 {"format": FORMAT, "version": 1, "weights": "reward_head.safetensors",
                                    "hidden_size": hidden, "read_at": "last_attended_token"}

The score of a sequence (right- or left-padded, `attention_mask` 1 on its tokens) is
`score.weight @ h[last]`, h = the base model's `last_hidden_state` (the language model's, after its final
norm) given the ids, the mask and the processor's image tensors, `last` = the last position whose mask is
1. A normalised reward is (score - mean) / std.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from rlhfkit.errors import ModelError
from rlhfkit.models.loading import load_errors, save_errors
from rlhfkit.models.vision import base_model, load_vision_model, token_type_kwargs

FORMAT = "rlhfkit.vision_reward_model"
HEAD_CONFIG = "reward_head.json"
HEAD_WEIGHTS = "reward_head.safetensors"
# Arguments a wrapper's forward may pass that a scoring forward does not take (peft's sequence classifier).
_DROPPED = ("labels", "output_attentions", "output_hidden_states", "return_dict", "inputs_embeds")


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask [B, L] -> LongTensor [B]: each row's last position whose mask is 1."""
    width = attention_mask.shape[1]
    return width - 1 - attention_mask.long().fliplr().argmax(dim=1)


class VisionRewardModel(nn.Module):
    """score [B, 1] = score(base_model(ids, mask, images).last_hidden_state[b, last_b]) (module docstring).

    `model` is the VLM's base model; `config` is its config (mean / std of the scores are set there)."""

    base_model_prefix = "model"

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        hidden = model.config.get_text_config(decoder=True).hidden_size  # the language model's width
        param = next(model.parameters())
        self.score = nn.Linear(hidden, 1, bias=False, device=param.device, dtype=param.dtype)

    @property
    def config(self):
        return self.model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False, **images):
        """input_ids, attention_mask [B, L]; `images`: the processor's image tensors of the rows (concatenated
        in row order, models.vision.concat_vision) and optionally the per-token type ids (derived from the ids
        when not given). Returns an output whose `logits` are the scores [B, 1]."""
        from transformers.modeling_outputs import SequenceClassifierOutput

        inputs = {k: v for k, v in images.items() if v is not None and k not in _DROPPED}
        for name, types in token_type_kwargs(self.model, input_ids).items():
            inputs.setdefault(name, types)
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                            **inputs).last_hidden_state
        last = last_token_index(attention_mask).to(hidden.device)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return SequenceClassifierOutput(logits=self.score(hidden[rows, last]))


def init_vision_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32, seed: int = 0,
                             load_in_4bit: bool = False) -> VisionRewardModel:
    """A reward model on the base model of the VLM in folder `path` (its LM head dropped); the new `score`
    head is drawn from `seed` (normal, std 1/sqrt(hidden+1), as OpenRLHF's and `init_reward_model`'s)
    without touching the global RNG. With `load_in_4bit` (QLoRA) the language model's linear layers are
    4-bit NF4 (models.vision.load_vision_model), the tower, projector and head not."""
    base = base_model(load_vision_model(str(path), dtype=dtype, load_in_4bit=load_in_4bit))
    model = VisionRewardModel(base)
    model.is_loaded_in_4bit = load_in_4bit  # what peft reads to wrap 4-bit layers with its 4-bit LoRA layers
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(model.score.weight.shape, generator=generator) / (model.score.in_features + 1) ** 0.5
    with torch.no_grad():
        model.score.weight.copy_(weight)
    return model


def is_vision_reward_folder(path: str | os.PathLike) -> bool:
    """Whether `path` holds a reward model over images (its reward_head.json names FORMAT)."""
    config = Path(path).expanduser() / HEAD_CONFIG
    if not config.is_file():
        return False
    try:  # an unreadable file is reported by the loader that reads it next
        return json.loads(config.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def dequantized(model: nn.Module) -> nn.Module:
    """`model` with each bitsandbytes 4-bit linear layer (QLoRA's base, adapters merged) replaced by a float
    `nn.Linear` of its dequantized weight, and no quantization config: a folder any loader reads. In place."""
    for name, module in list(model.named_modules()):
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is None:
            continue
        from bitsandbytes.functional import dequantize_4bit

        weight = dequantize_4bit(module.weight.data, state).to(state.dtype)
        linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                           device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if module.bias is not None:
                linear.bias.copy_(module.bias)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, linear)
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            del config.quantization_config
    return model


def save_vision_reward_model(model: VisionRewardModel, path: str | os.PathLike) -> Path:
    """Write `model` as the folder of the module docstring (the processor is saved by the caller); a QLoRA
    model's 4-bit layers are written dequantized (`dequantized`)."""
    from safetensors.torch import save_file

    dequantized(model.model)
    folder = Path(path)
    with save_errors(folder):
        folder.mkdir(parents=True, exist_ok=True)
        model.model.save_pretrained(folder, safe_serialization=True)
        save_file({"score.weight": model.score.weight.detach().cpu().contiguous()}, str(folder / HEAD_WEIGHTS))
        head = {"format": FORMAT, "version": 1, "weights": HEAD_WEIGHTS, "hidden_size": model.score.in_features,
                "read_at": "last_attended_token"}
        (folder / HEAD_CONFIG).write_text(json.dumps(head, indent=2) + "\n")
    return folder


def load_vision_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> VisionRewardModel:
    """A reward model over images written by `save_vision_reward_model` (`rlhfkit train rm`)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    from rlhfkit.models.loading import _all_weights_loaded
    from rlhfkit.models.vision import check_torchvision

    folder = Path(path).expanduser()
    if not is_vision_reward_folder(folder):
        raise ModelError(f"{folder} is not a reward model over images (no {HEAD_CONFIG} naming {FORMAT}); "
                         "train one with `rlhfkit train rm` on a vision-language model")
    check_torchvision()
    with load_errors("a reward model over images", folder):
        base = _all_weights_loaded(AutoModel.from_pretrained(folder, dtype=dtype, output_loading_info=True), folder)
        model = VisionRewardModel(base)
        head = load_file(str(folder / HEAD_WEIGHTS))
        if set(head) != {"score.weight"} or tuple(head["score.weight"].shape) != tuple(model.score.weight.shape):
            raise ModelError(f"{folder / HEAD_WEIGHTS}: expected one tensor score.weight of shape "
                             f"{tuple(model.score.weight.shape)}, found "
                             f"{ {k: tuple(v.shape) for k, v in head.items()} }; re-save the reward model")
        model.score.load_state_dict({"weight": head["score.weight"]})
    return model.eval()
