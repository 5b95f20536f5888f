"""The models behind the Tinker server: one base model, a training model per `create_model`
(a LoRA adapter on the shared base, or with `full=True` a full copy), each with its own
`Learner` (AdamW) and checkpoints, and sampling sessions over saved weights.

Every method runs on the server's one worker thread, one request at a time in arrival order, so
a request sees exactly the adapter it names (`set_adapter` before each) and a failing request,
checked before any forward, leaves every model as it was. Checkpoints are folders under `root`:

    root/MODEL_ID/weights/NAME/          adapter folder (or HF folder), learner.pt, meta.json
    root/MODEL_ID/sampler_weights/NAME/  adapter folder (or HF folder), meta.json

named `tinker://MODEL_ID/weights/NAME` to the SDK; they outlive the server, so a restarted server
resumes a client from them (`create_training_client_from_state`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlhfkit.core.losses import logprobs_from_logits
from rlhfkit.errors import CheckpointError, DataError
from rlhfkit.models.lora import (
    add_adapter,
    add_lora,
    load_adapter_weights,
    save_adapter,
)
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.stops import cut_at_stop_strings, split_stops
from rlhfkit.serving.tinker.losses import lookup_loss
from rlhfkit.serving.tinker.wire import Sequence, WireDatum
from rlhfkit.trainers.learner import Learner

LORA_ALPHA = 32
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


@dataclass
class TrainingModel:
    model_id: str
    rank: int | None  # None: full fine-tuning
    module: torch.nn.Module  # the shared peft model, or this model's own copy
    learner: Learner


def linear_names(model: torch.nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def lora_targets(present: set[str], attn: bool, mlp: bool) -> tuple[str, ...]:
    """The linear module names (of `present`, the model's) that Tinker's train_attn / train_mlp pick."""
    wanted = (ATTN if attn else ()) + (MLP if mlp else ())
    targets = tuple(n for n in wanted if n in present)
    if not targets:
        raise DataError("lora_config: train_attn and train_mlp are both off (or the model has none of "
                        f"{', '.join(wanted)}); turn one on")
    return targets


class ModelHost:
    """Holds the base model, the training models and the sampling sessions (see the module docstring)."""

    def __init__(self, base: torch.nn.Module, tokenizer, name: str, root: str | Path, device: torch.device,
                 full: bool = False, default_rank: int = 32, tokenizer_id: str | None = None):
        self.base = base.to(device)
        self.tokenizer_id = tokenizer_id or name
        self.linear = linear_names(base)  # read before peft wraps the linear layers
        self.tokenizer = tokenizer
        self.name = name
        self.root = Path(root)
        self.device = device
        self.full = full
        self.default_rank = default_rank
        self.peft = None  # the shared peft model once a LoRA client exists
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, str | None] = {}  # sampling session -> tinker:// path or None (the base)
        self._sampler_adapters: dict[str, str] = {}  # checkpoint folder -> adapter name in self.peft
        self._sampler_models: dict[str, torch.nn.Module] = {}  # full fine-tuning: folder -> model

    # ------------------------------------------------------------------ models
    def create_model(self, model_id: str, rank: int | None, seed: int | None, attn: bool = True,
                     mlp: bool = True) -> str:
        """A new training model `model_id` (the SDK's `SESSION:train:SEQ`); returns its id."""
        if model_id in self.models:
            raise DataError(f"model {model_id!r} exists already (model_seq_id reused in this session)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed if seed is not None else int(uuid.uuid4().int % (1 << 31)))
            if self.full:
                module = copy.deepcopy(self.base)
                module.requires_grad_(True)
                rank = None
            else:
                rank = rank or self.default_rank
                targets = lora_targets(self.linear, attn, mlp)
                if self.peft is None:
                    self.peft = add_lora(self.base, rank, LORA_ALPHA, targets, adapter_name=model_id)
                else:
                    add_adapter(self.peft, model_id, rank, LORA_ALPHA, targets)
                module = self.peft
                module.set_adapter(model_id)
        learner = Learner(module, lr=1e-4, max_norm=0.0, name=f"model {model_id}")
        self.models[model_id] = TrainingModel(model_id, rank, module, learner)
        return model_id

    def get(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise DataError(f"model_id {model_id!r}: no such training model on this server (create it, or "
                            "create_training_client_from_state after a restart)")
        model = self.models[model_id]
        if model.rank is not None:
            model.module.set_adapter(model_id)
        return model

    def unload(self, model_id: str) -> None:
        model = self.models.pop(model_id, None)
        if model is not None and model.rank is not None:
            model.module.delete_adapter(model_id)

    @property
    def max_context_length(self) -> int | None:
        return getattr(self.base.config, "max_position_embeddings", None)

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

    def _logprobs(self, module: torch.nn.Module, tokens: list[int], targets: np.ndarray) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        logits = module(input_ids=ids).logits[0]
        return logprobs_from_logits(logits, torch.tensor(targets.reshape(-1), dtype=torch.long, device=self.device))

    def forward_backward(self, model_id: str, loss_fn: str, config: dict, data: list[WireDatum],
                         forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Tinker's forward_backward: per datum the loss (summed over its tokens) and, unless
        `forward_only`, its gradient added into the model's accumulated gradient. Returns
        per-datum outputs (`logprobs` [T], `elementwise_loss` [T]) and metrics (`loss:sum`)."""
        spec = lookup_loss(loss_fn)
        self._check(data, spec.inputs)
        model = self.get(model_id)
        model.module.train(not forward_only)
        outputs, total = [], 0.0
        for d in data:
            with torch.set_grad_enabled(not forward_only):
                logp = self._logprobs(model.module, d.tokens, d.inputs["target_tokens"])
                inputs = {k: torch.tensor(d.inputs[k].reshape(-1), dtype=torch.float32, device=self.device)
                          for k in spec.inputs}
                loss, _ = spec.fn(logp, inputs, config)
                elementwise = _elementwise(spec, logp.detach(), inputs, config)
            if not forward_only:
                model.learner.backward(loss)
            total += float(loss.detach())
            outputs.append({"logprobs": logp.detach().cpu().numpy(), "elementwise_loss": elementwise})
        return outputs, {"loss:sum": total}

    def optim_step(self, model_id: str, adam: dict) -> dict[str, float]:
        model = self.get(model_id)
        learner = model.learner
        for group in learner.optimizer.param_groups:
            group["lr"] = float(adam.get("learning_rate", 1e-4))
            group["betas"] = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
            group["eps"] = float(adam.get("eps", 1e-12))
            group["weight_decay"] = float(adam.get("weight_decay", 0.0))
        learner.scheduler.base_lrs = [g["lr"] for g in learner.optimizer.param_groups]
        learner.max_norm = float(adam.get("grad_clip_norm", 0.0))
        stats = learner.step()
        return {"grad_norm:mean": stats["grad_norm"], "skipped_steps:max": stats["skipped_steps"]}

    # ------------------------------------------------------------------ checkpoints
    def _folder(self, model_id: str, kind: str, name: str) -> tuple[Path, str]:
        if not name or "/" in name or name.startswith("."):
            raise DataError(f"checkpoint name {name!r}: use a plain name (letters, digits, -_), no slashes")
        return self.root / model_id / kind / name, f"tinker://{model_id}/{kind}/{name}"

    def _write_weights(self, model: TrainingModel, folder: Path) -> None:
        if model.rank is not None:
            save_adapter(model.module, model.model_id, folder)
        else:
            model.module.save_pretrained(folder, safe_serialization=True)
        meta = {"base_model": self.name, "rank": model.rank, "model_id": model.model_id}
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

    def load_state(self, model_id: str, uri: str, optimizer: bool, create: bool = False) -> str:
        """Load checkpoint `uri` into `model_id`, or with `create` into a new model `model_id` of the
        checkpoint's kind (create-via-load). Returns the model id."""
        folder, meta = self.resolve(uri)
        if (meta["rank"] is None) != self.full:
            raise CheckpointError(f"path {uri!r}: a {'full' if meta['rank'] is None else 'LoRA'} checkpoint; this "
                                  f"server runs {'--full' if self.full else 'LoRA'} models")
        if create:
            self.create_model(model_id, meta["rank"], seed=0)
        model = self.get(model_id)
        if model.rank is not None:
            if model.rank != meta["rank"]:
                raise CheckpointError(f"path {uri!r}: LoRA rank {meta['rank']}, the model has rank {model.rank}")
            load_adapter_weights(model.module, model_id, folder)
        else:
            _load_full(model.module, folder)
        if optimizer:
            if not (folder / "learner.pt").is_file():
                raise CheckpointError(f"path {uri!r}: a sampler checkpoint has no optimizer state; save_state writes it")
            model.learner.load_state_dict(torch.load(folder / "learner.pt", weights_only=True))
        return model_id

    # ------------------------------------------------------------------ sampling
    def create_sampler(self, model_path: str | None) -> str:
        if model_path is not None:
            self.resolve(model_path)
        session = f"sampler-{uuid.uuid4().hex[:16]}"
        self.samplers[session] = model_path
        return session

    def _sampling_module(self, session: str) -> torch.nn.Module:
        if session not in self.samplers:
            raise DataError(f"sampling_session_id {session!r}: no such sampling session on this server")
        uri = self.samplers[session]
        if uri is None:
            return self.base if self.peft is None else self.peft
        folder, meta = self.resolve(uri)
        if meta["rank"] is None:
            if str(folder) not in self._sampler_models:
                module = copy.deepcopy(self.base)
                _load_full(module, folder)
                self._sampler_models[str(folder)] = module.requires_grad_(False)
            return self._sampler_models[str(folder)]
        name = self._sampler_adapters.get(str(folder))
        if name is None:
            name = f"sampler-{len(self._sampler_adapters)}"
            targets = tuple(json.loads((folder / "adapter_config.json").read_text())["target_modules"])
            if self.peft is None:
                self.peft = add_lora(self.base, meta["rank"], LORA_ALPHA, targets, adapter_name=name)
            else:
                add_adapter(self.peft, name, meta["rank"], LORA_ALPHA, targets)
            load_adapter_weights(self.peft, name, folder)
            self._sampler_adapters[str(folder)] = name
        self.peft.set_adapter(name)
        return self.peft

    def check_prompt(self, prompt: list[int]) -> None:
        vocab = self.base.get_input_embeddings().num_embeddings
        if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
            raise DataError(f"prompt: needs at least one token, each in [0, {vocab})")

    def sample(self, session: str, prompts: list[list[int]], n: int, params: dict, seeds: list[int | None],
               prompt_logprobs: list[bool]) -> list[tuple[list[Sequence], list[float] | None]]:
        """`n` samples of each prompt with the session's weights, in one engine call: prompt i's
        samples depend only on it, the weights and seeds[i] (a random seed where None), so a
        request gives the same answer alone or batched with others."""
        for prompt in prompts:
            self.check_prompt(prompt)
        module = self._sampling_module(session)
        off = self.samplers[session] is None and self.peft is not None  # the base under the adapters
        stop_ids, stop_texts = self._stops(params.get("stop"))
        sp = SamplingParams(max_new_tokens=int(params.get("max_tokens") or 16),
                            temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                            top_k=int(params.get("top_k", -1)), n=n, stop_token_ids=stop_ids)
        seeds = [seed if seed is not None else int(uuid.uuid4().int % (1 << 62)) for seed in seeds]
        with module.disable_adapter() if off else contextlib.nullcontext():
            trajs = [cut_at_stop_strings(t, stop_texts, self.tokenizer)
                     for t in HFEngine(module, self.tokenizer).generate(prompts, sp, seeds=seeds)]
            prompt_lps = [self._prompt_logprobs(module, p) if want else None for p, want in zip(prompts, prompt_logprobs)]
        seqs = [Sequence(t.response_ids.tolist(), t.logprobs.tolist(), "length" if t.truncated else "stop")
                for t in trajs]
        return [(seqs[i * n:(i + 1) * n], lp) for i, lp in enumerate(prompt_lps)]

    def _prompt_logprobs(self, module: torch.nn.Module, prompt: list[int]) -> list[float]:
        """NaN for the first token (nothing before it), then log p(prompt[i] | prompt[:i])."""
        if len(prompt) < 2:
            return [float("nan")]
        module.eval()
        with torch.no_grad():
            lp = self._logprobs(module, prompt[:-1], np.asarray(prompt[1:]))
        return [float("nan")] + lp.tolist()

    def _stops(self, stop) -> tuple[tuple[int, ...], tuple[str, ...]]:
        if not stop:
            return (), ()
        try:
            return split_stops([stop] if isinstance(stop, (str, int)) else list(stop), self.tokenizer)
        except (TypeError, ValueError) as exc:
            raise DataError(f"sampling_params.stop: {exc}") from exc


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
