"""Sharded checkpoints of an FSDP2 run (`--fsdp.enable true --ckpt.save_steps N`) and exact resume,
through `torch.distributed.checkpoint` (DCP).

Layout of `<output_dir>/checkpoints/` (shared by the ranks; the conventions of trainers.checkpoint):

    step_00000012/
        shards/              DCP's safetensors storage: one file per rank holding that rank's shards of
                             the policy ("model.*"), the critic ("critic.*"), each optimizer's Adam
                             moments and step ("optim.<name>.*"; Muon's momentum: "optim.<name>.muon.*")
                             and the EMA ("ema.<name>.*"), with their
                             offsets in the file's metadata (json): no pickle, and any number of ranks
                             can read them back (DCP reshards)
        rank_00000/          each rank's trainer state, as the single-process checkpointer writes it
            state.json       (RNG states, data position, step counters, scheduler, KL controller, reward
            state.safetensors moments, the optimizers' param_groups); its sharded parts are in shards/
        manifest.json        written last by rank 0: step, world size, size and sha256 of every file
    latest

Every rank writes into one temporary folder; after a barrier rank 0 seals it (fsync, manifest) and
renames it into place, then replaces `latest` (trainers.checkpoint.seal / publish). Rank 0 removes
torn temporary folders when the run starts and prunes to --ckpt.max_num after each checkpoint.

Resuming under another number of ranks (resharding): DCP reads the shards into this run's sharding;
a rank the checkpoint has no trainer state for takes rank 0's (every rank runs the same loop on
the same data with the same seeds, so their trainer states are equal).

All ranks share the checkpoint folder: on one node it is local, across nodes it must be a shared
filesystem.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError

from rlhfkit.distributed.fsdp import max_over_ranks, whole_4bit_weights
from rlhfkit.errors import CheckpointError
from rlhfkit.trainers.checkpoint import (
    ADAPTER_SUFFIX,
    BEST,
    SHARDS,
    Checkpointer,
    prune,
    publish,
    read_state,
    rng_state,
    seal,
    set_rng_state,
    step_dir_name,
    write_error,
    write_model_card,
    write_state,
)

log = logging.getLogger("rlhfkit")


def rank_dir_name(rank: int) -> str:
    return f"rank_{rank:05d}"


class ShardedCheckpointer(Checkpointer):
    """trainers.checkpoint.Checkpointer (`periodic`, `save`, `load`) for FSDP ranks; every `save` and
    `load` is a collective. The trainer also provides `checkpoint_learners()` (trainers.rl.loop.RLLoop)."""

    def __init__(self, root: str | Path, save_steps: int, max_num: int, rank: int, world_size: int,
                 say: Callable[[str], None] = log.warning, keep_best: str | None = None):
        super().__init__(root, save_steps, max_num, say, keep_best)
        self.rank, self.world_size = rank, world_size
        if rank == 0 and self.root.is_dir():  # torn temporary folders of a killed run
            for p in self.root.glob(".t*.step_*"):
                shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------------ save
    def save(self, trainer, best: dict | None = None) -> Path | None:
        """A collective; with `best`, the checkpoint is `best/` (see Checkpointer.consider_best)."""
        if not trainer.can_checkpoint():  # the same on every rank (the gradient norm is global)
            if self.rank == 0:
                self.say_not_checkpointing(trainer)
            return None
        name = BEST if best is not None else step_dir_name(trainer.step)
        tmp = self.root / f".tmp.{step_dir_name(trainer.step)}.fsdp{'.best' if best is not None else ''}"
        err = _agree(_attempt(lambda: _fresh_folder(tmp)) if self.rank == 0 else None)
        if err is None:
            err = _agree(_attempt(lambda: self._write(trainer, tmp)))
        if err is None:
            failure = None
            if self.rank == 0:
                failure = _attempt(lambda: seal(tmp, trainer.step, world_size=self.world_size, **(best or {})))
                failure = failure or _attempt(lambda: publish(self.root, tmp, name, point=best is None))
            err = _agree(failure)
        if err is not None:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise write_error(self.root, name, err) from err
        if self.rank == 0 and best is None:
            prune(self.root, self.max_num)
        return self.root / name

    def _write(self, trainer, tmp: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        shards, groups = sharded_state(trainer)
        dcp.save(shards, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDS), save_distributed=True))
        state = trainer.state_dict()
        for key in trainer.checkpoint_learners():  # their moments (Adam's, Muon's) and EMA are in the shards
            muon = state[key].get("muon")
            state[key] = {**state[key], "optimizer": None, "ema": None,
                          "muon": None if muon is None else {**muon, "optimizer": None}}
        folder = tmp / rank_dir_name(self.rank)
        folder.mkdir()
        write_state(folder, {"trainer": state, "rng": rng_state(), "param_groups": groups})
        if self.rank == 0:  # a LoRA policy's adapter config and tokenizer, for `rlhfkit export`
            for name, (module, tokenizer) in trainer.checkpoint_modules().items():
                write_model_card(tmp / f"{name}{ADAPTER_SUFFIX}", module, tokenizer)

    # ------------------------------------------------------------------ load
    def load(self, trainer, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict as set_model,
        )
        from torch.distributed.checkpoint.state_dict import (
            set_optimizer_state_dict as set_optim,
        )

        if not (path / SHARDS).is_dir():
            raise CheckpointError(f"checkpoint {path} was written by a single process (no {SHARDS}/); resume it "
                                  "without --fsdp.enable, or start this FSDP run in a new --ckpt.output_dir")
        own = path / rank_dir_name(self.rank)
        state = read_state(own if own.is_dir() else path / rank_dir_name(0))
        modules = trainer.checkpoint_modules()
        for key, (_, learner) in trainer.checkpoint_learners().items():  # Adam / Muon as written, before DCP reads
            learner.check_optimizer(state["trainer"][key])
        shards, _ = sharded_state(trainer)
        try:
            dcp.load(shards, storage_reader=HuggingFaceStorageReader(str(path / SHARDS)))
        except (RuntimeError, ValueError, SafetensorError) as exc:  # DCP wraps the ranks' errors
            raise CheckpointError(f"checkpoint {path} does not fit this run ({' '.join(str(exc).split())[:300]}); "
                                  "resume with the model and --algo.advantage.estimator of the run that wrote "
                                  "it") from exc
        trainer.load_state_dict(state["trainer"])  # its weight sync sends the loaded weights: DCP loads in place
        for name, (module, _) in modules.items():
            model_state = shards[name]
            for tied, first in tied_names(get_model_state_dict(module)).items():
                model_state[tied] = model_state[first]  # stored once (see sharded_state)
            missing, unexpected = set_model(module, model_state, options=StateDictOptions(strict=False))
            missing = set(missing) - held_4bit_names(module)  # not in the checkpoint (see sharded_state)
            if missing or unexpected:
                raise CheckpointError(f"checkpoint {path}: {name} misses {sorted(missing)[:3]}, has unexpected "
                                      f"{sorted(unexpected)[:3]}; resume with the model of the run that wrote it")
        for module_name, learner in trainer.checkpoint_learners().values():
            module = modules[module_name][0]
            for key, optim in optimizers(module_name, learner):
                groups = state["param_groups"][key.removeprefix("optim.")]
                set_optim(module, optim, {"state": shards[key], "param_groups": groups})
            if learner.ema is not None:
                with torch.no_grad():
                    for e, (fqn, _) in zip(learner.ema, _trained(module), strict=True):
                        e.copy_(shards[f"ema.{module_name}"][fqn])
        set_rng_state(state["rng"])
        self.restore_best()


def sharded_state(trainer) -> tuple[dict, dict]:
    """(this rank's DTensor shards by DCP key, each optimizer's param_groups) of `trainer`: the modules'
    state dicts, each learner's optimizer state (initialised when empty, as DCP's helpers do) and EMA.
    A QLoRA base's 4-bit weights are left out (`without_4bit_base`)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    modules = trainer.checkpoint_modules()
    shards = {name: without_4bit_base(untied(get_model_state_dict(module)), module)
              for name, (module, _) in modules.items()}
    groups = {}
    for module_name, learner in trainer.checkpoint_learners().values():
        module = modules[module_name][0]
        for key, optim in optimizers(module_name, learner):
            state = get_optimizer_state_dict(module, optim)
            shards[key], groups[key.removeprefix("optim.")] = state["state"], state["param_groups"]
        if learner.ema is not None:
            shards[f"ema.{module_name}"] = {fqn: e for e, (fqn, _) in zip(learner.ema, _trained(module), strict=True)}
    return shards, groups


