"""FSDP2 (torch's built-in `fully_shard`) for the RL trainer under `torchrun` (or in Ray trainer actors:
distributed/fsdp_ray.py).

    torchrun --nproc_per_node 8 -m rlhfkit.cli.main train rl --fsdp.enable true ...

What each process does (every rank runs the same RL loop on the same data):
- The policy (and the frozen reference) is sharded: each decoder layer is its own FSDP unit, so
  are the backbone (embeddings, final norm) and the LM head, and the root. Optional bf16 or fp16 compute with
  float32 gradient reduction (`MixedPrecisionPolicy`).
- Rollout and experience run on every rank with the same seeds, so every rank holds the same
  batch (the HF engine decodes through the policy with its parameters gathered once per rollout,
  `unsharded`; a vLLM engine per rank receives the full state at every weight sync, gathered and
  loaded part by part on the GPU, `StreamedState`). This replicates the generation work: splitting
  rollouts across ranks is what the Ray workers of docs/scaling.md ("Ray cluster") are for.
- The update is data-parallel: each rank takes an equal slice of every optimizer step's rows
  (`RLTrainer.dp`, `RLTrainer.rank_share`: whole groups with the shared-prefix layout), the losses are already divided
  by the WHOLE step's token/sequence counts (core.aggregate), and FSDP's reduce-scatter SUMS the gradients (divide
  factor 1), so the step equals the single-process step on the same global batch (tests/integration/test_fsdp.py).
- A critic (gae) is sharded the same way and trained data-parallel beside the policy; an EMA of the
  policy (--actor.ema_beta) is kept shard by shard.
- A vision-language model (models/vision.py) is sharded alike: each decoder layer of its language
  model and each block of its vision tower is a unit, so are the base model (embeddings, the tower's
  patch embedding and merger, the projector, the final norm), the LM head and the root. The tower is
  not a unit of its own: fully_shard changes a unit's class, and transformers then finds no
  output-capture settings for it (LLaVA reads the tower's hidden states through them). The forward gets
  each row's image tensors as in one process, and a frozen tower (--actor.freeze_visual_encoder) is
  sharded frozen. The reference keeps its own (sharded) copy of a frozen tower instead of sharing
  the policy's modules: a module is sharded once, into one model.
- Saving gathers the full state dict on rank 0, which writes the HF folder (and `ema/`); a
  vision-language model's folder gets its processor too (api/rl.py).
- Periodic checkpoints (--ckpt.save_steps) are sharded: each rank writes its shards of the weights,
  Adam moments and EMA and its trainer state, through torch.distributed.checkpoint; --ckpt.load_enable
  resumes from the latest complete one, under any number of ranks (distributed.fsdp_checkpoint).

- Token-budget micro-batches (--train.dynamic_batch_enable) and DAPO's filtered batches (whose rows
  may not split into equal shares) can give the ranks different numbers of micro-batches, while every
  FSDP forward/backward is a collective: the ranks agree on the largest count (`max_over_ranks`) and a
  rank with fewer runs passes that add nothing to the gradients (trainers.rl.update `idle_pass`).
- bf16 parameters with float32 masters (--actor.dtype bfloat16) are, under FSDP2, float32 sharded
  parameters (the masters) computing in bf16 with float32 gradient reduction: --fsdp.mixed_precision.
  float16 ones (--actor.dtype float16) likewise compute in fp16, with the dynamic loss scale of one process
  (trainers.loss_scale). Its overflow check is the same on every rank: the gradient norm it tests is that of
  the whole sharded model (a DTensor norm, reduced over the ranks), so every rank skips the same steps and
  moves its scale alike; the scale is in each rank's trainer state of a checkpoint.
- QLoRA (--ds.load_in_4bit): every rank holds the frozen 4-bit base whole (`whole_4bit_weights`, left out
  of FSDP), the adapters are sharded and reduced as under LoRA (tests/integration/test_fsdp_qlora.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from rlhfkit.errors import ConfigError
from rlhfkit.models import save_hf_folder
from rlhfkit.models.logprobs import decoder_backbone
from rlhfkit.models.lora import dequantized_items, is_4bit
from rlhfkit.models.vision import (
    base_model,
    is_vision_model,
    plain_model_class,
    vision_parts,
)


def init_from_torchrun() -> tuple[int, int]:
    """Join the process group that `torchrun` set up (nccl on GPU, gloo on CPU), or take the one the
    Ray trainer actors joined already (distributed.fsdp_ray.init_group); (rank, world size).
    On GPU each process takes cuda:LOCAL_RANK (torchrun gives one process per GPU; Ray shows a trainer
    actor its own GPU alone)."""
    if not dist.is_initialized() and not dist.is_torchelastic_launched():
        raise ConfigError("--fsdp.enable true runs under torchrun: torchrun --nproc_per_node N -m rlhfkit.cli.main "
                          "train rl --fsdp.enable true ... (see docs/scaling.md)")
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    return dist.get_rank(), dist.get_world_size()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (`model.model.layers`, Llama/Qwen/Mistral layout)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError(f"--fsdp.enable: {type(model).__name__} has no model.layers to shard; "
                          "FSDP here supports HF decoder-only models (Llama, Qwen, Mistral, SmolLM)")
    return list(layers)


def vision_blocks(base: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of a vision-language base model (models.vision.base_model) that are FSDP units: its
    language model's decoder layers (`language_model.layers`; SmolVLM / Idefics3: `text_model.layers`)
    and its vision towers' blocks (each tower's ModuleLists named `blocks`, `layers` or `layer` outside one
    another: Llama 3.2 Vision's tower has two, its local and its global layers)."""
    language = getattr(base, "language_model", None) or getattr(base, "text_model", None)
    layers = getattr(language, "layers", None)
    if layers is None:
        raise ConfigError(f"--fsdp.enable: {type(base).__name__} has no language_model.layers (nor "
                          "text_model.layers) to shard")
    blocks = list(layers)
    for _, tower in vision_parts(base):
        picked: list[str] = []
        for name, m in tower.named_modules():
            inside = any(name.startswith(p + ".") for p in picked)
            if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("blocks", "layers", "layer") \
                    and not inside:
                picked.append(name)
                blocks.extend(m)
    return blocks


