"""The models behind the Tinker server: one base model, a training model per `create_model`
(a LoRA adapter on the shared base, or with `full=True` a full copy), each with its own
`Learner` (AdamW) and checkpoints, and sampling sessions over saved weights.

Every method runs on the server's one worker thread, one call at a time. `forward_backward_many`
and `sample` take the requests of several clients that waited together (the app's queue): their
rows share forwards, each through its own client's adapter (models.lora_rows), or the adapter made
active when a forward has one; a failing request, checked before any forward, fails alone and
leaves every model as it was. Checkpoints are folders under `root`:

    root/MODEL_ID/weights/NAME/          adapter folder (or HF folder), learner.pt, meta.json
    root/MODEL_ID/sampler_weights/NAME/  adapter folder (or HF folder), meta.json

named `tinker://MODEL_ID/weights/NAME` to the SDK; they outlive the server, so a restarted server
resumes a client from them (`create_training_client_from_state`).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from rlhfkit.core.losses import logprobs_from_logits
from rlhfkit.errors import CheckpointError, ConfigError, DataError, RlhfkitError, one_line
from rlhfkit.models.lora import (
    add_adapter,
    add_lora,
    load_adapter_weights,
    save_adapter,
)
from rlhfkit.models.lora_rows import RowAdapters
from rlhfkit.models.vision import is_prefix_lm, is_vision_model, language_lora_targets, vision_kwargs
from rlhfkit.serving.tinker.images import ImageInputs
from rlhfkit.serving.tinker.losses import lookup_loss
from rlhfkit.serving.tinker.sampling import SamplingMixin
from rlhfkit.serving.tinker.scoring import padded_runs
from rlhfkit.serving.tinker.wire import FwdBwdRequest, WireDatum
from rlhfkit.trainers.learner import Learner

LORA_ALPHA = 32
# Sampler checkpoints whose weights stay loaded (LoRA adapters; --full: whole copies of the model); the
# least recently sampled beyond are unloaded after a sample call and loaded again when next sampled.
MAX_LOADED_SAMPLERS = {"lora": 8, "full": 2}
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


@dataclass
class TrainingModel:
    model_id: str
    rank: int | None  # None: full fine-tuning
    module: torch.nn.Module  # the shared peft model, or this model's own copy
    learner: Learner


# AdamParams' fields: the SDK's default, the check a value must pass and that check in words
ADAM_FIELDS = {
    "learning_rate": (1e-4, lambda x: x >= 0, "lr >= 0"),
    "beta1": (0.9, lambda x: 0 <= x < 1, "0 <= beta1 < 1"),
    "beta2": (0.95, lambda x: 0 <= x < 1, "0 <= beta2 < 1"),
    "eps": (1e-12, lambda x: x > 0, "eps > 0"),
    "weight_decay": (0.0, lambda x: x >= 0, "weight_decay >= 0"),
    "grad_clip_norm": (0.0, lambda x: x >= 0, "grad_clip_norm >= 0 (0: no clipping)"),
}


def adam_hyperparameters(adam: dict) -> dict[str, float]:
    """optim_step's AdamParams as floats (the SDK's defaults where absent); DataError naming a value
    that is not a number or out of its range (a negative learning rate would ascend the loss)."""
    out = {}
    for name, (default, ok, need) in ADAM_FIELDS.items():
        value = adam.get(name, default)
        try:
            x = float(value)
        except (TypeError, ValueError):
            x = float("nan")  # fails every check below
        if not ok(x):
            raise DataError(f"optim_step: AdamParams {name}={value!r}; need {need}")
        out[name] = x
    return out


def linear_names(model: torch.nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def head_name(model: torch.nn.Module) -> str | None:
    """The full module name of `model`'s output layer (its LM head) when it is a linear layer, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return None
    return next((name for name, m in model.named_modules() if m is head), None)


