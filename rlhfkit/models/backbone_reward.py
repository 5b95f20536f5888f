"""Reward models on a base model: a model's backbone (no LM head) with a scalar bias-free `score` head read
at each sequence's last attended token, as OpenRLHF's reward model reads a text one. Two kinds use it:

- a causal LM whose architecture has no `*ForSequenceClassification` class in transformers (Cohere2,
  Falcon-H1, Mamba, RWKV, LFM2, Granite, ...): the backbone is its decoder, the module a PPO critic
  puts its value head on (`models.critic.critic_backbone`);
- a vision-language model: the backbone is its base model (tower, projector, language model;
  models/vision_reward.py), so the scores see the images.

transformers cannot load either as a sequence classifier, so the folder `rlhfkit train rm` writes is this
documented layout (`save_backbone_reward_model`):

  config.json, model.safetensors   the backbone: `AutoModel.from_pretrained(folder)` loads it (e.g.
                                   `Cohere2Model`, `Qwen2VLModel`); config.json also holds `mean` and `std`, the
                                   scores' statistics (OpenRLHF's names, as a text reward model's config holds them)
  the tokenizer's (or processor's) files
  reward_head.safetensors          one tensor, `score.weight` [1, hidden], no bias
  reward_head.json                 {"format": TEXT_FORMAT or models.vision_reward.FORMAT, "version": 1,
                                    "weights": "reward_head.safetensors", "hidden_size": hidden,
                                    "read_at": "last_attended_token"}

The score of a sequence (right- or left-padded, `attention_mask` 1 on its tokens; a recurrent backbone,
Mamba's or RWKV's, ignores the mask, so its rows must be right-padded, as every caller in rlhfkit pads them) is
`score.weight @ h[last]`, h = the backbone's `last_hidden_state` (after its final norm), `last` = the last
position whose mask is 1. A normalised reward is (score - mean) / std.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from rlhfkit.errors import ModelError
from rlhfkit.models.critic import critic_backbone
from rlhfkit.models.loading import _all_weights_loaded, load_causal_lm, load_errors, save_errors
from rlhfkit.models.vision import token_type_kwargs

TEXT_FORMAT = "rlhfkit.backbone_reward_model"
HEAD_CONFIG = "reward_head.json"
HEAD_WEIGHTS = "reward_head.safetensors"
# Arguments a wrapper's forward may pass that a scoring forward does not take (peft's sequence classifier).
_DROPPED = ("labels", "output_attentions", "output_hidden_states", "return_dict", "inputs_embeds")


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask [B, L] -> LongTensor [B]: each row's last position whose mask is 1."""
    width = attention_mask.shape[1]
    return width - 1 - attention_mask.long().fliplr().argmax(dim=1)


class BackboneRewardModel(nn.Module):
    """score [B, 1] = score(model(ids, mask, images).last_hidden_state[b, last_b]) (module docstring).

    `model` is the backbone; `config` is its config (mean / std of the scores are set there); `format` is
    what its folder's reward_head.json names."""

    base_model_prefix = "model"
    format = TEXT_FORMAT

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.name_or_path = model.config.name_or_path  # as a transformers model's: peft records it as the base
        hidden = model.config.get_text_config(decoder=True).hidden_size  # a VLM's: its language model's width
        param = next(model.parameters())
        self.score = nn.Linear(hidden, 1, bias=False, device=param.device, dtype=param.dtype)

    @property
    def config(self):
        return self.model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False, **images):
        """input_ids, attention_mask [B, L]; `images`: a VLM's processor image tensors of the rows (concatenated
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


def draw_score_head(model: BackboneRewardModel, seed: int) -> BackboneRewardModel:
    """`model` with its `score` head drawn from `seed` (normal, std 1/sqrt(hidden+1), as OpenRLHF's and
    `models.reward.init_reward_model`'s) without touching the global RNG."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(model.score.weight.shape, generator=generator) / (model.score.in_features + 1) ** 0.5
    with torch.no_grad():
        model.score.weight.copy_(weight)
    return model


def init_backbone_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32, seed: int = 0,
                               load_in_4bit: bool = False) -> BackboneRewardModel:
    """A reward model on the decoder of the causal LM in folder `path` (its LM head dropped; the backbone a
    critic takes, `models.critic.critic_backbone`), its head drawn from `seed` (`draw_score_head`). With
    `load_in_4bit` (QLoRA) the decoder's linear layers are 4-bit NF4, the head not."""
    model = BackboneRewardModel(critic_backbone(load_causal_lm(path, dtype=dtype, load_in_4bit=load_in_4bit)))
    model.is_loaded_in_4bit = load_in_4bit  # what peft reads to wrap 4-bit layers with its 4-bit LoRA layers
    return draw_score_head(model, seed)


def head_format(path: str | os.PathLike) -> str | None:
    """The format its reward_head.json names, of a folder `path` of this module's layout; else None."""
    config = Path(path).expanduser() / HEAD_CONFIG
    if not config.is_file():
        return None
    try:  # an unreadable file is reported by the loader that reads it next
        value = json.loads(config.read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


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


def save_backbone_reward_model(model: BackboneRewardModel, path: str | os.PathLike) -> Path:
    """Write `model` as the folder of the module docstring (the tokenizer or processor is saved by the caller); a
    QLoRA model's 4-bit layers are written dequantized (`dequantized`)."""
    from safetensors.torch import save_file

    dequantized(model.model)
    folder = Path(path)
    with save_errors(folder):
        folder.mkdir(parents=True, exist_ok=True)
        model.model.save_pretrained(folder, safe_serialization=True)
        save_file({"score.weight": model.score.weight.detach().cpu().contiguous()}, str(folder / HEAD_WEIGHTS))
        head = {"format": model.format, "version": 1, "weights": HEAD_WEIGHTS, "hidden_size": model.score.in_features,
                "read_at": "last_attended_token"}
        (folder / HEAD_CONFIG).write_text(json.dumps(head, indent=2) + "\n")
    return folder


def load_backbone_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                               cls: type[BackboneRewardModel] = BackboneRewardModel,
                               what: str = "a reward model") -> BackboneRewardModel:
    """A reward model written by `save_backbone_reward_model`, as `cls` (whose `format` the folder must name)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    folder = Path(path).expanduser()
    if head_format(folder) != cls.format:
        raise ModelError(f"{folder} is not {what} (no {HEAD_CONFIG} naming {cls.format}); "
                         "train one with `rlhfkit train rm`")
    with load_errors(what, folder):
        base = _all_weights_loaded(AutoModel.from_pretrained(folder, dtype=dtype, output_loading_info=True), folder)
        model = cls(base)
        head = load_file(str(folder / HEAD_WEIGHTS))
        if set(head) != {"score.weight"} or tuple(head["score.weight"].shape) != tuple(model.score.weight.shape):
            raise ModelError(f"{folder / HEAD_WEIGHTS}: expected one tensor score.weight of shape "
                             f"{tuple(model.score.weight.shape)}, found "
                             f"{ {k: tuple(v.shape) for k, v in head.items()} }; re-save the reward model")
        model.score.load_state_dict({"weight": head["score.weight"]})
    return model.eval()
