"""Reward models: a causal-LM backbone with a scalar `score` head read at the last token; and
process reward models (a causal LM read at step ends, see the end of this file). A reward model over
images (a vision-language model's base model with a `score` head, models/vision_reward.py) and one on a
causal LM whose architecture has no sequence-classification class in transformers (its decoder with a
`score` head) have their own folder layout: models/backbone_reward.py; `load_reward_model` and
`reward_scores` take all three.

A reward model is an HF `*ForSequenceClassification` with `num_labels=1` (for Llama,
`LlamaForSequenceClassification`: `model` backbone + bias-free `score` Linear). HF reads the
score at the last token that is not `pad_token_id`, so the folder we save loads with
`AutoModelForSequenceClassification.from_pretrained(path)` and gives the same scores as
training did. Normalisation statistics are stored in its config as `mean` and `std`
(OpenRLHF's names): a normalised reward is `(score - mean) / std`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rlhfkit.errors import ModelError
from rlhfkit.models.backbone_reward import (
    HEAD_CONFIG,
    TEXT_FORMAT,
    BackboneRewardModel,
    head_format,
    init_backbone_reward_model,
    load_backbone_reward_model,
    save_backbone_reward_model,
)
from rlhfkit.models.loading import (
    keep_4bit_layout,
    load_errors,
    nf4_config,
    resolve_model_file,
    resolve_model_path,
    save_errors,
    save_hf_folder,
)
from rlhfkit.models.precision import model_device
from rlhfkit.models.vision import is_vision_folder, vision_kwargs
from rlhfkit.models.vision_reward import (
    VisionRewardModel,
    init_vision_reward_model,
    is_vision_reward_folder,
    load_vision_reward_model,
)


def init_reward_model(path: str | os.PathLike, pad_token_id: int, dtype: torch.dtype = torch.float32,
                      seed: int = 0, load_in_4bit: bool = False) -> torch.nn.Module:
    """A reward model on the backbone of the causal LM in folder `path`; the new `score` head is
    initialised from `seed` (normal, std 1/sqrt(hidden+1), as OpenRLHF) without touching the
    global RNG. With `load_in_4bit` (QLoRA) the backbone's linear layers are 4-bit NF4, the head not.
    An architecture with no `*ForSequenceClassification` class in transformers (Cohere2, Falcon-H1, Mamba,
    ...) gets its decoder with the same head instead (models/backbone_reward.py); a vision-language model
    its base model, a reward model over images (models/vision_reward.py)."""
    from transformers import AutoModelForSequenceClassification

    folder = resolve_model_path(path)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: no config.json; pass an HF model folder, a hub name (or `smollm2`)")
    if is_vision_folder(folder):
        return init_vision_reward_model(folder, dtype, seed=seed, load_in_4bit=load_in_4bit)
    if not has_classifier(folder):
        model = init_backbone_reward_model(folder, dtype, seed=seed, load_in_4bit=load_in_4bit)
        model.config.pad_token_id = pad_token_id
        return model
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        with load_errors("a reward model backbone", folder):
            quantized = {"quantization_config": nf4_config(dtype, keep=("score",))} if load_in_4bit else {}
            model = AutoModelForSequenceClassification.from_pretrained(
                folder, num_labels=1, dtype=dtype, pad_token_id=pad_token_id, **quantized)
        head = model.score
        torch.nn.init.normal_(head.weight, std=1.0 / (model.config.hidden_size + 1) ** 0.5)
        if getattr(head, "bias", None) is not None:
            torch.nn.init.zeros_(head.bias)
    finally:
        torch.random.set_rng_state(rng)
    model.config.pad_token_id = pad_token_id
    return keep_4bit_layout(model) if load_in_4bit else model


def has_classifier(folder: Path) -> bool:
    """Whether transformers has a `*ForSequenceClassification` class for the architecture of the model
    folder's config.json (its `model_type`) that scores the last token with a `score` Linear head (built on
    the meta device to see: the BERT / RoBERTa family's `classifier` reads the first token); an unreadable
    config is reported by the loader that reads it."""
    import json

    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return True
    if model_type is None or model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        return model_type is None
    try:
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(folder))
    except Exception:  # noqa: BLE001 - the loader that builds it next reports what is wrong
        return True
    return isinstance(getattr(model, "score", None), torch.nn.Linear)


def load_reward_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A reward model saved by `rlhfkit train rm`: any HF sequence-classification folder, a reward model
    over images (models/vision_reward.py) or one on a causal LM's decoder (models/backbone_reward.py)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    folder = resolve_model_path(path)
    if is_vision_reward_folder(folder):
        return load_vision_reward_model(folder, dtype)
    if head_format(folder) == TEXT_FORMAT:
        return load_backbone_reward_model(folder, dtype)
    if not is_reward_model_folder(folder):
        raise ModelError(f"{folder} is not a reward-model folder (its config.json names no "
                         f"*ForSequenceClassification architecture and it has no {HEAD_CONFIG}); train one with "
                         "`rlhfkit train rm`")
    with load_errors("a reward model", folder):
        config = AutoConfig.from_pretrained(folder)
        if config.num_labels != 1:
            raise ModelError(f"{folder}: a reward model has num_labels=1, this one has {config.num_labels}")
        return AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype)


def save_reward_model(model: torch.nn.Module, tokenizer, path: str | os.PathLike) -> Path:
    """Write reward model `model` (its LoRA merged) and `tokenizer` as the folder `load_reward_model` reads: a
    sequence-classification model's HF folder, or a reward model on a backbone's (models/backbone_reward.py)."""
    if not isinstance(model, BackboneRewardModel):
        return save_hf_folder(model, tokenizer, path)
    folder = save_backbone_reward_model(model, path)
    with save_errors(folder):
        tokenizer.save_pretrained(folder)
    return folder


def is_reward_model_folder(path: str | os.PathLike) -> bool:
    """Whether `path` holds a reward model: a sequence-classification folder, a reward model over images or
    one on a causal LM's decoder."""
    import json

    if is_vision_reward_folder(path) or head_format(path) == TEXT_FORMAT:
        return True
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return False
    try:  # an unreadable config.json is reported by the loader that reads it next
        archs = json.loads(cfg.read_text()).get("architectures") or []
        return any(a.endswith("ForSequenceClassification") for a in archs)
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def reward_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  **images: torch.Tensor) -> torch.Tensor:
    """input_ids, attention_mask [B, L] right-padded -> scores [B] float32 (raw, not normalised);
    `images`: a reward model over images' image tensors (models.vision.vision_kwargs)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **images)
    return out.logits.squeeze(-1).float()


def batch_scores(model: torch.nn.Module, batch) -> torch.Tensor:
    """Scores [B] float32 of the rows of a padded `data.batch.TokenBatch` (prompt + response each), with
    their images when the batch carries them, or of a one-row `data.packing.PackedBatch` (`packed_scores`);
    computed on the model's device."""
    if getattr(batch, "position_ids", None) is not None:
        batch = packable_layout(model, batch)
    if getattr(batch, "position_ids", None) is not None:
        return packed_scores(model, batch)
    device = model_device(model)
    return reward_scores(model, batch.input_ids.to(device), batch.attention_mask.to(device),
                         **vision_kwargs(model, batch, device))