def lora_targets(present: set[str], attn: bool, mlp: bool, head: str | None = None) -> tuple[str, ...]:
    """The linear module names (of `present`, the model's) that Tinker's train_attn / train_mlp pick, and
    `head` (the output layer's name, for train_unembed) when given."""
    wanted = (ATTN if attn else ()) + (MLP if mlp else ())
    targets = tuple(n for n in wanted if n in present) + ((head,) if head else ())
    if not targets:
        raise DataError("lora_config: train_attn, train_mlp and train_unembed are all off (or the model has none "
                        f"of {', '.join(wanted)}); turn one on")
    return targets


class ModelHost(SamplingMixin):
    """Holds the base model, the training models and the sampling sessions (see the module docstring)."""

    def __init__(self, base: torch.nn.Module, tokenizer, name: str, root: str | Path, device: torch.device,
                 full: bool = False, default_rank: int = 32, tokenizer_id: str | None = None,
                 batch_tokens: int = 4096, processor=None):
        if is_vision_model(base) and is_prefix_lm(base.config):
            raise ConfigError(f"{name}: a {base.config.model_type} model (a prefix LM: its prompt attends both ways, "
                              "its response causally) cannot be served for training: Tinker data do not say where a "
                              "prompt ends; train it with rlhfkit train rl / sft / dpo")
        self.base = base.to(device)
        self.tokenizer_id = tokenizer_id or name
        self.linear = linear_names(base)  # read before peft wraps the linear layers
        self.head = head_name(base)  # train_unembed's LoRA target
        # a VLM's LoRA layers: the language model's (full names), never the vision tower's
        self.language_linears = language_lora_targets(base, "all-linear") if is_vision_model(base) else None
        self.images = ImageInputs(processor if is_vision_model(base) else None, base.config)
        self.tokenizer = tokenizer
        self.name = name
        self.root = Path(root)
        self.device = device
        self.full = full
        self.default_rank = default_rank
        self.batch_tokens = batch_tokens  # most padded tokens in one forward of forward_backward
        self.peft = None  # the shared peft model once a LoRA client exists
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, str | None] = {}  # sampling session -> tinker:// path or None (the base)
        # a sampler checkpoint's (folder, version) -> its adapter's name in self.peft, or its model (full);
        # least recently sampled first
        self._loaded: OrderedDict[tuple[str, str], str | torch.nn.Module] = OrderedDict()
        self._sampler_keys: dict[str, tuple[str, str]] = {}  # sampling session -> the snapshot it samples
        self._adapters_made = 0

    # ------------------------------------------------------------------ models
    def create_model(self, model_id: str, rank: int | None, seed: int | None, attn: bool = True,
                     mlp: bool = True, unembed: bool = False, targets: tuple[str, ...] | None = None) -> str:
        """A new training model `model_id` (the SDK's `SESSION:train:SEQ`); returns its id. Its LoRA
        adapter goes on the layers train_attn / train_mlp pick and, with `unembed` (train_unembed), on the
        output layer; `targets`: these module names instead (a checkpoint's, create-via-load)."""
        if model_id in self.models:
            raise DataError(f"model {model_id!r} exists already (model_seq_id reused in this session)")
        rank = self.default_rank if rank is None else rank
        if not self.full and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
            raise DataError(f"lora_config: rank {rank!r}; give a positive integer (the server's default is "
                            f"{self.default_rank})")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed if seed is not None else int(uuid.uuid4().int % (1 << 31)))
            if self.full:
                module = copy.deepcopy(self.base)
                module.requires_grad_(True)
                rank = None
            else:
                if targets is None:
                    targets = self.lora_targets(attn, mlp, unembed)
                module = self._add_adapter(model_id, rank, targets)
                module.set_adapter(model_id)
        learner = Learner(module, lr=1e-4, max_norm=0.0, name=f"model {model_id}")
        self.models[model_id] = TrainingModel(model_id, rank, module, learner)
        return model_id

    def lora_targets(self, attn: bool, mlp: bool, unembed: bool) -> tuple[str, ...]:
        """The LoRA target modules of train_attn / train_mlp / train_unembed on this base (a VLM's: the
        language model's full names, never the vision tower's)."""
        if unembed and self.head is None:
            raise DataError("lora_config: train_unembed on a model whose output layer is not a linear layer; "
                            "create the client with train_unembed=False")
        head = self.head if unembed else None
        targets = lora_targets(self.linear, attn, mlp, head)
        if self.language_linears is not None:
            targets = tuple(n for n in self.language_linears if n.rsplit(".", 1)[-1] in targets) + (
                (head,) if head else ())
        return targets

    def _add_adapter(self, name: str, rank: int, targets: tuple[str, ...]) -> torch.nn.Module:
        """A new LoRA adapter `name` on the shared peft model (made on first use); returns that model."""
        if self.peft is None:
            self.peft = add_lora(self.base, rank, LORA_ALPHA, targets, adapter_name=name)
        else:
            add_adapter(self.peft, name, rank, LORA_ALPHA, targets)
        return self.peft

    def _model(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise DataError(f"model_id {model_id!r}: no such training model on this server (create it, or "
                            "create_training_client_from_state after a restart)")
        return self.models[model_id]

    def get(self, model_id: str) -> TrainingModel:
        """Training model `model_id`, its adapter made peft's active one."""
        model = self._model(model_id)
        if model.rank is not None:
            model.module.set_adapter(model_id)
        return model

    def unload(self, model_id: str) -> None:
        model = self.models.pop(model_id, None)
        if model is not None and model.rank is not None:
            model.module.delete_adapter(model_id)

    def end_session(self, session_id: str) -> None:
        """Unload the training models of SDK session `session_id` (model ids `SESSION:train:SEQ`)."""
        for model_id in [m for m in self.models if m.startswith(f"{session_id}:")]:
            self.unload(model_id)

    @property
    def max_context_length(self) -> int | None:
        return getattr(self.base.config.get_text_config(decoder=True), "max_position_embeddings", None)

    def sampler_path(self, session: str) -> tuple[bool, str | None]:
        """(whether `session` is a sampling session here, the tinker:// path it samples or None for the base)."""
        return session in self.samplers, self.samplers.get(session)

    def info(self, model_id: str) -> dict:
        model = self.get(model_id)
        arch = (getattr(self.base.config, "architectures", None) or [type(self.base).__name__])[0]
        return {"type": "get_info", "model_id": model_id, "model_name": self.name, "is_lora": model.rank is not None,
                "lora_rank": model.rank,
                "model_data": {"arch": arch, "model_name": self.name, "tokenizer_id": self.tokenizer_id}}

    # ------------------------------------------------------------------ forward / backward
    def _check(self, data: list[WireDatum], needs: tuple[str, ...]) -> None:
        vocab = self.base.get_input_embeddings().num_embeddings
        if not data:
            raise DataError("forward_backward: no data; send at least one Datum")
        for i, d in enumerate(data):
            keys = ("target_tokens",) + needs
            missing = [k for k in keys if k not in d.inputs]
            if missing:
                raise DataError(f"data[{i}]: loss_fn_inputs lacks {missing}; this loss needs {list(keys)}")
            n = len(d.tokens)
            if n == 0:
                raise DataError(f"data[{i}]: empty model_input")
            for k in keys:
                if d.inputs[k].reshape(-1).shape[0] != n:
                    raise DataError(f"data[{i}]: loss_fn_inputs[{k!r}] has {d.inputs[k].size} values for "
                                    f"{n} input tokens; give one per input token")
            ids = np.concatenate([np.asarray(d.tokens), d.inputs["target_tokens"].reshape(-1)])
            if ids.min() < 0 or ids.max() >= vocab:
                raise DataError(f"data[{i}]: a token id outside [0, {vocab}) (the model's vocabulary)")

    def logits(self, module: torch.nn.Module, rows: list[list[int]], visions: list | None = None) -> torch.Tensor:
        """`module`'s logits [B, W, V] over the token rows right-padded to the longest (a causal LM's
        real tokens never see the pads after them), each row with its images' tensors (`visions[r]`:
        a VisionInputs or None; models.vision.vision_kwargs)."""
        ids = torch.zeros((len(rows), max(len(r) for r in rows)), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.as_tensor(row, dtype=torch.long)
        extra = {}
        if visions is not None and any(v is not None for v in visions):
            extra = vision_kwargs(module, SimpleNamespace(vision=visions, input_ids=ids), self.device)
        return module(input_ids=ids.to(self.device), **extra).logits

    def _batch_logprobs(self, module: torch.nn.Module, data: list[WireDatum]) -> list[torch.Tensor]:
        """Each datum's logprobs of its targets [T_i], from one forward over the data (`logits`)."""
        labels = torch.zeros((len(data), max(len(d.tokens) for d in data)), dtype=torch.long)
        for r, d in enumerate(data):
            labels[r, :len(d.tokens)] = torch.as_tensor(d.inputs["target_tokens"].reshape(-1), dtype=torch.long)
        logits = self.logits(module, [d.tokens for d in data], [d.vision for d in data])
        logp = logprobs_from_logits(logits, labels.to(self.device))
        return [logp[r, :len(d.tokens)] for r, d in enumerate(data)]

    def forward_backward(self, model_id: str, loss_fn: str, config: dict, data: list[WireDatum],
                         forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Tinker's forward_backward: per datum the loss (summed over its tokens) and, unless
        `forward_only`, its gradient added into the model's accumulated gradient. Returns
        per-datum outputs (`logprobs` [T], `elementwise_loss` [T]) and metrics (`loss:sum`)."""
        request = FwdBwdRequest(model_id, 0, loss_fn, config, forward_only, data)
        result = self.forward_backward_many([request])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def forward_backward_many(self, requests: list[FwdBwdRequest]) -> list[tuple[list, dict] | RlhfkitError]:
        """Several forward / forward_backward requests, of one model or of several, in shared
        forwards: their data cut into batches of at most `batch_tokens` padded tokens (rows of a
        model together; LoRA models' rows share the base, each with its own adapter,
        models.lora_rows), each batch one forward and one backward that adds each backward
        request's gradients into its own model's accumulated gradients: the results and gradients
        of running the requests one by one. Returns per request its (outputs, metrics) as
        `forward_backward`, or the RlhfkitError that refused it; refusals are checked before any
        forward and leave every model as it was."""
        results: list = [None] * len(requests)
        rows = []
        for i, req in enumerate(requests):
            try:
                self._check_request(req)
            except RlhfkitError as exc:
                results[i] = exc
                continue
            rows += [(i, j) for j in range(len(req.data))]
        order = {mid: k for k, mid in enumerate(dict.fromkeys(requests[i].model_id for i, _ in rows))}
        rows.sort(key=lambda row: order[requests[row[0]].model_id])  # stable: each model's rows in order
        outputs = {i: [None] * len(requests[i].data) for i, _ in rows}
        totals = dict.fromkeys(outputs, 0.0)
        for batch in self._token_batches(rows, requests):
            self._run_batch(batch, requests, outputs, totals)
        return [r if r is not None else (outputs[i], {"loss:sum": totals[i]}) for i, r in enumerate(results)]

    def _check_request(self, req: FwdBwdRequest) -> None:
        """DataError for a request that cannot run: an unknown model or loss, a malformed datum, or a
        loss config or input the loss refuses (tried on zero logprobs, before any forward)."""
        spec = lookup_loss(req.loss_fn)
        for i, d in enumerate(req.data):  # image chunks -> their tokens and pixel tensors
            d.tokens, d.vision = self.images.expand(d.tokens, f"data[{i}]")
        self._check(req.data, spec.inputs)
        self._model(req.model_id)
        with torch.no_grad():
            for d in req.data:
                inputs = {k: torch.as_tensor(d.inputs[k].reshape(-1), dtype=torch.float32) for k in spec.inputs}
                try:
                    spec.fn(torch.zeros(len(d.tokens)), inputs, req.config)
                except (TypeError, ValueError) as exc:  # a config value that is not a number
                    raise DataError(f"loss_fn_config {req.config!r} of loss_fn {req.loss_fn!r}: {one_line(exc)}; "
                                    "give numbers") from exc

    def _token_batches(self, rows: list[tuple[int, int]], requests: list[FwdBwdRequest]):
        """`rows` (request, datum) cut into runs of at most `batch_tokens` padded tokens (a longer
        datum alone, scoring.padded_runs), each run on one module (full fine-tuning: one model)."""
        modules = [self.models[requests[i].model_id].module for i, _ in rows]
        start = 0
        for stop in range(1, len(rows) + 1):
            if stop < len(rows) and modules[stop] is modules[start]:
                continue
            lengths = [len(requests[i].data[j].tokens) for i, j in rows[start:stop]]
            for a, b in padded_runs(lengths, self.batch_tokens):
                yield rows[start + a:start + b]
            start = stop

    def _run_batch(self, batch: list[tuple[int, int]], requests: list[FwdBwdRequest], outputs: dict,
                   totals: dict) -> None:
        """One forward (and backward, for the rows of backward requests) over `batch`."""
        models = [self.models[requests[i].model_id] for i, _ in batch]
        trained = list(dict.fromkeys(m.model_id for m, (i, _) in zip(models, batch) if not requests[i].forward_only))
        module = models[0].module
        data = [requests[i].data[j] for i, j in batch]
        with self._adapters(module, [m.model_id if m.rank is not None else None for m in models], trained):
            module.train(bool(trained))
            with torch.set_grad_enabled(bool(trained)):
                logps = self._batch_logprobs(module, data)
                losses = []
                for (i, j), d, logp in zip(batch, data, logps):
                    spec, req = lookup_loss(requests[i].loss_fn), requests[i]
                    inputs = {k: torch.tensor(d.inputs[k].reshape(-1), dtype=torch.float32, device=self.device)
                              for k in spec.inputs}
                    loss, _ = spec.fn(logp, inputs, req.config)
                    outputs[i][j] = {"logprobs": logp.detach().cpu().numpy(),
                                     "elementwise_loss": _elementwise(spec, logp.detach(), inputs, req.config)}
                    totals[i] += float(loss.detach())
                    if not req.forward_only:
                        losses.append(loss)
            if losses:
                params = [p for mid in trained for p in self.models[mid].learner.params]
                torch.autograd.backward(torch.stack(losses).sum(), inputs=params)

    def _adapters(self, module: torch.nn.Module, names: list[str | None], trained: list[str]):
        """The context a forward over rows of adapters `names` runs in: nothing for a full model, the
        adapter made active for rows of one adapter (`_one_adapter`), per-row adapters for rows of several."""
        if module is not self.peft or len(set(names)) == 1:
            return self._one_adapter(module, names[0])
        rows = RowAdapters(module, trainable=trained)
        rows.set_rows(names)
        return rows

    def optim_step(self, model_id: str, adam: dict) -> dict[str, float]:
        model = self.get(model_id)
        learner = model.learner
        hp = adam_hyperparameters(adam)
        for group in learner.optimizer.param_groups:
            group["lr"] = hp["learning_rate"]
            group["betas"] = (hp["beta1"], hp["beta2"])
            group["eps"] = hp["eps"]
            group["weight_decay"] = hp["weight_decay"]
        learner.scheduler.base_lrs = [g["lr"] for g in learner.optimizer.param_groups]
        learner.max_norm = hp["grad_clip_norm"]
        stats = learner.step()
        metrics = {"grad_norm:mean": float(stats["grad_norm"]), "skipped_steps:max": float(stats["skipped_steps"])}
        # a step skipped for a NaN / inf gradient has no grad norm JSON can carry: skipped_steps says why
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    # ------------------------------------------------------------------ checkpoints
    def _folder(self, model_id: str, kind: str, name: str) -> tuple[Path, str]:
        if not name or "/" in name or name.startswith("."):
            raise DataError(f"checkpoint name {name!r}: use a plain name (letters, digits, -_), no slashes")
        return self.root / model_id / kind / name, f"tinker://{model_id}/{kind}/{name}"

    def _write_weights(self, model: TrainingModel, folder: Path) -> None:
        if model.rank is not None:
            save_adapter(model.module, model.model_id, folder, save_embedding_layers=False)  # the base is shared
        else:
            model.module.save_pretrained(folder, safe_serialization=True)
        # version: a sampler of this path samples the weights saved when it was created, not a later save's
        meta = {"base_model": self.name, "rank": model.rank, "model_id": model.model_id, "version": uuid.uuid4().hex}
        (folder / "meta.json").write_text(json.dumps(meta))

    def save_state(self, model_id: str, name: str) -> str:
        model = self.get(model_id)
        folder, uri = self._folder(model_id, "weights", name)
        self._write_weights(model, folder)
        torch.save(model.learner.state_dict(), folder / "learner.pt")
        return uri

    def save_for_sampler(self, model_id: str, name: str) -> str:
        model = self.get(model_id)
        folder, uri = self._folder(model_id, "sampler_weights", name)
        self._write_weights(model, folder)
        return uri

    def resolve(self, uri: str) -> tuple[Path, dict]:
        """The folder and meta.json of checkpoint `tinker://MODEL_ID/KIND/NAME`."""
        parts = uri.removeprefix("tinker://").split("/")
        if not uri.startswith("tinker://") or len(parts) != 3 or parts[1] not in ("weights", "sampler_weights"):
            raise DataError(f"path {uri!r}: expected tinker://MODEL_ID/weights/NAME or .../sampler_weights/NAME")
        folder = self.root.joinpath(*parts)
        if ".." in parts or not (folder / "meta.json").is_file():
            raise CheckpointError(f"path {uri!r}: no such checkpoint on this server ({folder} has no meta.json)")
        return folder, json.loads((folder / "meta.json").read_text())

    def list_checkpoints(self, model_id: str | None = None) -> list[dict]:
        """The checkpoints under the root (of training model `model_id`, or all), newest first, as the
        SDK's `Checkpoint` (id `weights/NAME` or `sampler_weights/NAME`, time, tinker:// path, size)."""
        if model_id is not None and (model_id.startswith(".") or "/" in model_id):
            raise DataError(f"training run {model_id!r}: not a model id (SESSION:train:SEQ)")
        runs = [self.root / model_id] if model_id is not None else sorted(self.root.glob("*"))
        out = []
        for run in runs:
            for kind, ctype in (("weights", "training"), ("sampler_weights", "sampler")):
                for meta in (run / kind).glob("*/meta.json"):
                    folder = meta.parent
                    out.append({"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": ctype,
                                "time": datetime.fromtimestamp(meta.stat().st_mtime, timezone.utc).isoformat(),
                                "tinker_path": f"tinker://{run.name}/{kind}/{folder.name}",
                                "size_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())})
        return sorted(out, key=lambda c: c["time"], reverse=True)

    def delete_checkpoint(self, uri: str) -> None:
        """Remove checkpoint `uri`'s folder (its samplers sample on while their weights stay loaded)."""
        folder, _ = self.resolve(uri)
        shutil.rmtree(folder)

    def load_state(self, model_id: str, uri: str, optimizer: bool, create: bool = False) -> str:
        """Load checkpoint `uri` into `model_id`, or with `create` into a new model `model_id` of the
        checkpoint's kind (create-via-load). Returns the model id."""
        folder, meta = self.resolve(uri)
        if (meta["rank"] is None) != self.full:
            raise CheckpointError(f"path {uri!r}: a {'full' if meta['rank'] is None else 'LoRA'} checkpoint; this "
                                  f"server runs {'--full' if self.full else 'LoRA'} models")
        if create:
            targets = None if meta["rank"] is None else _adapter_targets(folder)
            self.create_model(model_id, meta["rank"], seed=0, targets=targets)
        model = self.get(model_id)
        if model.rank is not None:
            if model.rank != meta["rank"]:
                raise CheckpointError(f"path {uri!r}: LoRA rank {meta['rank']}, the model has rank {model.rank}")
            load_adapter_weights(model.module, model_id, folder)
        else:
            _load_full(model.module, folder)
        if optimizer:
            if not (folder / "learner.pt").is_file():
                raise CheckpointError(f"path {uri!r}: a sampler checkpoint has no optimizer state; "
                                      "save_state writes it")
            model.learner.load_state_dict(torch.load(folder / "learner.pt", weights_only=True))
        return model_id

    # ------------------------------------------------------------------ sampling
    def create_sampler(self, model_path: str | None) -> str:
        """A sampling session of checkpoint `model_path` (None: the base), its weights loaded now: a
        later save to the same path does not change what it samples."""
        session = f"sampler-{uuid.uuid4().hex[:16]}"
        if model_path is not None:
            folder, meta = self.resolve(model_path)
            key = _snapshot(folder, meta)
            if key not in self._loaded:
                self._load_sampler(key, folder, meta)
            self._sampler_keys[session] = key
            self._loaded.move_to_end(key)
            self.trim_samplers()
        self.samplers[session] = model_path
        return session

    def _load_sampler(self, key: tuple[str, str], folder: Path, meta: dict) -> None:
        if meta["rank"] is None:
            module = copy.deepcopy(self.base)
            _load_full(module, folder)
            self._loaded[key] = module.requires_grad_(False)
            return
        name = f"sampler-{self._adapters_made}"
        self._adapters_made += 1
        load_adapter_weights(self._add_adapter(name, meta["rank"], _adapter_targets(folder)), name, folder)
        self._loaded[key] = name

    def trim_samplers(self) -> None:
        """Unload the least recently sampled checkpoints' weights beyond MAX_LOADED_SAMPLERS."""
        while len(self._loaded) > MAX_LOADED_SAMPLERS["full" if self.full else "lora"]:
            _, loaded = self._loaded.popitem(last=False)
            if isinstance(loaded, str):
                self.peft.delete_adapter(loaded)

    def _sampling_target(self, session: str) -> tuple[torch.nn.Module, str | None]:
        """The module sampling session `session` samples and, when it is the shared peft model, the
        adapter its rows use (None: the base under the adapters)."""
        if session not in self.samplers:
            raise DataError(f"sampling_session_id {session!r}: no such sampling session on this server")
        uri = self.samplers[session]
        if uri is None:
            return (self.base, None) if self.peft is None else (self.peft, None)
        key = self._sampler_keys[session]
        if key not in self._loaded:  # unloaded since (trim_samplers): the same save, if still on disk
            folder, meta = self.resolve(uri)
            if _snapshot(folder, meta) != key:
                raise CheckpointError(f"sampling session {session!r}: {uri} was saved again after this sampler was "
                                      "created, and the weights it sampled were unloaded (the least recently "
                                      "sampled are); create a new sampling client")
            self._load_sampler(key, folder, meta)
        self._loaded.move_to_end(key)
        loaded = self._loaded[key]
        return (loaded, None) if isinstance(loaded, torch.nn.Module) else (self.peft, loaded)


def _adapter_targets(folder: Path) -> tuple[str, ...]:
    """The target modules of the LoRA adapter saved in `folder` (its peft adapter_config.json)."""
    return tuple(sorted(json.loads((folder / "adapter_config.json").read_text())["target_modules"]))


def _snapshot(folder: Path, meta: dict) -> tuple[str, str]:
    """The key of one save of a checkpoint: its folder and the save's version (meta.json's time for a
    checkpoint written before versions)."""
    return str(folder), meta.get("version") or f"mtime-{(folder / 'meta.json').stat().st_mtime_ns}"


def _load_full(module: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
    result = module.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(f"{folder}: weights {result.unexpected_keys[:3]} do not fit the served base model")


def _elementwise(spec, logp: torch.Tensor, inputs: dict, config: dict) -> np.ndarray:
    """Each token's share of the loss (the loss of a one-token datum, token by token, unless the
    loss says how)."""
    if spec.elementwise is not None:
        return np.asarray(spec.elementwise(logp, inputs, config), dtype=np.float32)
    rows = []
    for t in range(logp.shape[0]):
        one = {k: v[t:t + 1] for k, v in inputs.items()}
        rows.append(float(spec.fn(logp[t:t + 1], one, config)[0]))
    return np.asarray(rows, dtype=np.float32)