def shard_model(model: torch.nn.Module, world_size: int, mixed_precision: bool | str = False) -> torch.nn.Module:
    """Shard a causal LM in place across `world_size` ranks: one FSDP unit per decoder layer, the
    backbone, the LM head and the root (a vision-language model: its base model is the backbone, and
    each block of its vision tower is a unit too, `vision_blocks`). A LoRA policy (a
    peft model) is sharded through its base model (the root): its adapters sit in the layers' linear
    modules and are sharded with their layer. Over a 4-bit base (QLoRA) the 4-bit weights are not sharded:
    every rank holds them whole (`whole_4bit_weights`); the adapters, embeddings, norms and head are.

    Gradients are SUMMED across ranks (divide factor 1): rlhfkit's losses are already divided by
    the counts of the whole optimizer step, so summing the ranks' parts gives the full gradient.
    `mixed_precision`: False (float32), True or "bfloat16" (bf16 compute), "float16" (fp16 compute); the
    shards and the gradient reduction stay float32 (`mp_policy`).
    """
    # models.response_logits calls the backbone and the LM head directly (logits only at response
    # positions), so each is its own unit: their forward hooks then gather their weights. A tied head
    # shares the embedding's weight: backbone and head are then one unit (gathered from the backbone's
    # forward to the head's).
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's base
    head = inner.get_output_embeddings()
    if is_vision_model(inner):  # models.logprobs calls the base model (it takes the images), then the head
        backbone = base_model(inner)
        layers = vision_blocks(backbone)
    else:
        backbone, layers = decoder_backbone(inner), decoder_layers(inner)  # the decoder the logprobs call
    if head is not None and head.weight is backbone.get_input_embeddings().weight:
        units = [[backbone, head]]
    else:
        units = [backbone] + ([head] if head is not None else [])
    _shard(inner, layers, units, world_size, mixed_precision, lambda ids: model(input_ids=ids),
           held_whole=whole_4bit_weights(inner))
    return model


