"""Where and in what dtype forward passes run: the device a run's models sit on (`resolve_device`),
torch.autocast on that device's type (`autocast_ctx`), a model kept on the CPU between its passes
(`on_device`), gradient checkpointing, and the peak device memory of a stage (`peak_memory`)."""

from __future__ import annotations

import contextlib

import torch

from rlhfkit.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast_ctx(dtype_name: str | None, device_type: str = "cpu"):
    """torch.autocast(device_type, DTYPE) for "bfloat16" or "float16"; a no-op for None or "float32"."""
    if dtype_name in ("bfloat16", "float16"):
        return torch.autocast(device_type, dtype=DTYPES[dtype_name])
    return contextlib.nullcontext()


def vectors_to_float32(model: torch.nn.Module) -> int:
    """Put `model`'s 1-D parameters (norm weights, biases) back in float32; returns how many moved.

    For bf16 parameters computing under bf16 autocast: the matrices stay bf16 (held once per
    optimizer step, read by every matmul without a cast), while a norm weight near 1.0, whose bf16
    spacing is 2^-7, moves continuously as it does under autocast over float32 parameters instead of
    only when its float32 master crosses a rounding boundary (~130 Adam steps at lr 3e-5). The norms'
    float32 outputs are cast to bf16 by autocast at the next linear; without autocast a bf16 matmul
    would refuse them, so call this only where the forward runs under bf16 autocast."""
    moved = 0
    for p in model.parameters():
        if p.dim() < 2 and p.dtype in (torch.bfloat16, torch.float16):
            p.data = p.data.float()
            moved += 1
    return moved


def _float32_output(module, args, output):
    """Forward hook of `float32_residual`: the embedding's low-precision output as float32 under autocast
    (outside it a bf16 linear layer would refuse a float32 input: the output is left as it is)."""
    low = output.dtype in (torch.bfloat16, torch.float16)
    return output.float() if low and torch.is_autocast_enabled(output.device.type) else output


