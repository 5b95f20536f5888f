"""LoRA adapters through peft (Hu et al. 2021, arXiv:2106.09685), and merging them back.

`add_lora` freezes the base weights and injects trainable rank-`rank` adapters into the named
modules; saving writes peft's `adapter_config.json` + `adapter_model.safetensors` (the base
folder is recorded in it). `merge_lora` folds an adapter into its base and writes a plain HF
folder that `AutoModelForCausalLM.from_pretrained` loads without peft. For a rollout engine without
peft (vLLM), `MergedLoraSource` computes the merged weights at every sync without touching the peft
model; over a 4-bit base (QLoRA, Dettmers et al. 2023, arXiv:2305.14314) it merges into the
dequantized weights (`DequantizedState`), the weight the trainer's 4-bit layers multiply by.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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


def save_adapter(peft_model: torch.nn.Module, adapter_name: str, folder: str | os.PathLike,
                 save_embedding_layers: bool | str = "auto") -> Path:
    """Write one adapter of `peft_model` as a plain peft adapter folder (`adapter_config.json` +
    `adapter_model.safetensors`, loadable by `PeftModel.from_pretrained`). `save_embedding_layers`:
    peft's; False keeps an adapter on the output layer to its LoRA weights (the frozen base layer is
    the base model's)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(folder)
    with save_errors(out):
        out.mkdir(parents=True, exist_ok=True)
        peft_model.peft_config[adapter_name].save_pretrained(out)
        state = get_peft_model_state_dict(peft_model, adapter_name=adapter_name,
                                          save_embedding_layers=save_embedding_layers)
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
    return _adapter_config(path).get("base_model_name_or_path") or ""


def adapter_task(path: str | os.PathLike) -> str:
    """The peft task type recorded in an adapter folder (CAUSAL_LM, SEQ_CLS for a reward model's, ...)."""
    return str(_adapter_config(path).get("task_type") or "")


def _adapter_config(path: str | os.PathLike) -> dict:
    folder = Path(path).expanduser()
    with load_errors("a LoRA adapter", folder):
        return json.loads((folder / ADAPTER_CONFIG).read_text())


def merge_lora(adapter_path: str | os.PathLike, base_path: str | os.PathLike | None, output_dir: str | os.PathLike,
               dtype: torch.dtype = torch.float32) -> Path:
    """Fold the adapter at `adapter_path` into its base (default: the one it records) and save a
    full HF folder (safetensors + the adapter folder's tokenizer) to `output_dir`; a vision-language
    base loads as one (models.vision) and its processor (the adapter folder's, else the base's) is
    saved beside the weights. A reward model's adapter (task SEQ_CLS, `train rm`) goes on the reward model
    `train rm` builds on the base and is saved as `load_reward_model` reads it (models.reward)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.models import reward, vision

    adapter = Path(adapter_path).expanduser()
    if not is_adapter_folder(adapter):
        raise ModelError(f"{adapter}: no {ADAPTER_CONFIG}; pass the folder `rlhfkit train sft --ds.lora.rank N` saved")
    base = resolve_model_path(base_path or adapter_base(adapter))
    if not (base / "config.json").is_file():
        raise ModelError(f"base model {base} not found (recorded in {adapter / ADAPTER_CONFIG}); pass --lora.base")
    tok_dir = adapter if (adapter / "tokenizer_config.json").is_file() else base
    with load_errors("a tokenizer", tok_dir):
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    is_vlm = vision.is_vision_folder(base)
    is_rm = adapter_task(adapter) == "SEQ_CLS"
    if is_rm:
        model = reward.init_reward_model(base, tokenizer.pad_token_id, dtype)
    elif is_vlm:
        model = vision.load_vision_model(str(base), dtype=dtype)
    else:
        with load_errors("the base model", base):
            model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    with load_errors("a LoRA adapter", adapter):
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = (reward.save_reward_model if is_rm else save_hf_folder)(merged, tokenizer, output_dir)
    if is_vlm:
        has_own = any((adapter / f).is_file() for f in ("processor_config.json", "preprocessor_config.json"))
        vision.load_processor(str(adapter if has_own else base)).save_pretrained(str(out))
    return out


# ------------------------------------------------------------------ merged weights for a rollout engine
PEFT_PREFIX = "base_model.model."  # what peft puts before the base model's parameter names


def lora_layers(peft_model: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """Every LoRA-adapted linear of `peft_model`'s active adapter: its module name (as in the peft
    state dict) -> (scaling = alpha / rank, fan_in_fan_out). ModelError for an adapted layer a
    plain `W + scaling * B @ A` does not fold (DoRA, embeddings, 8-bit bases)."""
    name = peft_model.active_adapter
    out = {}
    for prefix, module in peft_model.named_modules():
        if name not in getattr(module, "lora_A", {}):
            continue
        # peft wraps a plain nn.Linear or a 4-bit one (whose weight is dequantized first: DequantizedState)
        # in classes of their own, as it does embeddings and 8-bit layers; a variant (DoRA, ...) merges otherwise
        if not _foldable(module) or name in getattr(module, "lora_variant", {}):
            raise ModelError(f"{prefix}: only LoRA on plain or 4-bit linear layers folds into merged weights for "
                             "--rollout.engine vllm (not DoRA, embeddings or 8-bit bases)")
        out[prefix] = (float(module.scaling[name]), bool(module.fan_in_fan_out))
    return out


def _foldable(module: torch.nn.Module) -> bool:
    """A peft LoRA layer over a plain linear, or over bitsandbytes' 4-bit linear (when installed)."""
    from peft.tuners.lora import Linear

    if isinstance(module, Linear):
        return True
    try:
        from peft.tuners.lora.bnb import Linear4bit
    except ImportError:  # no bitsandbytes: no 4-bit layers either
        return False
    return isinstance(module, Linear4bit)