def whole_4bit_weights(model: torch.nn.Module) -> set[torch.nn.Parameter]:
    """The frozen 4-bit weights of a QLoRA base (bitsandbytes' `Params4bit`; none without --ds.load_in_4bit),
    which `shard_model` leaves out of FSDP (`ignored_params`): every rank holds them whole, with their
    quantization state, as one process does. Sharded, a packed weight became a DTensor without its
    quantization state, which the weight sync (`StreamedState`: dequantized for vLLM) and the state dict
    need."""
    if not is_4bit(model):
        return set()
    from bitsandbytes.nn import Params4bit

    return {p for p in model.parameters() if isinstance(p, Params4bit)}


def shard_critic(critic: torch.nn.Module, world_size: int, mixed_precision: bool | str = False) -> torch.nn.Module:
    """Shard a models.critic.Critic like a causal LM: one unit per decoder layer of its backbone, the
    backbone (embeddings, final norm), the value head (called directly by `response_values`), the root;
    a vision-language backbone (a VLM's base model) with its tower's blocks as units too."""
    if is_vision_model(critic.backbone):
        layers = vision_blocks(critic.backbone)
    else:
        layers = list(getattr(critic.backbone, "layers", None) or [])
    if not layers:
        raise ConfigError(f"--fsdp.enable: the critic's {type(critic.backbone).__name__} has no layers to shard")
    return _shard(critic, layers, [critic.backbone, critic.value_head], world_size, mixed_precision,
                  lambda ids: critic(ids, torch.ones_like(ids)))


