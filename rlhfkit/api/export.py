"""`rlhfkit export CKPT OUT`: a checkpoint of any run as a Hugging Face model folder.

    export_checkpoint("runs/rl/checkpoints/best", "my-model")   # then AutoModelForCausalLM.from_pretrained

CKPT is a checkpoint folder (`step_N/` or `best/` under <output_dir>/checkpoints), the checkpoints
folder itself or a run folder (then its `latest`). What is in it decides how OUT is made:

  model/ with weights       (a single-process run)    copied: it already is an HF folder
  model.safetensors          (a LoRA run)              the base of model.adapter/'s config with the
                                                       adapters loaded, merged into its weights
  model.safetensors          (train rm on a backbone,   the reward model's weights over the run's model,
                              no model.adapter/)        written as `train rm` writes it
  shards/                    (an FSDP run, any ranks)   the run's model (its config.json, or --base)
                                                       filled from every rank's shards (in one process);
                                                       a vision-language model with its processor
  shards/ and model.adapter/ (an FSDP LoRA or QLoRA    the adapters read from the shards, over the base
                              run)                     of model.adapter/'s config, merged into its
                                                       float weights

OUT holds safetensors weights, config.json and the tokenizer; `from_pretrained` loads it without
peft or torch.distributed. A reward model (train rm) stays a sequence-classification model, or the folder of
a reward model on a backbone that `train rm` writes (models/backbone_reward.py); a vision-language model's
LoRA run gets its base's processor beside the weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from rlhfkit.errors import CheckpointError
from rlhfkit.models.loading import load_errors, load_tokenizer, resolve_model, save_hf_folder
from rlhfkit.models.reward import init_reward_model, save_reward_model
from rlhfkit.models.vision import is_vision_folder, load_processor, load_vision_model, plain_model_class
from rlhfkit.trainers.checkpoint import ADAPTER_SUFFIX, LATEST, MANIFEST, SHARDS, verify

__all__ = ["export_checkpoint", "resolve_checkpoint"]


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder `path` names: itself (it has a manifest), or the `latest` of the
    checkpoints folder it is or holds (a run folder)."""
    p = Path(path).expanduser()
    if (p / MANIFEST).is_file():
        return p
    for root in (p, p / "checkpoints"):
        if (root / LATEST).is_file():
            return root / (root / LATEST).read_text().strip()
    raise CheckpointError(f"{p}: not a checkpoint (no {MANIFEST}) nor a folder of them (no {LATEST}); give a "
                          "step_N or best folder under <--ckpt.output_dir>/checkpoints, or the run folder")


def export_checkpoint(ckpt: str | Path, out: str | Path, base: str | None = None, name: str = "model") -> Path:
    """Write module `name` (the policy: "model") of checkpoint `ckpt` as an HF folder `out`; `base`
    overrides the base model a LoRA checkpoint records, or the model an FSDP run started from (read from
the run's config.json). Returns `out`."""
    folder = resolve_checkpoint(ckpt)
    reason = verify(folder)
    if reason is not None:
        raise CheckpointError(f"checkpoint {folder} is not intact: {reason}; export another one")
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty; give a new folder")
    if (folder / SHARDS).is_dir() and (folder / f"{name}{ADAPTER_SUFFIX}" / "adapter_config.json").is_file():
        return _merged_lora(folder, name, out, base)
    if (folder / SHARDS).is_dir():
        return _from_shards(folder, name, out, base)
    if (folder / name / "config.json").is_file():
        shutil.copytree(folder / name, out, dirs_exist_ok=True)
        return out
    if (folder / f"{name}.safetensors").is_file():
        if not (folder / f"{name}{ADAPTER_SUFFIX}").is_dir() and _holds_score_head(folder / f"{name}.safetensors"):
            return _backbone_reward(folder, name, out, base)
        return _merged_lora(folder, name, out, base)
    raise CheckpointError(f"checkpoint {folder} holds no model {name!r} (neither {name}/, {name}.safetensors nor "
                          f"{SHARDS}/)")


def _from_shards(folder: Path, name: str, out: Path, base: str | None) -> Path:
    from transformers import AutoConfig

    from rlhfkit.distributed.fsdp_checkpoint import read_full_module

    path, gguf = resolve_model(base or run_model(folder))
    with load_errors("the model config", path):
        config = AutoConfig.from_pretrained(path)
        model = plain_model_class(config).from_config(config, dtype=getattr(config, "dtype", None) or torch.float32)
    read_full_module(folder, name, model)
    save_hf_folder(model, load_tokenizer(path), out)
    if gguf is None and is_vision_folder(path):  # a vision-language policy: its processor too
        load_processor(str(path)).save_pretrained(str(out))
    return out


