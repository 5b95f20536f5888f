"""Logprob and entropy forward over any batch layout, computing logits only where needed.

The backbone runs over the batch's rows (padded `TokenBatch`, packed `PackedBatch` or
`SharedPrefixBatch`, whose prompts are computed once per row), but the LM head (the [*, V]
matmul, the largest activation in a small model) runs only at the positions that predict
response tokens: `batch.hidden_index()` (for a padded row, position P_b + j - 1 predicts
response token j), and only at real ones (`head_positions`: not at the padding after a response
shorter than the micro-batch's longest).

Each fast path is taken only where it gives the model's own numbers; elsewhere the plain path
runs, with a note logged once (logger "rlhfkit", INFO):
- backbone + LM head at the response positions: needs logits = head(last hidden state), with no
  soft-capping or scale after the head (known config fields, then a probe of the model's own
  forward on a few tokens, once per model). Else: the model's forward, then a gather.
- the fused head (core.lm_head): a bias-free nn.Linear head without hooks. Else: the head module.
- packed and shared-prefix rows: need position ids and a mask from transformers' masking_utils,
  attention layers only (no recurrent or convolution layers, no ALiBi), and for the shared prefix's
  4-D mask eager or SDPA attention and sliding windows no narrower than the rows. Else: the same
  samples as padded rows (`batch.padded()`). On CPU, 4-D-masked rows of at most EAGER_ROW_TOKENS
  run eager attention, wider ones SDPA (`attention_for`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import sys

import torch

from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import logprobs_and_entropy
from rlhfkit.models.loading import position_offset
from rlhfkit.models.precision import to_device
from rlhfkit.models.vision import vision_kwargs, vision_split

log = logging.getLogger("rlhfkit")

# Config fields that mean the LM head is not a plain linear map of the last hidden state.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                     "output_multiplier", "lm_head_multiplier")
_SPLIT_VERDICT = "_rlhfkit_split_head"  # a model's probe result, kept on the model


@functools.cache
def note_once(message: str) -> None:
    """Log `message` once per process: a fast path that a model cannot take (the plain one runs)."""
    log.info(message)


def decoder_backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder (a transformers model with a config) inside a causal LM, else None. `get_decoder()`
    first; where it gives the LM itself (Llama 4's text model: its base_model_prefix names no attribute)
    or a module without a config (ModernBERT-decoder's LM head is called `decoder`), the module its
    base_model_prefix names, then its `model` attribute; never `model` itself."""
    get_decoder = getattr(model, "get_decoder", None)
    prefix = getattr(model, "base_model_prefix", "") or "model"
    candidates = (get_decoder() if get_decoder is not None else None, getattr(model, prefix, None),
                  getattr(model, "model", None))
    for found in candidates:
        if isinstance(found, torch.nn.Module) and found is not model and hasattr(found, "config"):
            return found
    return None


def split_backbone(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, lm_head) of a decoder-only LM whose logits are `lm_head(last_hidden)`, else None."""
    get_head = getattr(model, "get_output_embeddings", None)
    if not hasattr(model, "get_decoder") or get_head is None:
        return None
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1.0):
            note_once(f"{type(model).__name__}: {name}={getattr(config, name)} transforms the logits after the LM "
                      "head; logprobs come from the model's full forward")
            return None
    backbone, head = decoder_backbone(model), get_head()
    if backbone is None or head is None:
        return None
    verdict = vars(model).get(_SPLIT_VERDICT)
    if verdict is None:
        verdict = vars(model)[_SPLIT_VERDICT] = _head_of_backbone_is_forward(model, backbone, head)
    if not verdict:
        note_once(f"{type(model).__name__}: its logits are not lm_head(last hidden state); logprobs come from "
                  "the model's full forward")
        return None
    return backbone, head


@torch.no_grad()
def _head_of_backbone_is_forward(model: torch.nn.Module, backbone: torch.nn.Module, head: torch.nn.Module) -> bool:
    """Whether head(backbone(x)) gives model(x).logits on a few tokens (in eval mode: no dropout).
    The same modules run the same ops, so any step the model's forward adds after its head shows."""
    vocab = getattr(head, "out_features", None) or model.config.vocab_size
    ids = ((torch.arange(6) * 7 + 3) % vocab).unsqueeze(0).to(next(model.parameters()).device)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        full = model(input_ids=ids, use_cache=False).logits.float()
        split = head(backbone(input_ids=ids, use_cache=False).last_hidden_state).float()
    except Exception:  # noqa: BLE001 - an unusual forward signature or output: take the plain path
        return False
    finally:
        for m, training in modes:
            m.training = training
    scale = float(full.abs().max()) or 1.0
    return full.shape == split.shape and bool(torch.allclose(split, full, rtol=1e-5, atol=1e-6 * scale))