def _shard(model, layers, units, world_size: int, mixed_precision: bool | str, dummy_forward,
           held_whole: set[torch.nn.Parameter] | None = None) -> torch.nn.Module:
    """`fully_shard` each of `layers`, `units` and `model`; the parameters in `held_whole` stay plain
    (every rank holds them whole: fully_shard's `ignored_params`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))
    kwargs = {"mesh": init_device_mesh(device, (world_size,))}
    if held_whole:
        kwargs["ignored_params"] = held_whole
    if mixed_precision:
        kwargs["mp_policy"] = mp_policy(mixed_precision)
    for unit in [*layers, *units, model]:
        fully_shard(unit, **kwargs)
    # FSDP picks its root at the first forward, which must enter through `model` (a reference model
    # is otherwise only ever called through backbone and head): one dummy token, on every rank.
    with torch.no_grad():
        dummy_forward(torch.zeros((1, 1), dtype=torch.long, device=device))
    for unit in model.modules():  # each FSDP unit has its own reduction settings
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


def mp_policy(mixed_precision: bool | str):
    """FSDP2's MixedPrecisionPolicy: parameters gathered in bf16 (True, "bfloat16") or fp16 ("float16") for
    forward and backward, gradients reduced in float32 (so the sum over ranks adds no rounding of its own)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = torch.float16 if mixed_precision == "float16" else torch.bfloat16
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@contextlib.contextmanager
def unsharded(model: torch.nn.Module):
    """Inside, every FSDP unit of `model` holds its full parameters, gathered once on entry, and its
    forwards do not reshard them: the HF engine's rollout decodes through the sharded policy, and with
    FSDP's default (reshard after forward) every layer was gathered again at every decoded token. On
    exit the units reshard and reshard after forward again (the root keeps FSDP's own setting: it does
    not). The rollout then holds the full parameters on every rank, as an unsharded model would."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    root = units[0]  # `model` itself, or a peft model's base model
    root.set_reshard_after_forward(False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)  # the root: FSDP's default
        for unit in units:
            unit.reshard()


class StreamedState:
    """The full (unsharded) state dict of an FSDP-sharded `model`, gathered a part at a time on the
    model's device: `parts(bucket_bytes)` yields dicts of full tensors of about `bucket_bytes` each
    (a tensor larger than that alone), each tensor gathered when its part is reached (a collective:
    every rank walks the same names in the same order). The vLLM weight sync loads a part before the
    next is gathered, so a rank's GPU holds one part of the full state, not all of it; the parts stay
    on the GPU, so vLLM takes its in-process or CUDA IPC path. (`full_state_dict(rank0_only=False)`
    gathered the whole model on every rank's GPU, then copied it to the CPU: vLLM then got the whole
    model serialised as bytes at every step.) A QLoRA model's 4-bit weights, held whole on every rank
    (`whole_4bit_weights`), come dequantized, as vLLM takes them (models.lora.dequantized_items)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __bool__(self) -> bool:
        return True

    def parts(self, bucket_bytes: int):
        from torch.distributed.tensor import DTensor

        part: dict[str, torch.Tensor] = {}
        size = 0
        items = dequantized_items(self.model) if is_4bit(self.model) else self.model.state_dict().items()
        for name, t in items:
            nbytes = t.numel() * t.element_size()  # a DTensor's numel is the full tensor's
            if part and size + nbytes > bucket_bytes:
                yield part
                part, size = {}, 0
            part[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
            size += nbytes
        if part:
            yield part


def full_state_dict(model: torch.nn.Module, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU (a collective: every rank must call it). With rank0_only,
    ranks other than 0 get {}."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    state = get_model_state_dict(model, options=opts)
    return {k: v.detach().cpu() for k, v in state.items()}


def save_full(model: torch.nn.Module, tokenizer, path: str | Path, rank: int) -> Path:
    """Gather the full weights and write an HF folder from rank 0 (a collective); a LoRA policy (a peft
    model) writes its adapter folder, as in one process."""
    state = full_state_dict(model, rank0_only=True)
    path = Path(path)
    if rank == 0 and hasattr(model, "peft_config"):
        save_hf_folder(model, tokenizer, path, state_dict=state)  # peft keeps the adapters' weights of it
    elif rank == 0:
        with torch.device("meta"):
            plain = plain_model_class(model.config).from_config(model.config)
        plain.load_state_dict(state, strict=True, assign=True)
        plain.tie_weights()  # assign=True unties a tied head; tie it again so the folder has one copy
        plain.generation_config = model.generation_config
        save_hf_folder(plain, tokenizer, path)
    dist.barrier()
    return path


def save_full_ema(model: torch.nn.Module, learner, tokenizer, path: str | Path, rank: int) -> Path | None:
    """The EMA of the sharded policy (--actor.ema_beta) as an HF folder from rank 0, or None without
    one (a collective): each rank swaps its EMA shards into the parameters, the full state is gathered
    and written, and the parameters are restored."""
    if learner.ema is None:
        return None
    with torch.no_grad():
        kept = [p.detach().clone() for p in learner.params]
        try:
            for p, e in zip(learner.params, learner.ema, strict=True):
                p.copy_(e)
            return save_full(model, tokenizer, path, rank)
        finally:
            for p, k in zip(learner.params, kept, strict=True):
                p.copy_(k)


def finish() -> None:
    """Leave the process group (end of a torchrun run), once every rank got here: a rank that tore its
    gloo connections down while rank 0 was still writing the final model could abort in gloo's threads
    ("terminate called without an active exception", seen once in CI)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


BF16_PARAMS = ("--actor.dtype bfloat16 under --fsdp.enable: float32 sharded parameters (the master weights) "
               "computing in bfloat16 with float32 gradient reduction (--fsdp.mixed_precision true)")
FP16_PARAMS = ("--actor.dtype float16 under --fsdp.enable: float32 sharded parameters (the master weights) "
               "computing in float16 (--actor.autocast float16) with float32 gradient reduction "
               "(--fsdp.mixed_precision true) and dynamic loss scaling (--train.loss_scale.*)")


def check_fsdp_settings(world_size: int, train_batch_size: int) -> None:
    """Refuse what the FSDP path does not support, naming the flag to change."""
    if train_batch_size % world_size:
        raise ConfigError(f"--train.batch_size {train_batch_size} must be a multiple of the number of torchrun "
                          f"processes or --fsdp.num_ranks ({world_size}): each takes an equal share of every "
                          "optimizer step")


def max_over_ranks(n: int) -> int:
    """The largest `n` over the ranks (a collective: every rank must call it)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