def run_model(folder: Path) -> str:
    """The model a run started from (--actor.model_name_or_path, or --model.model_name_or_path of the
    supervised commands), read from the config.json of the run folder that holds checkpoint `folder`."""
    run = folder.parent.parent / "config.json"
    try:
        cfg = json.loads(run.read_text())
    except (OSError, ValueError):
        raise CheckpointError(f"checkpoint {folder} keeps only weights, and {run} (the run's config, which names "
                              "its model) is not readable; pass the run's model with --base") from None
    section = cfg.get("actor") or cfg.get("model") or {}
    if not section.get("model_name_or_path"):
        raise CheckpointError(f"{run} names no model; pass the run's model with --base")
    return section["model_name_or_path"]


def _merged_lora(folder: Path, name: str, out: Path, base: str | None) -> Path:
    """A LoRA run's checkpoint: its adapters over the base its card names, merged. A single process's
    holds the base's weights too; an FSDP run's shards (LoRA or QLoRA) are read for the adapters only,
    over the float base they were trained on (a QLoRA run's 4-bit base is not in its shards: its adapters
    are folded into the float weights, as `rlhfkit lora merge` does)."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    card = folder / f"{name}{ADAPTER_SUFFIX}"
    if not (card / "adapter_config.json").is_file():
        raise CheckpointError(f"checkpoint {folder}: {name}.safetensors is a state dict without {card.name}/ "
                              "(its LoRA config); written by an older release: resume it and save a new checkpoint")
    config = LoraConfig.from_pretrained(card)
    base_path, gguf = resolve_model(base or config.base_model_name_or_path)
    sharded = (folder / SHARDS).is_dir()
    state = {} if sharded else load_file(str(folder / f"{name}.safetensors"))
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    tokenizer = load_tokenizer(card if (card / "tokenizer_config.json").is_file() else base_path)
    reward = str(config.task_type).endswith("SEQ_CLS")
    with load_errors("the base model", base_path):
        model = _base_model(base_path, gguf, tokenizer.pad_token_id if reward else None, dtype)
    peft_model = get_peft_model(model, config)
    if sharded:
        from rlhfkit.distributed.fsdp_checkpoint import read_full_module

        read_full_module(folder, name, peft_model, only=lambda key: "lora_" in key)
    else:
        missing, unexpected = peft_model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lora_" in k or "base_layer" in k]:
            raise CheckpointError(f"checkpoint {folder}: {name}.safetensors does not fit the base {base_path} "
                                  f"(unexpected {unexpected[:3]}); pass the run's base model with --base")
    merged = peft_model.merge_and_unload()
    (save_reward_model if reward else save_hf_folder)(merged, tokenizer, out)
    if gguf is None and is_vision_folder(base_path):  # a vision-language policy: its base's processor too
        load_processor(str(base_path)).save_pretrained(str(out))
    return out


def _holds_score_head(weights: Path) -> bool:
    """Whether the state dict file `weights` is a reward model's on a backbone (a `score` head beside `model.*`)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        return "score.weight" in f.keys()


def _backbone_reward(folder: Path, name: str, out: Path, base: str | None) -> Path:
    """A full-weight checkpoint of a reward model on a backbone (models/backbone_reward.py: no HF folder of its
    own, so a state dict): loaded into the reward model `train rm` builds on the run's model, written as
    `train rm` writes it."""
    from safetensors.torch import load_file

    path, _ = resolve_model(base or run_model(folder))
    state = load_file(str(folder / f"{name}.safetensors"))
    tokenizer = load_tokenizer(path)
    with load_errors("the base model", path):
        model = init_reward_model(path, tokenizer.pad_token_id, state["score.weight"].dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {folder}: {name}.safetensors does not fit a reward model on {path} "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]}); pass the run's model with --base")
    save_reward_model(model, tokenizer, out)
    if is_vision_folder(path):  # a reward model over images: its base's processor too
        load_processor(str(path)).save_pretrained(str(out))
    return out


def _base_model(path: Path, gguf: str | None, reward_pad_id: int | None, dtype: torch.dtype) -> torch.nn.Module:
    """The model a LoRA run trained on `path`: with `reward_pad_id` (its tokenizer's pad token) the reward model
    `train rm` builds (models.reward.init_reward_model: a sequence classifier, or a score head on a backbone)."""
    from rlhfkit.models.loading import load_causal_lm

    if reward_pad_id is not None:
        return init_reward_model(path, reward_pad_id, dtype)
    if gguf is None and is_vision_folder(path):
        return load_vision_model(str(path), dtype=dtype)
    return load_causal_lm(path, dtype=dtype, gguf_file=gguf)
