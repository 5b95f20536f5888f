"""Atomic, pickle-free checkpoints of a training run, and exact resume.

Layout of `root` (a run's `checkpoints/` folder):

    step_00000012/
        model/               HF folder of each module with `save_pretrained` (safetensors + tokenizer)
        critic.safetensors   the state dict of any other module (and of a LoRA model: base and adapters;
        model.adapter/       then also peft's adapter config and the tokenizer, for `rlhfkit export`)
        state.json           everything else: a nested tree of plain values (optimizer and scheduler
        state.safetensors    state, EMA, KL controller, RNG states, data position, counters); tensors
                             sit in the safetensors file and are named in the tree
        manifest.json        written last: the step and the size and sha256 of every file
    latest                   the name of the newest complete checkpoint, replaced last
    best/                    with --ckpt.keep_best METRIC[:max|min]: the checkpoint of the step whose
                             evaluation had the best METRIC so far (its manifest names the metric,
                             the value and the step); never pruned, never the one resumed from

A checkpoint is built in a temporary folder, every file and the folder are fsync'ed, the folder is
renamed into place, and only then is `latest` replaced (write, fsync, rename). A process killed at
any moment leaves either the old or the new checkpoint complete, never a half-written one that
looks complete: a checkpoint without a manifest, or whose files do not match it, is skipped (with a
logged message) when resuming. Nothing here unpickles: tensors are read with safetensors, the rest
with json.

A trainer plugs in by providing `step`, `state_dict()`, `load_state_dict(state)` and
`checkpoint_modules()` -> {name: (module, tokenizer or None)}; see `Checkpointer`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rlhfkit.errors import CheckpointError, os_error_fix

log = logging.getLogger("rlhfkit")
MANIFEST, LATEST, STATE_JSON, STATE_TENSORS = "manifest.json", "latest", "state.json", "state.safetensors"
BEST = "best"  # the folder of the best checkpoint (--ckpt.keep_best)
ADAPTER_SUFFIX = ".adapter"  # <name>.adapter/: a LoRA model's adapter config and tokenizer (see write_model_card)
SHARDS = "shards"  # the folder of an FSDP checkpoint's weight and optimizer shards (distributed.fsdp_checkpoint)
FORMAT = 1


# ------------------------------------------------------------------ state tree <-> json + tensors
def pack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able tree of `obj`; its tensors are moved into `tensors` and referenced by name.

    Handles dicts (any hashable keys), lists, tuples, numpy arrays, tensors and JSON scalars.
    """
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": name}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [pack(v, tensors) for v in obj]
    if isinstance(obj, dict):
        return {"__dict__": [[pack(k, tensors), pack(v, tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}; give plain values and tensors")


def unpack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `pack`."""
    if isinstance(obj, list):
        return [unpack(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return np.array(obj["__ndarray__"], dtype=obj["dtype"])
        if "__tuple__" in obj:
            return tuple(unpack(v, tensors) for v in obj["__tuple__"])
        return {_hashable(unpack(k, tensors)): unpack(v, tensors) for k, v in obj["__dict__"]}
    return obj


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def rng_state() -> dict[str, Any]:
    """The global RNG states of python, numpy and torch."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


# ------------------------------------------------------------------ writing
def _fsync(path: Path) -> None:
    """Flush a file or a folder to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _write_contents(tmp: Path, step: int, state: dict, modules: dict[str, tuple], extra: dict) -> None:
    for name, (module, tokenizer) in modules.items():
        if hasattr(module, "save_pretrained") and tokenizer is not None and not hasattr(module, "peft_config"):
            module.save_pretrained(tmp / name, safe_serialization=True)
            tokenizer.save_pretrained(tmp / name)
        else:
            sd = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
            save_file(sd, str(tmp / f"{name}.safetensors"))
            write_model_card(tmp / f"{name}{ADAPTER_SUFFIX}", module, tokenizer)
    write_state(tmp, state)
    seal(tmp, step, **extra)


def write_model_card(folder: Path, module: torch.nn.Module, tokenizer) -> None:
    """What `rlhfkit export` needs beside a state dict of a LoRA model: peft's adapter config (its
    base model, rank, alpha, targets) and the tokenizer, in `folder`. Nothing for other modules."""
    if not hasattr(module, "peft_config"):
        return
    for adapter, config in module.peft_config.items():
        config.save_pretrained(folder if adapter == "default" else folder / adapter)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def write_state(folder: Path, state: dict) -> None:
    """The state tree as state.json (plain values) + state.safetensors (its tensors) in `folder`."""
    tensors: dict[str, torch.Tensor] = {}
    tree = pack(state, tensors)
    (folder / STATE_JSON).write_text(json.dumps(tree))
    save_file(tensors, str(folder / STATE_TENSORS))


def read_state(folder: Path) -> dict:
    """Inverse of `write_state`."""
    return unpack(json.loads((folder / STATE_JSON).read_text()), load_file(str(folder / STATE_TENSORS)))


def seal(tmp: Path, step: int, **extra: Any) -> None:
    """Flush every file under `tmp`, write the manifest (the step, `extra`, each file's size and sha256),
    and flush it and the folders: `tmp` is then complete, ready for `publish`."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for p in files:
        _fsync(p)
    manifest = {"format": FORMAT, "step": step, **extra,
                "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(tmp / MANIFEST)
    for d in sorted({p.parent for p in files} | {tmp}):
        _fsync(d)


def publish(root: Path, tmp: Path, name: str, point: bool = True) -> Path:
    """Rename the sealed `tmp` to `root/name` (replacing an older attempt at that step, or the older
    best), then, with `point`, point `latest` at it (write, fsync, rename)."""
    target = root / name
    if target.exists():  # an older attempt at this step (e.g. before a resume): replace it
        trash = root / f".trash.{name}.{os.getpid()}"
        os.replace(target, trash)
        shutil.rmtree(trash)
    os.replace(tmp, target)
    _fsync(root)
    if not point:
        return target
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(name + "\n")
    _fsync(pointer)
    os.replace(pointer, root / LATEST)
    _fsync(root)
    return target


def save_checkpoint(root: str | Path, step: int, state: dict, modules: dict[str, tuple], max_num: int,
                    best: dict | None = None) -> Path:
    """Write checkpoint `step` atomically under `root`, point `latest` at it, keep the newest `max_num`;
    with `best` ({"metric", "value", "mode"}, kept in the manifest), write it as `root/best` instead,
    leaving `latest` and the others alone.

    Raises CheckpointError (naming the cause, e.g. a full disk) after removing the partial folder;
    the checkpoints written before stay intact.
    """
    root = Path(root)
    name = BEST if best is not None else step_dir_name(step)
    tmp = root / f".tmp.{step_dir_name(step)}.{os.getpid()}{'.best' if best is not None else ''}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_contents(tmp, step, state, modules, best or {})
        target = publish(root, tmp, name, point=best is None)
    except (OSError, SafetensorError) as exc:  # safetensors reports its I/O errors as SafetensorError
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(root, name, exc) from exc
    if best is None:
        prune(root, max_num)
    return target


def write_error(root: Path, name: str, exc: Exception) -> CheckpointError:
    """The CheckpointError of a failed write of checkpoint `name`: the cause, the fix, the last good one."""
    last = _read_latest(root)
    fix = os_error_fix(exc, "check the disk")
    if fix.startswith("free disk space"):
        fix += " or lower --ckpt.max_num"
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
    return CheckpointError(
        f"cannot write checkpoint {root / name}: {reason} ({type(exc).__name__}); {fix}, then resume with "
        "--ckpt.load_enable true "
        f"(last good checkpoint: {root / last if last else 'none'})"
    )


def prune(root: Path, max_num: int) -> None:
    """Keep the newest `max_num` complete checkpoints; remove older ones and stale temp folders."""
    for p in root.glob(".t*.step_*"):
        if p.is_dir() and not p.name.endswith(f".{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)
    for p in list_checkpoints(root)[max_num:]:
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------ reading
def _read_latest(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text().strip() or None
    except OSError:
        return None


def list_checkpoints(root: str | Path) -> list[Path]:
    """Checkpoint folders under `root`, newest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    dirs = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[5:]), reverse=True)


def verify(path: Path) -> str | None:
    """None when the checkpoint at `path` is complete and intact, else the reason it is not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest.json (the write was interrupted)"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest.json ({exc})"
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return f"unknown manifest format {manifest.get('format')!r}"
    for rel, meta in manifest["files"].items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != meta["size"] or _sha256(f) != meta["sha256"]:
            return f"{rel} does not match its checksum (corrupt)"
    return None


def latest_good(root: str | Path) -> tuple[Path, int] | None:
    """(folder, step) of the newest intact checkpoint under `root`; corrupt or incomplete ones are
    skipped with a logged message. None when there is none. Raises CheckpointError when checkpoints
    exist but none is intact."""
    candidates = list_checkpoints(root)
    for path in candidates:
        reason = verify(path)
        if reason is None:
            return path, int(json.loads((path / MANIFEST).read_text())["step"])
        log.warning("skipping checkpoint %s: %s", path, reason)
    if candidates:
        raise CheckpointError(
            f"no intact checkpoint in {root} (all {len(candidates)} are corrupt or incomplete, see the "
            "messages above); delete the folder to start over, or point --ckpt.output_dir elsewhere"
        )
    return None


def load_checkpoint(path: Path, modules: dict[str, tuple]) -> dict:
    """Load the modules' weights in place and return the state tree of checkpoint `path`."""
    if (path / SHARDS).is_dir():
        raise CheckpointError(f"checkpoint {path} holds FSDP shards ({SHARDS}/); resume it under torchrun with "
                              "--fsdp.enable true (any number of processes)")
    for name, (module, tokenizer) in modules.items():
        if (path / name).is_dir():
            sd: dict[str, torch.Tensor] = {}
            for f in sorted((path / name).glob("*.safetensors")):
                sd.update(load_file(str(f)))
        else:
            sd = load_file(str(path / f"{name}.safetensors"))
        _load_weights(module, sd, path / name)
    return read_state(path)


def _load_weights(module: torch.nn.Module, sd: dict[str, torch.Tensor], where: Path) -> None:
    """load_state_dict; keys left out by save_pretrained must be tied to a loaded tensor."""
    missing, unexpected = module.load_state_dict(sd, strict=False)
    own = module.state_dict()
    loaded_ptrs = {own[k].data_ptr() for k in sd if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
    if untied or unexpected:
        raise CheckpointError(
            f"checkpoint {where} does not fit the model (missing {untied[:3]}, unexpected {unexpected[:3]}); "
            "resume with the same --actor.model_name_or_path as the run that wrote it"
        )


# ------------------------------------------------------------------ the trainer side
class Checkpointer:
    """Saves a trainer every `save_steps` steps (as a trainer callback) and resumes it; with
    `keep_best` (METRIC[:max|min], see `parse_keep_best`) also keeps the checkpoint of the step whose
    evaluation had the best METRIC so far as `root/best` (`consider_best`, called by `periodic` and by
    the API after the final evaluation). The best value is read back from `best/`'s manifest on resume.

    The trainer provides `step`, `state_dict()`, `load_state_dict(state)`, `checkpoint_modules()`
    and `can_checkpoint()` (False while its last optimizer steps were skipped as non-finite).
    """

    def __init__(self, root: str | Path, save_steps: int, max_num: int, say: Callable[[str], None] = log.warning,
                 keep_best: str | None = None):
        self.root, self.save_steps, self.max_num, self.say = Path(root), save_steps, max_num, say
        self.keep_best = parse_keep_best(keep_best) if keep_best else None
        self.best: float | None = None  # the best value so far of the keep_best metric

    def periodic(self, trainer, step: int, metrics: dict) -> None:
        if self.save_steps > 0 and step % self.save_steps == 0:
            self.save(trainer)
        self.consider_best(trainer, metrics)

    def consider_best(self, trainer, metrics: dict) -> Path | None:
        """Save `trainer` as the best checkpoint when `metrics` (a step's, with its evaluation) holds
        the keep_best metric at a better value than any before; None otherwise."""
        if self.keep_best is None or not any(k.startswith("eval/") for k in metrics):
            return None
        metric, mode = self.keep_best
        value = best_metric_value(metrics, metric)
        if value != value:  # NaN: never the best
            return None
        better = self.best is None or (value > self.best if mode == "max" else value < self.best)
        if not better or not trainer.can_checkpoint():
            return None
        path = self.save(trainer, best={"metric": metric, "value": value, "mode": mode})
        if path is not None:
            self.best = value
        return path

    def save(self, trainer, best: dict | None = None) -> Path | None:
        if not trainer.can_checkpoint():
            self.say_not_checkpointing(trainer)
            return None
        state = {"trainer": trainer.state_dict(), "rng": rng_state()}
        return save_checkpoint(self.root, trainer.step, state, trainer.checkpoint_modules(), self.max_num, best)

    def say_not_checkpointing(self, trainer) -> None:
        self.say(f"step {trainer.step}: not checkpointing a state reached through skipped (non-finite) "
                 "optimizer steps; the last good checkpoint stays the latest")

    def restore_best(self) -> None:
        """The best value so far from `root/best`'s manifest (a resumed run keeps beating it, not 0)."""
        if self.keep_best is None or verify(self.root / BEST) is not None:
            return
        manifest = json.loads((self.root / BEST / MANIFEST).read_text())
        if manifest.get("metric") == self.keep_best[0] and manifest.get("mode") == self.keep_best[1]:
            self.best = float(manifest["value"])

    def load(self, trainer, path: Path) -> None:
        state = load_checkpoint(path, trainer.checkpoint_modules())
        trainer.load_state_dict(state["trainer"])
        set_rng_state(state["rng"])
        self.restore_best()


def parse_keep_best(spec: str) -> tuple[str, str]:
    """(metric, "max" or "min") of --ckpt.keep_best METRIC[:max|min] (max when not given)."""
    metric, _, mode = spec.rpartition(":") if spec.endswith((":max", ":min")) else (spec, "", "max")
    if not metric:
        raise CheckpointError(f"--ckpt.keep_best {spec!r}: give a metric name, e.g. eval/loss:min")
    return metric, mode


def best_metric_value(metrics: dict, metric: str) -> float:
    """eval/`metric` (or `metric`) of an evaluation's `metrics`; CheckpointError naming the metrics
    there are when it has neither."""
    for key in (f"eval/{metric}", metric):  # an evaluation's metric before a training one of that name
        if key in metrics:
            return float(metrics[key])
    names = ", ".join(sorted(k for k in metrics if k.startswith("eval/")))
    raise CheckpointError(f"--ckpt.keep_best: the evaluation has no metric {metric!r}; it has {names}")