def hf_name(peft_key: str) -> str:
    """The base model's parameter name of a peft state-dict key (an adapted layer's base weight
    `...q_proj.base_layer.weight` -> `...q_proj.weight`)."""
    return peft_key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                  fan_in_fan_out: bool) -> torch.Tensor:
    """W + scaling * B @ A (transposed for a fan-in-fan-out layer), in float32, in W's dtype: a new
    tensor (W is not touched)."""
    delta = (b.float() @ a.float()) * scaling
    return (weight.float() + (delta.T if fan_in_fan_out else delta)).to(weight.dtype)


def merged_items(items, layers: dict[str, tuple[float, bool]], adapter: str, adapted_only: bool = False):
    """(HF name, tensor) of a peft state dict `items` with every adapted linear merged: yielded as
    soon as its base weight, A and B have all come by (a streamed state gathers them in turn). The
    other weights pass under their base names; with `adapted_only`, only those of the modules that
    hold an adapted linear (an attention block's q/k/v/o: vLLM fuses q, k, v into one layer, and its
    in-place reload processes a fused layer it got only a part of from uninitialised memory).
    Other adapters' weights never pass."""
    roles = {}
    for prefix in layers:
        roles[f"{prefix}.base_layer.weight"] = (prefix, "w")
        roles[f"{prefix}.lora_A.{adapter}.weight"] = (prefix, "a")
        roles[f"{prefix}.lora_B.{adapter}.weight"] = (prefix, "b")
    holders = {prefix.rpartition(".")[0] for prefix in layers}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in items:
        if key not in roles:
            sibling = key.replace(".base_layer.", ".").rsplit(".", 2)[0] in holders
            if ".lora_" not in key and (sibling or not adapted_only):
                yield hf_name(key), tensor
            continue
        prefix, role = roles[key]
        parts = pending.setdefault(prefix, {})
        parts[role] = tensor.detach()
        if len(parts) == 3:
            del pending[prefix]
            yield hf_name(f"{prefix}.weight"), merged_weight(parts["w"], parts["a"], parts["b"], *layers[prefix])
    if pending:
        raise ModelError(f"the policy's state has no base weight, A or B for LoRA layers {sorted(pending)[:3]}")


class MergedLoraState:
    """The weights a rollout engine without peft samples the adapted policy with, computed from
    `source` (the peft model's state dict, or a streamed state with `parts(bucket_bytes)`) without
    changing the peft model: for every LoRA-adapted linear W + scaling * B @ A under the base
    model's name; the other weights as they are, or (`adapted_only`) only the adapted layers'
    neighbours (`merged_items`). `parts(bucket_bytes)`
    yields dicts of about `bucket_bytes` each; `sent_bytes` counts what they held, and `on_done`
    (when given) is called with it once the last part is out."""

    def __init__(self, peft_model: torch.nn.Module, source, adapted_only: bool = False, on_done=None):
        self.layers, self.adapter = lora_layers(peft_model), peft_model.active_adapter
        self.source, self.adapted_only, self.on_done, self.sent_bytes = source, adapted_only, on_done, 0

    def __bool__(self) -> bool:
        return True

    def parts(self, bucket_bytes: int):
        src = self.source.parts(bucket_bytes) if hasattr(self.source, "parts") else [self.source]
        items = (kv for part in src for kv in part.items())
        part: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in merged_items(items, self.layers, self.adapter, self.adapted_only):
            nbytes = tensor.numel() * tensor.element_size()
            if part and size + nbytes > bucket_bytes:
                yield part
                part, size = {}, 0
            part[name] = tensor
            size += nbytes
            self.sent_bytes += nbytes
        if part:
            yield part
        if self.on_done is not None:
            self.on_done(self.sent_bytes)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Every part in one dict (what a Ray rollout worker is sent)."""
        return {name: t for part in self.parts(2**62) for name, t in part.items()}


def is_4bit(model: torch.nn.Module) -> bool:
    """Whether `model` (or the base model a peft model wraps) holds bitsandbytes' 4-bit layers (QLoRA)."""
    return bool(getattr(model, "is_loaded_in_4bit", False))