def packable_layout(model: torch.nn.Module, batch):
    """The packed `batch`, or its samples as padded rows where the reward model's backbone cannot keep
    them apart in one row (models.logprobs.runnable_layout: recurrent layers, masks built without the
    positions, ...) or it is a reward model over images."""
    from rlhfkit.models.logprobs import runnable_layout, transformers_model

    base = transformers_model(model)
    if isinstance(base, VisionRewardModel):
        return batch.padded()
    return runnable_layout(score_head(base, wrapped=True)[0], batch)


def packed_scores(model: torch.nn.Module, batch) -> torch.Tensor:
    """Scores [B] float32 of the B samples of a one-row `data.packing.PackedBatch` (input_ids,
    position_ids [1, L], the positions restarting at 0 for each sample, no attention mask): the backbone
    runs once over the row and the `score` head reads each sample's hidden state where the padded forward
    reads it: its last token for a reward model on a backbone (models/backbone_reward.py); for a
    `*ForSequenceClassification`, transformers' choice, the sample's last token that is not the pad token
    (its first token when all are), so the scores equal the padded batch's."""
    from rlhfkit.models.logprobs import model_inputs, transformers_model

    base = transformers_model(model)
    backbone, head = score_head(base, wrapped=True)
    hidden = backbone(**model_inputs(backbone, batch)).last_hidden_state[0]  # [L, H]
    ids = batch.input_ids[0]
    lengths = batch.prompt_lengths + batch.response_mask.sum(dim=1)
    sample = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # [L] the sample of each position
    readable = torch.ones_like(ids, dtype=torch.bool)
    pad = base.config.get_text_config().pad_token_id
    if not isinstance(base, BackboneRewardModel) and pad is not None:
        readable = ids != pad
    candidates = torch.where(readable, torch.arange(ids.numel()), batch.starts[sample])
    last = torch.zeros_like(lengths).scatter_reduce(0, sample, candidates, "amax", include_self=False)
    return head(hidden[last.to(hidden.device)]).squeeze(-1).float()