def transformers_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside peft and torch.compile wrappers (whose forwards take **kwargs)."""
    for _ in range(4):
        if hasattr(model, "get_base_model"):  # peft
            model = model.get_base_model()
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            break
    return model


def forward_parameters(model: torch.nn.Module):
    """The named parameters of the forward of `model`'s transformers model (see `transformers_model`)."""
    return inspect.signature(transformers_model(model).forward).parameters


def _plain_linear(head: torch.nn.Module | None) -> bool:
    """An LM head the fused logprob path may bypass: a bias-free nn.Linear with no hooks (FSDP
    gathers a sharded head's weight in a forward hook; LoRA and other wrappers are not Linear)."""
    return (type(head) is torch.nn.Linear and head.bias is None and not head._forward_pre_hooks
            and not head._forward_hooks)


def model_inputs(model: torch.nn.Module, batch) -> dict:
    """Keyword arguments of the forward over any batch layout: a padded `TokenBatch` (2-D mask),
    a one-row `PackedBatch` (position ids, no mask) or a `SharedPrefixBatch` (position ids and a
    4-D bool mask, handed to the attention as it is; converted to an additive float mask for
    eager attention, which adds it to the scores)."""
    device = next(model.parameters()).device  # batches are built on the CPU; the model may sit on a GPU
    mask = batch.attention_mask if batch.attention_mask is None else to_device(batch.attention_mask, device)
    inputs = {"input_ids": to_device(batch.input_ids, device), "attention_mask": mask, "use_cache": False}
    if getattr(batch, "position_ids", None) is not None:
        inputs["position_ids"] = to_device(batch.position_ids + position_offset(model), device)  # (RoBERTa's)
    if getattr(batch, "vision", None) is not None:
        inputs.update(vision_kwargs(model, batch, device))
    if mask is not None and mask.dim() == 4 and getattr(model.config, "_attn_implementation", "") == "eager":
        dtype = next(model.parameters()).dtype
        inputs["attention_mask"] = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return inputs


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str):
    """Inside, `model` runs its attention as `name` (a transformers attention implementation, e.g.
    "eager"); the one it had is restored after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


# Widest 4-D-masked row that runs eager attention on CPU (the trainer's default row, SHARED_ROW_TOKENS);
# wider rows keep SDPA (see attention_for).
EAGER_ROW_TOKENS = 512


def parameter_device_type(model: torch.nn.Module) -> str:
    """The device type ("cpu", "cuda", ...) of `model`'s parameters: where its forward runs (the
    batches are built on the CPU whatever the model's device)."""
    param = next(model.parameters(), None)
    return "cpu" if param is None else param.device.type


def attention_for(model: torch.nn.Module, batch):
    """Eager attention for a 4-D-masked (shared-prefix) batch on CPU with rows of at most
    EAGER_ROW_TOKENS: with a dense custom mask over short rows, torch's CPU SDPA kernel was slower
    than eager attention (forward + backward of SmolLM2 on 32 samples: 6.2 s eager vs 7.3 s SDPA,
    1 thread; rows of 370-500 tokens: 4-17% faster eager), but eager's [rows, heads, L, L] scores
    (float32, and their softmax, kept for the backward) grow with L squared: rows of ~1,000 tokens
    ran 2.3x faster under SDPA (bench/long_responses.py, docs/performance.md).
    Elsewhere unchanged, and also under gradient checkpointing: the backward recomputes each layer
    after the swap is undone, so the forward must run the attention the recomputation will.
    "On CPU" is where the model's parameters are (`parameter_device_type`), never the mask's device:
    the mask is always built on the CPU, and on a GPU SDPA's fused kernels are the fast path."""
    config = getattr(model, "config", None)
    mask = batch.attention_mask
    checkpointing = model.training and activation_checkpointing(model)
    swap = (config is not None and getattr(config, "_attn_implementation", None) == "sdpa" and mask is not None
            and mask.dim() == 4 and mask.shape[-1] <= EAGER_ROW_TOKENS and not checkpointing
            and parameter_device_type(model) == "cpu")
    return attention_implementation(model, "eager") if swap else contextlib.nullcontext()


def activation_checkpointing(model: torch.nn.Module) -> bool:
    """Whether gradient checkpointing is on: transformers >= 5.23 names it `is_activation_checkpointing`
    (its old name `is_gradient_checkpointing` warns there), earlier releases only the old name."""
    on = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if on is None else on)


