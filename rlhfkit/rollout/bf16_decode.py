"""The HF engine's forwards (prefills and decode steps) over a bf16 copy of a Llama-family model's
weights (CPU, bf16 autocast).

A decode step of a small batch reads every weight once and does little arithmetic with it, so it
is bound by memory and by the per-op cost of the model's forward (half of a SmolLM2 decode step at
16 rows on a 2-core CPU). These forwards compute what transformers' forward computes under bf16
autocast (the module's rotary embedding and causal mask, the engine's grouped one-token attention;
residual adds in the dtype of the embedding's output) in fewer ops: the RMSNorms by torch's
`rms_norm` (the same float32 arithmetic), q and k rotated together with one roll instead of two
rotate_halfs (each a slice, negation and concatenation), a decode step's mask made once per step as
an additive float32 mask instead of inverted and filled in every layer (the same probabilities: a
masked score's exp is 0 either way). Their linear maps read a copy of the weights made once per
weight version:

- in bf16, so no weight is cast at a step (autocast's cache of casts lives only as long as one
  autocast region) and a step reads 2 bytes per weight;
- with q/k/v concatenated into one matrix and gate/up into another: 4 matmuls per layer instead of
  7, and the normed activations cast to bf16 twice per layer instead of 5 times (autocast casts a
  linear's input at every call);
- packed for oneDNN's bf16 kernels (`torch.ops.mkldnn._reorder_linear_weight`) where torch has
  them: a plain bf16 matmul re-lays the weight out at every call, which at a few rows costs more
  than the product. The packed product gave the same numbers as `F.linear` on the bf16 weight
  (tested); products of other shapes (a stacked matrix, another row count) may round differently in
  the last bf16 bit, so a near-tie may sample another token than the model's forward would.

The copy is made when a generation starts and freed when it ends (the trainer's update does not hold
it); between the slices of a partial generation it is rebuilt when any parameter changed (an
optimizer step, a loaded state dict: each in-place write bumps a tensor's version counter). It
costs the model's size in bf16 (SmolLM2-135M: 270 MB) and ~55 ms to make on a 2-core CPU (up to ~180 ms
where its pages are faulted in anew: --train.keep_freed_memory, models.host).

Taken only where it gives the model's forward: a Llama or Qwen2 causal LM (exactly those classes:
no LoRA wrapper, no hooks), SiLU MLP without bias, plain linear layers, every layer full attention
in a growing KV cache, the attention SDPA's (which the engine swaps for its one-token attention
on the CPU). Anything else decodes through the model's forward.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhfkit.models.precision import is_float32_residual_hook
from rlhfkit.rollout.decode_attention import DECODE_ATTENTION, cpu_decode_attention

# Model classes whose decoder layers are Llama's (q/k/v/o, gate/up/down, two RMSNorms, RoPE)
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def packed_kernels() -> bool:
    """Whether torch's oneDNN bf16 linear with a packed weight is there (x86 CPUs with AVX-512 BF16 / AMX)."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise") and bool(mkldnn._is_mkldnn_bf16_supported()))


@dataclass
class _Linear:
    """One linear map of the copy: the bf16 weight (packed or plain) and its bf16 bias or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _linear(mods: list[torch.nn.Module], packed: bool) -> _Linear:
    """The rows of `mods`' weights stacked (and their biases) as one bf16 map."""
    weight = torch.empty(sum(m.weight.shape[0] for m in mods), mods[0].weight.shape[1], dtype=torch.bfloat16,
                         device=mods[0].weight.device)
    start = 0
    for m in mods:  # cast while copying: one pass over each weight
        weight[start : start + m.weight.shape[0]].copy_(m.weight.detach())
        start += m.weight.shape[0]
    biases = [m.bias for m in mods]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases]).to(torch.bfloat16)
    if packed:
        weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    return _Linear(weight, bias, packed)