def normalization(model: torch.nn.Module) -> tuple[float, float]:
    """(mean, std) stored in the reward model's config; (0, 1) when absent."""
    return float(getattr(model.config, "mean", 0.0)), float(getattr(model.config, "std", 1.0))


def score_head(model: torch.nn.Module, wrapped: bool = False) -> tuple[torch.nn.Module, torch.nn.Linear]:
    """(backbone, score head) of a reward model (a sequence-classification one or models/backbone_reward.py's);
    with `wrapped` the head may be a wrapper that calls one (peft's trainable copy of it under LoRA)."""
    backbone = getattr(model, model.base_model_prefix, None)
    head = getattr(model, "score", None)
    if backbone is None or not isinstance(head, torch.nn.Module if wrapped else torch.nn.Linear):
        raise ModelError(f"{type(model).__name__} has no backbone + `score` Linear head to reuse")
    return backbone, head


# ---------------------------------------------------------------------------------- process reward models
# A process reward model (`rlhfkit train prm`) is a causal LM whose config.json records, under this key,
# {"placeholder_token": ..., "reward_tokens": [good, bad]}: P(good step) is the softmax over the two
# reward tokens' logits at a placeholder that ends the step.
PRM_KEY = "process_reward"


def prm_settings(path: str | os.PathLike) -> dict | None:
    """The PRM record of the model folder `path` ({"placeholder_token", "reward_tokens"}), or None
    when it is not a process reward model."""
    import json

    cfg = resolve_model_file(path, "config.json")
    try:
        value = json.loads(cfg.read_text()).get(PRM_KEY) if cfg.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


def mark_prm(model: torch.nn.Module, placeholder_token: str, reward_tokens: tuple[str, str]) -> None:
    """Record in `model`'s config (saved in config.json) that it is a PRM and with which tokens."""
    setattr(model.config, PRM_KEY, {"placeholder_token": placeholder_token, "reward_tokens": list(reward_tokens)})


def step_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                step_mask: torch.Tensor, reward_ids: list[int], position_ids: torch.Tensor | None = None
                ) -> torch.Tensor:
    """The logits of the reward tokens at the step ends: input_ids, attention_mask, step_mask [B, L]
    (right-padded; or one packed row [1, L] with `position_ids` restarting at 0 for each sample and no
    attention mask) -> [N, len(reward_ids)] float32, N = step_mask.sum(), in row-major order. Llama-like
    models run the LM head on the N positions only; others take the full forward's logits."""
    from rlhfkit.models.logprobs import split_backbone

    device = input_ids.device
    parts = split_backbone(model)
    ids = torch.tensor(reward_ids, device=device)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if parts is None:
        logits = model(**inputs).logits
        return logits[step_mask.to(logits.device)][:, ids].float()
    backbone, head = parts
    hidden = backbone(**inputs).last_hidden_state
    return head(hidden[step_mask.to(hidden.device)])[:, ids].float()
