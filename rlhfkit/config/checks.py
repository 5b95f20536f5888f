"""The checks every config's `validate` shares: a condition with its message, a value among the
accepted names, a batch size that its micro-batch size divides, a device name, a prompt template.
Each refuses with a one-line ConfigError naming the flag (docs/errors.md)."""

from __future__ import annotations

import math
import re

from rlhfkit.errors import ConfigError

DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def require(cond: bool, msg: str) -> None:
    """A ConfigError with `msg` unless `cond`."""
    if not cond:
        raise ConfigError(msg)


def one_of(flag: str, value, valid: tuple) -> None:
    """`value` of --`flag` is one of `valid`; else the error lists them."""
    require(value in valid, f"--{flag}: unknown value {value!r}; valid: {', '.join(map(str, valid))}")


def divisor_hint(total: int, wanted: int) -> int:
    """The divisor of `total` nearest to `wanted` (for error messages)."""
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return min(divisors, key=lambda d: (abs(d - wanted), d))


def check_micro_batches(section: str, batch_size: int, micro_batch_size: int) -> None:
    """--`section`.batch_size is a whole number of --`section`.micro_batch_size micro-batches."""
    require(batch_size % micro_batch_size == 0,
            f"--{section}.batch_size ({batch_size}) must be a multiple of --{section}.micro_batch_size "
            f"({micro_batch_size}); e.g. --{section}.micro_batch_size {divisor_hint(batch_size, micro_batch_size)}")


def check_device(flag: str, name: str) -> None:
    """`name` is auto, cpu, cuda or cuda:N (whether CUDA is there is checked where the models load)."""
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", name) is not None,
            f"{flag} {name!r}: not a device; valid: {DEVICE_NAMES}")


def check_precision(section: str, dtype: str, autocast: str | None) -> None:
    """A model's parameter dtype and autocast: no 16-bit dtype computing in the other one (float16
    parameters under bfloat16 autocast, or the reverse): their casts lose both dtypes' ranges or digits.
    float16 parameters with autocast auto are refused too: auto picks bfloat16 where it is fast (and then
    no loss scale)."""
    low = {"bfloat16", "float16"}
    mixed = dtype in low and autocast in low and dtype != autocast
    require(not mixed and not (dtype == "float16" and autocast == "auto"),
            f"--{section}.dtype {dtype} with --{section}.autocast {autocast}: pass --{section}.autocast {dtype} "
            "(or none: compute in the parameter dtype)")


def compute_dtype(dtype: str, autocast: str | None) -> str:
    """The dtype a forward computes its matmuls in: `autocast`, else the parameter `dtype`."""
    return autocast or dtype


def fsdp_param_dtype(mixed_precision: bool, dtype: str, autocast: str | None) -> str | None:
    """The dtype FSDP2 gathers its float32 shards in for forward and backward (--fsdp.mixed_precision):
    float16 where the forward computes in float16 (`compute_dtype`), else bfloat16; None without it."""
    if not mixed_precision:
        return None
    return "float16" if compute_dtype(dtype, autocast) == "float16" else "bfloat16"


def check_input_template(template: str | None, flag: str = "--data.input_template") -> None:
    """A format string with exactly one `{}` for the prompt (and literal braces doubled), or None."""
    if template is None:
        return
    try:
        template.format("")
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(f"{flag} {template!r} is not a format string with one '{{}}' for the prompt "
                          f"({type(exc).__name__}: {exc}); double any literal braces as '{{{{' and '}}}}'") from None
    require("{}" in template, f"{flag} {template!r} has no '{{}}' where the prompt goes (e.g. 'Question: {{}}')")


def check_keep_best(spec: str | None) -> None:
    """--ckpt.keep_best is METRIC, METRIC:max or METRIC:min."""
    metric = spec.rsplit(":", 1)[0] if spec and spec.endswith((":max", ":min")) else spec
    require(spec is None or bool(metric and metric.strip()),
            f"--ckpt.keep_best {spec!r}: give METRIC[:max|min], e.g. eval/accuracy or eval/loss:min")


def check_gpu_ask(flag: str, gpus: float | None) -> None:
    """A Ray actor's GPU ask (`flag`'s value): above one GPU only whole GPUs (Ray refuses other quantities
    with a traceback at the actor's creation)."""
    if gpus is not None:
        require(gpus <= 1 or gpus == int(gpus), f"{flag} {gpus:g}: Ray gives an actor more than one GPU only in "
                f"whole GPUs; ask for {int(gpus)} or {int(gpus) + 1}, or a fraction of one GPU to share it")


def check_qlora(ds) -> None:
    """QLoRA (--ds.load_in_4bit) trains LoRA adapters over a 4-bit base: it needs --ds.lora.rank > 0. Under
    --fsdp.enable every rank holds the 4-bit base whole and the adapters are sharded (distributed.fsdp)."""
    if not ds.load_in_4bit:
        return
    require(ds.lora.rank > 0, "--ds.load_in_4bit (QLoRA) trains LoRA adapters over the 4-bit base: give "
                              "--ds.lora.rank R (e.g. 16), or drop --ds.load_in_4bit")


def warmup_steps(steps: int, ratio: float, total_opt: int) -> int:
    """Warmup length in optimizer steps: `steps` where it is >= 0 (0: none), else `ratio` of `total_opt` rounded
    up, as OpenRLHF (`math.ceil(max_steps * lr_warmup_ratio)`) and transformers' Trainer round it.

    >>> warmup_steps(5, 0.5, 100), warmup_steps(0, 0.5, 100), warmup_steps(-1, 0.5, 100), warmup_steps(-1, 0.03, 40)
    (5, 0, 50, 2)
    """
    return steps if steps >= 0 else math.ceil(ratio * total_opt)