def bf16_decode_support(model: torch.nn.Module) -> str | None:
    """Why `model` cannot take the bf16 decode step, or None when it can."""
    if type(model).__name__ not in SUPPORTED:
        return f"{type(model).__name__} is not one of {', '.join(SUPPORTED)}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "mlp_bias", False):
        return "its MLP is not a bias-free SiLU one"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "some layers use sliding-window attention"
    if getattr(config, "use_sliding_window", False) or getattr(config, "_attn_implementation", None) not in (
            "sdpa", DECODE_ATTENTION):
        return "its attention is not SDPA over full attention"
    head = model.get_output_embeddings()
    linears = [head] + [m for layer in model.model.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    plain = all(type(m) is torch.nn.Linear and m.weight.is_floating_point() for m in linears)
    if not plain or head.bias is not None:
        return "its linear layers are not plain nn.Linear (adapters, quantised weights) or the head has a bias"
    if any(m._forward_pre_hooks or any(not is_float32_residual_hook(h) for h in m._forward_hooks.values())
           for m in model.modules()):
        return "it has forward hooks"
    return None


class Bf16Decoder:
    """The bf16 forward of one model for the HF engine (module docstring): `forward` is called with the
    arguments of the engine's forwards over a growing cache (prefills and decode steps)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.packed = packed_kernels()
        self.causal_mask = sys.modules[type(model.model).__module__].create_causal_mask  # the model's own
        self.stamp: tuple | None = None
        self.layers: list[tuple[_Linear, _Linear, _Linear, _Linear]] = []
        self.head: _Linear | None = None

    @property
    def ready(self) -> bool:
        """Whether a copy is built (between `refresh` and `release`)."""
        return self.head is not None

    def release(self) -> None:
        """Free the copy (the next `refresh` builds it again)."""
        self.layers, self.head, self.stamp = [], None, None

    def _stamp(self) -> tuple:
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def refresh(self) -> None:
        """Build the copy again if a parameter changed since it was built (or it never was)."""
        stamp = self._stamp()
        if stamp == self.stamp:
            return
        self.release()  # the old copy freed before the new one is made
        with torch.no_grad():
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                groups = ([a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [m.gate_proj, m.up_proj], [m.down_proj])
                self.layers.append(tuple(_linear(mods, self.packed) for mods in groups))
            self.head = _linear([self.model.get_output_embeddings()], self.packed)
        self.stamp = stamp

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                cache) -> torch.Tensor:
        """Float32 logits [B, V] of the last position of `input_ids` [B, T] (a prefill or one decode
        step), their keys and values written into `cache` (growing layers), under the caller's bf16
        autocast. The mask of a decode step is the 2-D one as an additive float32 mask made once per
        step (what transformers' SDPA mask is for one query over cached tokens, as 0 / the float32
        minimum); a prefill's is the one the model's forward would build."""
        backbone = self.model.model
        h = backbone.embed_tokens(input_ids)
        batch, width = input_ids.shape
        if width == 1:
            keep = attention_mask.bool()[:, None, None, :]
            mask = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device).masked_fill_(
                ~keep, torch.finfo(torch.float32).min)
        else:
            mask = self.causal_mask(config=backbone.config, inputs_embeds=h, attention_mask=attention_mask,
                                    past_key_values=cache, position_ids=position_ids)
        cos, sin = backbone.rotary_emb(h, position_ids)
        cos, sin = cos.unsqueeze(1), _rotation_signs(sin).unsqueeze(1)  # [B, 1, T, D]: broadcast over the heads
        heads, kv_heads = backbone.config.num_attention_heads, backbone.config.num_key_value_heads
        for layer, (qkv, o, gate_up, down), cache_layer in zip(backbone.layers, self.layers, cache.layers,
                                                                strict=True):
            attn = layer.self_attn
            d = attn.head_dim
            x = qkv(_norm(layer.input_layernorm, h).to(torch.bfloat16))
            # q and k rotated together: q * cos + rotate_half(q) * sin, rotate_half(t) = cat(-t2, t1) = roll(t) * signs
            qk = x[..., : (heads + kv_heads) * d].view(batch, width, heads + kv_heads, d).transpose(1, 2)
            qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
            q, k = qk.split([heads, kv_heads], dim=1)
            v = x[..., (heads + kv_heads) * d :].view(batch, width, kv_heads, d).transpose(1, 2)
            k, v = cache_layer.update(k, v)
            out, _ = cpu_decode_attention(attn, q, k, v, mask, scaling=attn.scaling)
            h = h + o(out.reshape(batch, width, -1))
            g, u = gate_up(_norm(layer.post_attention_layernorm, h).to(torch.bfloat16)).chunk(2, dim=-1)
            h = h + down(layer.mlp.act_fn(g) * u)
        h = _norm(backbone.norm, h[:, -1])
        return self.head(h.to(torch.bfloat16)).float()


def _rotation_signs(sin: torch.Tensor) -> torch.Tensor:
    """`sin` [..., D] with its first half negated: rotate_half(t) * sin = roll(t, D/2) * this, exactly
    ((-a) * b = a * (-b) in floating point), in one roll where rotate_half slices, negates and concatenates."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _norm(norm: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """`norm(h)` of a Llama / Qwen2 RMSNorm: torch's fused `rms_norm` when its weight has `h`'s dtype (the
    same float32 numbers: the mean of squares, rsqrt(+ eps), both products), else the module."""
    weight = norm.weight
    if weight.dtype != h.dtype or not hasattr(norm, "variance_epsilon"):
        return norm(h)
    return torch.rms_norm(h, (h.shape[-1],), weight, norm.variance_epsilon)