def runnable_layout(model: torch.nn.Module, batch):
    """`batch` itself, or the same samples as padded rows (`batch.padded()`) when `model` cannot
    compute its packed or shared-prefix layout exactly (see `layout_blocker`; noted once)."""
    if getattr(batch, "position_ids", None) is None:  # a padded TokenBatch
        return batch
    reason = layout_blocker(model, batch)
    if reason is None:
        return batch
    note_once(f"{type(model).__name__}: {reason}; its {type(batch).__name__} runs as padded rows (same numbers, "
              "more compute)")
    return batch.padded()


_ATTENTION_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")  # transformers' KV-cache layers of attention


def layout_blocker(model: torch.nn.Module, batch) -> str | None:
    """Why `model` cannot run a packed (`PackedBatch`) or shared-prefix (`SharedPrefixBatch`, a
    4-D mask) layout exactly, or None when it can. Both need the positions from `position_ids`
    and the mask from transformers' masking_utils (which separates packed samples by their
    positions and hands a 4-D mask to the attention as it is), and attention as the only mixing
    across tokens: a recurrent or convolution layer, or ALiBi biases built from a 2-D mask, would
    carry one sample into the next. The 4-D mask replaces the model's own causal mask in every
    layer, so it also needs eager or SDPA attention and no sliding window narrower than the row."""
    config = getattr(model, "config", None)
    if config is None:
        return "it has no config"
    if "position_ids" not in forward_parameters(model):
        return "its forward takes no position_ids"
    if _masking_module(transformers_model(model)) is None:
        return "its attention mask is not built by transformers' masking_utils"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "alibi", False) or getattr(text, "position_embedding_type", None) == "alibi":
        return "its ALiBi biases are built from a 2-D mask"
    if getattr(text, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    try:
        from transformers import DynamicCache

        layers = DynamicCache(config=text).layers
    except Exception as e:  # noqa: BLE001 - a config transformers cannot lay out a cache for
        return f"transformers lays out no cache for it ({type(e).__name__})"
    other = sorted({type(layer).__name__ for layer in layers} - set(_ATTENTION_LAYERS))
    if other:
        return f"it has layers other than attention ({', '.join(other)})"
    if batch.attention_mask is None:  # packed: masking_utils separates the samples (and applies windows) by position
        if not _masks_see_positions(transformers_model(model)):
            return "its causal mask is built without position_ids (packed samples would attend to each other)"
        return None
    attn = getattr(config, "_attn_implementation", None)
    if attn not in ("eager", "sdpa"):
        return f"its {attn} attention does not take a 4-D mask"
    windows = [layer.sliding_window for layer in layers if hasattr(layer, "sliding_window")]
    width = batch.input_ids.shape[-1]
    if windows and min(windows) < width:
        return f"its sliding window ({min(windows)} tokens) is narrower than a shared-prefix row"
    return None


def _masking_module(model: torch.nn.Module) -> str | None:
    """The name of the model's modeling file when it builds its masks with masking_utils.create_causal_mask
    (looked up along the class's bases: FSDP and other wrappers subclass the model's class), else None."""
    for cls in type(model).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is not None and "create_causal_mask" in vars(module):
            return module.__name__
    return None


def _masks_see_positions(model: torch.nn.Module) -> bool:
    """Whether every `create_causal_mask` call of the model's modeling file is given the position ids
    (directly, or in a `**` dict of keyword arguments that names them): masking_utils finds packed
    samples from them; OPT, Falcon, BioGPT and XGLM leave them out, so their mask is one causal
    triangle over the whole row. A file whose source cannot be read counts as not giving them."""
    module = _masking_module(model)
    return module is not None and _calls_pass_positions(module)


# The masking_utils builders that separate packed samples by position (a model may call one through a
# variable: `mask_function = create_causal_mask if ... else create_sliding_window_causal_mask`).
_MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask")


@functools.cache
def _calls_pass_positions(module_name: str) -> bool:
    try:
        source = inspect.getsource(sys.modules[module_name])
    except (OSError, TypeError):
        return False
    builders = "|".join(_MASK_BUILDERS)
    names = set(_MASK_BUILDERS) | set(re.findall(rf"(\w+)\s*=\s*(?:{builders})\b", source))
    calls = [m.end() for m in re.finditer(rf"(?<![\w.])(?:{'|'.join(names)})\(", source)
             if not source[: m.start()].endswith("def ")]
    for start in calls:
        depth, end = 1, start
        while depth and end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        args = source[start:end]
        if "position_ids" not in args and not ("**" in args and '"position_ids":' in source):
            return False
    return bool(calls)


def response_hidden(hidden: torch.Tensor, batch, where: torch.Tensor | None = None) -> torch.Tensor:
    """Outputs [B, R, H] at the positions that predict each response token, from the forward's
    [rows, L, H] outputs of any batch layout (`batch.hidden_index()` indexes the flattened rows);
    with `where` (bool [B, R]) only those entries: [N, H], N = where.sum(), in row-major order."""
    index = batch.hidden_index()
    if where is not None:
        index = index[where.to(index.device)]  # a batch moved to a GPU in part must not fail here
    return hidden.reshape(-1, hidden.shape[-1])[index.to(hidden.device)]


def head_positions(batch) -> torch.Tensor:
    """bool [B, R]: the entries the LM head runs at: the response tokens (`response_mask`), not the
    padding after a response that finished before the micro-batch's longest."""
    return batch.response_mask


def _scatter(values: torch.Tensor | None, where: torch.Tensor) -> torch.Tensor | None:
    """[N] values at the True entries of `where` [B, R] (row-major) -> [B, R], zeros elsewhere."""
    if values is None:
        return None
    return values.new_zeros(where.shape).masked_scatter(where.to(values.device), values)


def head_split(model: torch.nn.Module, batch):
    """`split_backbone(model)`; for a batch with images, the VLM's base model (it takes the pixel
    values) and its head (models.vision.vision_split)."""
    if getattr(batch, "vision", None) is not None:
        return vision_split(transformers_model(model))
    return split_backbone(model)


def response_logits(model: torch.nn.Module, batch, where: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, R, V] that predict each response token of `batch` (a TokenBatch, or a
    data.packing PackedBatch / SharedPrefixBatch); with `where` (bool [B, R]) only those: [N, V].

    Llama-like models run backbone + LM head at the gathered positions only; any other
    model falls back to a full forward and a gather.
    """
    parts = head_split(model, batch)
    if parts is None:
        batch = runnable_layout(model, batch)
        with attention_for(model, batch):
            return response_hidden(model(**model_inputs(model, batch)).logits, batch, where)
    backbone, head = parts
    return head(backbone_response_hidden(model, backbone, batch, where))


def backbone_response_hidden(model: torch.nn.Module, backbone: torch.nn.Module, batch,
                             where: torch.Tensor | None = None) -> torch.Tensor:
    """The backbone's last hidden states [B, R, H] at the positions that predict response tokens
    (`model` holds the config: the LM itself, or the backbone for a critic); with `where` [N, H]."""
    batch = runnable_layout(model, batch)
    with attention_for(model, batch):
        return response_hidden(backbone(**model_inputs(model, batch)).last_hidden_state, batch, where)


def response_logprobs(
    model: torch.nn.Module,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each response token under `model` at `temperature`, and optionally entropy.

    Args:
      batch: a `TokenBatch` (input_ids [B, L], response_ids [B, R], ...) or a data.packing layout.
      temperature: logits are divided by it before the softmax (must be > 0); use the rollout
        temperature so the result matches the engine's logprobs.
      entropy_grad: False computes the entropy without a graph (for a metric).
    Returns:
      logp [B, R] float32 and entropy [B, R] float32 (or None). Differentiable. Entries where
      `batch.response_mask` is False are 0: the LM head and the vocabulary work run only at the
      response tokens (`head_positions`), not at the padding of responses shorter than the longest.
    """
    where = head_positions(batch)
    labels = batch.response_ids[where]
    parts = head_split(model, batch)
    head = parts[1] if parts is not None else None
    if head is not None and type(head) is torch.nn.Linear and head.bias is not None:
        note_once(f"{type(model).__name__}: its LM head has a bias; logprobs run the head module, not the fused head")
    if _plain_linear(head) and not (with_entropy and entropy_grad):
        # LM head, log-softmax and entropy fused (core.losses.linear_logprobs_and_entropy): the
        # [N, V] logits never kept, the backward written by hand.
        hidden = backbone_response_hidden(model, parts[0], batch, where)
        logp, entropy = linear_logprobs_and_entropy(hidden, head.weight, labels.to(hidden.device), temperature,
                                                    with_entropy=with_entropy)
    else:
        logits = response_logits(model, batch, where)
        logp, entropy = logprobs_and_entropy(logits, labels.to(logits.device), temperature,
                                             with_entropy=with_entropy, entropy_grad=entropy_grad)
    return _scatter(logp, where), _scatter(entropy, where)