def dequantized_items(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None):
    """(name, tensor) of `model`'s state dict as an engine without bitsandbytes takes it: every 4-bit
    linear's weight dequantized (bitsandbytes' `dequantize_4bit`: the weight the layer multiplies by, in
    its compute dtype), the tensors of its quantization state left out, the rest as they are. `state`:
    the model's state dict gathered elsewhere (FSDP: the full state of a sharded model), its 4-bit
    weights dequantized from the model's own, which every rank holds whole."""
    import bitsandbytes as bnb

    quantized = {f"{prefix}.weight": m.weight for prefix, m in model.named_modules()
                 if isinstance(m, bnb.nn.Linear4bit)}
    for key, tensor in (model.state_dict() if state is None else state).items():
        if key in quantized:
            weight = quantized[key]
            yield key, bnb.functional.dequantize_4bit(weight.data, weight.quant_state)
        elif key.rpartition(".weight.")[0] + ".weight" not in quantized:  # not a 4-bit weight's state
            yield key, tensor


class DequantizedState:
    """A 4-bit (QLoRA) model's state for a rollout engine without bitsandbytes (`dequantized_items`),
    one tensor per part, dequantized as it is asked for: a full-precision copy of the whole model never
    exists at once. `MergedLoraState` folds the adapters into the dequantized weights."""

    def __init__(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None):
        self.model, self.state = model, state

    def __bool__(self) -> bool:
        return True

    def parts(self, bucket_bytes: int):
        for key, tensor in dequantized_items(self.model, self.state):
            yield {key: tensor}


def weight_source(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None):
    """The `state_fn` giving `model`'s weights for `MergedLoraSource`: `state` (its full state dict gathered
    elsewhere: FSDP) or its own state dict; over a 4-bit base, as its `DequantizedState`."""
    if is_4bit(model):
        return lambda: DequantizedState(model, state)
    return model.state_dict if state is None else (lambda: state)


def check_tied_head(peft_model: torch.nn.Module) -> None:
    """ModelError for LoRA on the output head of a model whose head is its input embeddings (tied):
    vLLM reads the head from the embeddings, so the merged head would never be sampled with."""
    config = getattr(peft_model, "config", None)
    head = peft_model.get_output_embeddings() if hasattr(peft_model, "get_output_embeddings") else None
    if not getattr(config, "tie_word_embeddings", False) or head is None:
        return
    if any(getattr(m, "base_layer", None) is head or (m is head and hasattr(m, "lora_A"))
           for m in peft_model.modules()):
        raise ModelError("LoRA on the output head of a model with tied embeddings does not reach vLLM (it reads "
                         "the head from the input embeddings): drop lm_head from --ds.lora.target_modules")


class MergedLoraSource:
    """A rollout engine's weight source for a LoRA policy (`state_fn` of `VLLMEngine`): each call
    returns the `MergedLoraState` of `state_fn()` (default: the peft model's state dict, or for a 4-bit
    base its `DequantizedState`); the first in full (the engine may hold other base weights than the
    policy's), every later one only the modules with adapted layers, since the base weights are frozen.
    `sent_bytes`: the bytes of each sync, in order, once it is loaded."""

    def __init__(self, peft_model: torch.nn.Module, state_fn=None):
        self.model, self.state_fn = peft_model, state_fn or weight_source(peft_model)
        self.calls, self.sent_bytes = 0, []
        check_tied_head(peft_model)

    def __call__(self) -> MergedLoraState:
        state = self.state(full=self.calls == 0)
        self.calls += 1
        return state

    def state(self, full: bool) -> MergedLoraState:
        """The merged state of `state_fn()`: every weight with `full`, else the adapted modules only."""
        return MergedLoraState(self.model, self.state_fn(), adapted_only=not full, on_done=self.sent_bytes.append)


def engine_state_fn(policy: torch.nn.Module, state_fn=None):
    """What a rollout engine without peft or bitsandbytes (vLLM) loads at every weight sync: `state_fn()`
    (default: the policy's state dict); for a LoRA policy the adapters merged into their layers
    (`MergedLoraSource`), over the dequantized 4-bit base for QLoRA (the effective weight the trainer
    computes with, `W_deq + scaling * B @ A`)."""
    if not hasattr(policy, "peft_config"):
        return state_fn or policy.state_dict
    return MergedLoraSource(policy, state_fn)