def held_4bit_names(module: torch.nn.Module) -> set[str]:
    """The state-dict names of `module`'s frozen 4-bit weights, which every rank holds whole
    (distributed.fsdp.whole_4bit_weights; none without QLoRA)."""
    whole = whole_4bit_weights(module)
    return {n for n, p in module.named_parameters() if p in whole} if whole else set()


def without_4bit_base(state: dict, module: torch.nn.Module) -> dict:
    """`state` (of `module`) without its QLoRA base's 4-bit weights and their quantization state (bitsandbytes
    names it `<weight>.absmax`, `<weight>.quant_map`, ...): they are frozen, every rank holds them whole, and a
    resumed run loads them again from its model, as the run did at its start. A sharded checkpoint then holds
    what training changed (the adapters, their Adam moments and EMA) and the float frozen weights."""
    names = held_4bit_names(module)
    if not names:
        return state
    return {k: v for k, v in state.items() if k not in names and k.split(".weight.")[0] + ".weight" not in names}


def optimizers(module_name: str, learner) -> list[tuple[str, torch.optim.Optimizer]]:
    """(DCP key, optimizer) of a learner's optimizers: its AdamW under "optim.<module>" and its Muon (the
    hidden matrices' momentum, --actor.optim muon) under "optim.<module>.muon"; one may be absent."""
    pairs = ((f"optim.{module_name}", learner.optimizer), (f"optim.{module_name}.muon", learner.muon))
    return [(key, optim) for key, optim in pairs if optim is not None]