def float32_residual(model: torch.nn.Module) -> bool:
    """Keep the residual stream of `model` (bf16 parameters) in float32: its input embedding's output is
    upcast, so each layer adds its bf16 attention and MLP outputs to a float32 sum, as under autocast
    over float32 parameters (where the embedding reads float32 weights). In bf16, a residual of size
    ~1 absorbs any update below 2^-8 of it at every one of the layers' adds, forward and backward.
    The norms take the float32 sum (their weights are float32: `vectors_to_float32`) and the linear
    layers get its bf16 cast from autocast (outside autocast the hook leaves the embedding's output
    alone). Returns whether the hook was added (False: already there or no input embedding)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embed is None or getattr(embed, "_rlhfkit_float32_output", False):
        return False
    embed.register_forward_hook(_float32_output)
    embed._rlhfkit_float32_output = True
    return True


def is_float32_residual_hook(hook) -> bool:
    """Whether `hook` is the forward hook `float32_residual` adds (other hooks change a forward's ops)."""
    return hook is _float32_output


def resolve_device(name: str, flag: str = "--actor.device") -> torch.device:
    """auto -> cuda when torch sees a CUDA device, else cpu; cpu, cuda, cuda:N as named. A CUDA
    device that is not there is a ConfigError naming `flag` (raised before any model loads)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} {name}: torch sees no CUDA device here (torch {torch.__version__}); "
                          f"use {flag} cpu (or auto), or install a CUDA build of torch")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"{flag} {name}: only {count} CUDA device(s) here (cuda:0 to cuda:{count - 1})")
    return device


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of `model`'s first parameter (the CPU for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def on_device(model: torch.nn.Module | None, device: torch.device | str | None):
    """Move `model` to `device` for the block and back to the CPU after it (an offloaded model:
    its weights use device memory only during its own passes). None, or the CPU: nothing moves."""
    device = None if device is None else torch.device(device)
    if model is None or device is None or device.type == "cpu":
        yield model
        return
    model.to(device)
    try:
        yield model
    finally:
        model.to("cpu")


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' non-reentrant gradient checkpointing on `model` (a peft model: on its base);
    it acts in training mode only, so the no-grad passes of rollout and experience are unchanged."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(target, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{type(target).__name__} does not support gradient checkpointing; drop "
                          "--actor.gradient_checkpointing_enable / --model.gradient_checkpointing_enable")
    kwargs = {"use_reentrant": False}
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.2x names it so
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_dropout(model: torch.nn.Module) -> int:
    """Turn off `model`'s dropout for training: every `nn.Dropout`-like module gets p = 0, and every float
    attribute of a module whose name says dropout (`attention_dropout`, `residual_dropout`: the rates that
    modeling code passes to functional dropout in training mode) becomes 0.0. The config is left as it is
    (a saved model keeps its rates). Returns how many rates were nonzero."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p != 0
            module.p = 0.0
            continue
        for name, value in vars(module).items():
            if "dropout" in name and type(value) is float:
                changed += value != 0
                setattr(module, name, 0.0)
    return changed


@contextlib.contextmanager
def peak_memory(device: torch.device, out: dict[str, float], key: str):
    """On a CUDA `device`, out[key] = the peak memory allocated during the block (GiB; the larger
    one when the block runs again); elsewhere nothing is measured."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.reset_peak_memory_stats(device)
    yield
    out[key] = max(out.get(key, 0.0), torch.cuda.max_memory_allocated(device) / 1024**3)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (built on the CPU) on `device`. To CUDA from pinned memory without blocking: the host
    does not wait for the copy (nor for the kernels queued before it), the copy is ordered on the
    stream before the kernels that read it, and the pinned block is kept until it is done."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a CUDA `device` (a timer's boundary: CUDA runs asynchronously, so
    without it a stage's time is the time to queue its kernels); nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_matmul_speedup(size: int = 256, repeats: int = 8) -> float:
    """How many times faster a bf16 matmul runs than a float32 one on this CPU (a ~0.1 s probe).
    CPUs without native bf16 (no AVX512-BF16 / AMX) run it 10-100x slower than float32."""
    import time

    a, b = torch.randn(size, size), torch.randn(size, size)

    def seconds(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeats):
            x @ y
        return time.perf_counter() - t0

    return seconds(a, b) / max(seconds(a.bfloat16(), b.bfloat16()), 1e-9)


def native_bf16(device: torch.device) -> bool:
    """Whether the CUDA device `device` computes in bf16 natively (compute capability 8.0 on, or ROCm).
    `torch.cuda.is_bf16_supported()` also says yes where bf16 is only emulated (T4, V100: sm 7.x), far slower."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


def _gpu(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)}, compute capability {major}.{minor}"


def choose_autocast(device: torch.device, fsdp: bool = False) -> tuple[str | None, str]:
    """--actor.autocast auto on `device`: ("bfloat16", "float16" or None, one line saying what was chosen and
    why). CUDA: bfloat16 where the GPU computes in it natively, else float16 with loss scaling (under FSDP too:
    float32 shards computing in float16); the CPU: bfloat16 where a bf16 matmul beats float32's. `fsdp` only
    words the line."""
    if device.type == "cuda":
        if native_bf16(device):
            return "bfloat16", f"--actor.autocast auto: bfloat16 ({torch.cuda.get_device_name(device)} supports it)"
        sharded = ", over FSDP's float32 shards" if fsdp else ""
        return "float16", (f"--actor.autocast auto: float16 with dynamic loss scaling{sharded}, --train.loss_scale.* "
                           f"({_gpu(device)}: no native bf16)")
    speedup = bf16_matmul_speedup()
    if speedup > 1.0:
        return "bfloat16", f"--actor.autocast auto: bfloat16 (bf16 matmuls run {speedup:.1f}x float32's on this CPU)"
    return None, (f"--actor.autocast auto: float32 (bf16 matmuls run {1 / max(speedup, 1e-9):.1f}x slower than "
                  "float32 on this CPU)")


def emulated_bf16_warning(device: torch.device, dtype: str, autocast: str | None) -> str | None:
    """One line when a run computes in bf16 (--actor.autocast bfloat16, the default, or --actor.dtype bfloat16)
    on a CUDA GPU that only emulates it (T4, V100), else None."""
    if device.type != "cuda" or "bfloat16" not in (dtype, autocast) or native_bf16(device):
        return None
    return (f"{_gpu(device)} has no native bf16: torch emulates it, many times slower than float16 (and vLLM refuses "
            "it); use --actor.autocast auto (float16 with loss scaling here) or float16, and --actor.dtype float32")
