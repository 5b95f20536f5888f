"""LoRA adapters through peft (Hu et al. 2021, arXiv:2106.09685), and merging them back.

`add_lora` freezes the base weights and injects trainable rank-`rank` adapters into the named
modules; saving writes peft's `adapter_config.json` + `adapter_model.safetensors` (the base
folder is recorded in it). `merge_lora` folds an adapter into its base and writes a plain HF
folder that `AutoModelForCausalLM.from_pretrained` loads without peft.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from rlhfkit.errors import ModelError
from rlhfkit.models.loading import load_errors, resolve_model_path, save_errors, save_hf_folder

ADAPTER_CONFIG = "adapter_config.json"


def _lora_config(rank: int, alpha: int, target_modules: tuple[str, ...] | str, dropout: float, task_type: str):
    from peft import LoraConfig, TaskType

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                      task_type=getattr(TaskType, task_type), bias="none")


def add_lora(model: torch.nn.Module, rank: int, alpha: int, target_modules: tuple[str, ...] | str,
             dropout: float = 0.0, task_type: str = "CAUSAL_LM", adapter_name: str = "default") -> torch.nn.Module:
    """Wrap `model` in a peft model with LoRA adapters; only the adapters require grad.

    target_modules: module names (e.g. ("q_proj", "v_proj")) or "all-linear".
    task_type: CAUSAL_LM, or SEQ_CLS for a reward model (its `score` head then trains too).
    adapter_name: the name of this adapter inside the peft model (more: `add_adapter`).
    """
    from peft import get_peft_model

    config = _lora_config(rank, alpha, target_modules, dropout, task_type)
    try:
        return get_peft_model(model, config, adapter_name=adapter_name)
    except ValueError as exc:
        raise ModelError(f"--ds.lora.target_modules {target_modules}: {exc}") from exc


def add_adapter(peft_model: torch.nn.Module, adapter_name: str, rank: int, alpha: int,
                target_modules: tuple[str, ...] | str, dropout: float = 0.0) -> None:
    """One more LoRA adapter on the base that `peft_model` (from `add_lora`) wraps: adapters share
    the base weights; `peft_model.set_adapter(name)` picks the one forwards use and train."""
    try:
        peft_model.add_adapter(adapter_name, _lora_config(rank, alpha, target_modules, dropout, "CAUSAL_LM"))
    except ValueError as exc:
        raise ModelError(f"LoRA target modules {target_modules}: {exc}") from exc


def save_adapter(peft_model: torch.nn.Module, adapter_name: str, folder: str | os.PathLike) -> Path:
    """Write one adapter of `peft_model` as a plain peft adapter folder (`adapter_config.json` +
    `adapter_model.safetensors`, loadable by `PeftModel.from_pretrained`)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(folder)
    with save_errors(out):
        out.mkdir(parents=True, exist_ok=True)
        peft_model.peft_config[adapter_name].save_pretrained(out)
        state = get_peft_model_state_dict(peft_model, adapter_name=adapter_name)
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, out / "adapter_model.safetensors")
    return out


def load_adapter_weights(peft_model: torch.nn.Module, adapter_name: str, folder: str | os.PathLike) -> None:
    """Copy the weights of the adapter folder `folder` (from `save_adapter`) into adapter `adapter_name`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(folder) / "adapter_model.safetensors"
    with load_errors("a LoRA adapter", path):
        result = set_peft_model_state_dict(peft_model, load_file(path), adapter_name=adapter_name)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if missing:
        raise ModelError(f"{path}: adapter weights {missing[:3]} do not fit this adapter (another rank or base?)")


def is_adapter_folder(path: str | os.PathLike) -> bool:
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | os.PathLike) -> str:
    """The base model folder recorded in an adapter folder."""
    folder = Path(path).expanduser()
    with load_errors("a LoRA adapter", folder):
        cfg = json.loads((folder / ADAPTER_CONFIG).read_text())
        return cfg.get("base_model_name_or_path") or ""


def merge_lora(adapter_path: str | os.PathLike, base_path: str | os.PathLike | None, output_dir: str | os.PathLike,
               dtype: torch.dtype = torch.float32) -> Path:
    """Fold the adapter at `adapter_path` into its base (default: the one it records) and save a
    full HF folder (safetensors + the adapter folder's tokenizer) to `output_dir`; a vision-language
    base loads as one (models.vision) and its processor (the adapter folder's, else the base's) is
    saved beside the weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.models import vision

    adapter = Path(adapter_path).expanduser()
    if not is_adapter_folder(adapter):
        raise ModelError(f"{adapter}: no {ADAPTER_CONFIG}; pass the folder `rlhfkit train sft --ds.lora.rank N` saved")
    base = resolve_model_path(base_path or adapter_base(adapter))
    if not (base / "config.json").is_file():
        raise ModelError(f"base model {base} not found (recorded in {adapter / ADAPTER_CONFIG}); pass --lora.base")
    is_vlm = vision.is_vision_folder(base)
    if is_vlm:
        model = vision.load_vision_model(str(base), dtype=dtype)
    else:
        with load_errors("the base model", base):
            model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    with load_errors("a LoRA adapter", adapter):
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    tok_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    with load_errors("a tokenizer", tok_dir):
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    out = save_hf_folder(merged, tokenizer, output_dir)
    if is_vlm:
        has_own = any((adapter / f).is_file() for f in ("processor_config.json", "preprocessor_config.json"))
        vision.load_processor(str(adapter if has_own else base)).save_pretrained(str(out))
    return out