def tied_names(state: dict) -> dict[str, str]:
    """{name: the first name of the same tensor} for the entries of a model state dict that share their
    storage with an earlier one (tied weights: SmolLM2's LM head is its embedding matrix)."""
    first: dict[tuple, str] = {}
    ties = {}
    for name, t in state.items():
        local = t.to_local() if hasattr(t, "to_local") else t
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(t.shape), t.dtype)
        if local.numel() and key in first:
            ties[name] = first[key]
        else:
            first.setdefault(key, name)
    return ties


def untied(state: dict) -> dict:
    """`state` with each tied tensor once: safetensors (DCP's storage) refuses tensors that share memory."""
    ties = tied_names(state)
    return {k: v for k, v in state.items() if k not in ties}


def _trained(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters by name, in the order of Learner.params."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def _fresh_folder(tmp: Path) -> None:
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()


def _attempt(fn: Callable) -> BaseException | None:
    """Run `fn`; the write error it raised (DCP raises the ranks' errors as CheckpointException), or None."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        fn()
    except (OSError, SafetensorError, CheckpointException) as exc:
        return exc
    return None


def _agree(failure: BaseException | None) -> BaseException | None:
    """A collective: every rank learns whether any rank failed. Returns this rank's error, an OSError
    standing for another rank's, or None when all succeeded."""
    failed = max_over_ranks(0 if failure is None else 1)
    if failure is not None:
        return failure
    return OSError("another rank could not write its part of the checkpoint") if failed else None


def read_full_module(path: Path, name: str, module: torch.nn.Module, only: Callable[[str], bool] | None = None) -> None:
    """Fill the plain (unsharded) `module` in place with the weights of module `name` of the FSDP
    checkpoint `path`, in one process without a process group (DCP reads every rank's shards); `only`:
    the weights whose names it accepts (a LoRA model's adapters), the others left as they are."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    state = {name: {k: v for k, v in untied(module.state_dict()).items() if only is None or only(k)}}
    try:
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(path / SHARDS)), no_dist=True)
    except (RuntimeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path}: its shards of {name!r} do not fit the run's "
                              f"base model ({' '.join(str(exc).split())[:300]})") from exc
    missing, unexpected = module.load_state_dict(state[name], strict=False)
    untied_missing = [k for k in missing if k in state[name]]
    if untied_missing or unexpected:
        raise CheckpointError(f"checkpoint {path}: shards missing {untied_missing[:3]}, unexpected {unexpected[:3]}")
