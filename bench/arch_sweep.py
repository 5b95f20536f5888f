"""Sweep every causal-LM architecture of the installed transformers through rlhfkit's architecture checks.

For each model type of `transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, build
its config with tiny sizes (hidden 64, 2 layers, 4 heads, 2 key/value heads, intermediate 128, the tiny
tokenizer's vocabulary, 512 positions; each size set under whichever of its usual names the config has),
then run the checks of `tests/unit/models/test_architectures.py` on it (its own functions): the HF
engine's greedy rollout is `model.generate`'s, sampled rollout logprobs are the trainer's forward and
transformers' own, the shared-prefix and packed layouts (and rows filled by length) give the padded
layout's logprobs and gradients, critic values match across layouts, one PPO step with critic and
reference and one SFT step run. One line per architecture: `ok`, the first check that failed, or
`skipped` and why.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/arch_sweep.py [--only llama,opt] [--out results.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import re
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "max_positions": 512}
# Each size under the names configs give it (the first ones the config has are set).
NAMES = {
    "hidden": ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "n_embed", "model_dim", "word_embed_proj_dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_decoder_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_head_kv"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff", "decoder_ffn_dim",
                     "inner_hidden_size", "ffn_inner_hidden_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                      "context_length", "max_sequence_length"),
}
MOE = {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "moe_num_experts": 4, "moe_topk": 2,
       "top_k": 2, "num_selected_experts": 2, "expert_intermediate_size": 32}
HEAD_DIMS = {"head_dim": 16, "rotary_dim": 8, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
             "kv_lora_rank": 16, "q_lora_rank": 32, "qk_head_dim": 16}
SUB_CONFIGS = ("vision_config", "audio_config", "text_config", "encoder_config", "decoder_config", "speech_config",
               "vq_config", "depth_decoder_config")


def load_checks():
    spec = importlib.util.spec_from_file_location("arch_checks", ROOT / "tests/unit/models/test_architectures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_kwargs(config_cls) -> dict:
    """Tiny sizes under the names `config_cls`'s default instance has, dropout off, small MoE."""
    default = config_cls()
    if getattr(default, "is_encoder_decoder", False):
        raise SkipArch("encoder-decoder")
    subs = [n for n in SUB_CONFIGS if getattr(default, n, None) is not None]
    if subs:
        raise SkipArch(f"composite config ({', '.join(subs)}): a multimodal/speech model")
    kwargs = {}
    for size, names in NAMES.items():
        for name in names:
            if hasattr(default, name) and not isinstance(getattr(default, name), (list, dict)):
                kwargs[name] = SIZES[size]
                if size != "hidden":
                    break  # one name per size (several hidden names are set: e.g. OPT's projection width)
    for name, value in HEAD_DIMS.items():  # per-head widths (rotary, latent attention), where the config has them
        if isinstance(getattr(default, name, None), int) and not settable_only_by_property(config_cls, name):
            kwargs[name] = value
    if "qk_rope_head_dim" in kwargs and "head_dim" in kwargs:
        kwargs["head_dim"] = kwargs["qk_rope_head_dim"]  # DeepSeek's head_dim is its rotary part
    if "kv_lora_rank" in kwargs and "num_key_value_heads" in kwargs:
        kwargs["num_key_value_heads"] = SIZES["heads"]  # latent attention: a key/value head per query head
    if hasattr(default, "is_decoder"):
        kwargs["is_decoder"] = True  # encoder families (BERT, RoBERTa, ...) as causal LMs
    if isinstance(getattr(default, "causal", None), bool):
        kwargs["causal"] = True  # XLM's causal attention
    for name, value in vars(default).items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            kwargs[name] = 0.0
    kwargs.update({k: v for k, v in MOE.items() if isinstance(getattr(default, k, None), int)})
    types = getattr(default, "layer_types", None)
    if types is not None and not settable_only_by_property(config_cls, "layer_types"):
        kwargs["layer_types"] = [types[0], next((t for t in types if t != types[0]), types[0])]  # keep its mix
    return kwargs


def settable_only_by_property(config_cls, name) -> bool:
    return isinstance(getattr(config_cls, name, None), property)


class SkipArch(Exception):
    pass


def build(model_type: str):
    """The tiny model of `model_type` (the first of seeds 0-4 whose greedy decode of the first prompt runs
    4 tokens before its EOS: the greedy check takes its 4th token as a stop token) and the tokenizer."""
    for seed in range(5):
        model, tok = build_seeded(model_type, seed)
        prompt = tok("hello world, this is", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10,
                                 pad_token_id=tok.pad_token_id)
        if out.shape[1] - len(prompt) >= 4:
            break
    return model, tok


def build_seeded(model_type: str, seed: int):
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from rlhfkit.models.loading import eager_if_softcapped
    from rlhfkit.models.tiny import tiny_tokenizer

    name = CONFIG_MAPPING_NAMES.get(model_type)
    if name is None or not hasattr(transformers, name):
        raise SkipArch("no config class in transformers (remote code)")
    cls = getattr(transformers, name)
    tok = tiny_tokenizer()
    try:
        config = cls(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, initializer_range=0.1, tie_word_embeddings=False,
                     **tiny_kwargs(cls))
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).eval()
    except SkipArch:
        raise
    except Exception as e:  # noqa: BLE001 - the reason is the report
        raise SkipArch(f"cannot build small: {type(e).__name__}: {str(e).splitlines()[0][:140]}") from e
    model.generation_config.pad_token_id = tok.pad_token_id
    try:  # transformers' own forward and generate at these sizes, before rlhfkit's checks
        with torch.no_grad():
            model(torch.tensor([[5, 6, 7, 8], [0, 0, 7, 8]]), attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]))
            model.generate(torch.tensor([[5, 6, 7, 8]]), do_sample=False, max_new_tokens=3)
    except Exception as e:  # noqa: BLE001 - the reason is the report
        raise SkipArch(f"transformers' own forward/generate fails at these sizes: {type(e).__name__}: "
                       f"{str(e).splitlines()[0][:120]}") from e
    return eager_if_softcapped(model).eval(), tok


class Caplog:
    """What the checks read of pytest's caplog: `at_level` and `text`."""

    def __init__(self):
        self.stream = io.StringIO()

    @contextlib.contextmanager
    def at_level(self, level, logger):
        log = logging.getLogger(logger)
        handler, old = logging.StreamHandler(self.stream), log.level
        log.addHandler(handler)
        log.setLevel(level)
        try:
            yield
        finally:
            log.removeHandler(handler)
            log.setLevel(old)

    @property
    def text(self):
        return self.stream.getvalue()


def checks(m, arch):
    def rows_by_length(eager_rows):
        with pytest.MonkeyPatch.context() as mp:
            m.test_rows_by_length_with_uneven_responses_equal_the_padded_layout(arch, eager_rows, mp)

    return [
        ("greedy rollout == generate", lambda: m.test_greedy_rollout_is_generate_with_its_stop_tokens(arch)),
        ("rollout logprobs == trainer == transformers",
         lambda: m.test_sampled_rollout_logprobs_are_the_trainers_and_transformers_forward(arch)),
        ("shared-prefix/packed == padded", lambda: m.test_shared_prefix_and_packed_layouts_equal_the_padded_one(
            arch, Caplog())),
        ("rows by length == padded (eager)", lambda: rows_by_length(m.logprobs_module.EAGER_ROW_TOKENS)),
        ("rows by length == padded (sdpa)", lambda: rows_by_length(0)),
        ("critic values", lambda: m.test_critic_values_equal_the_padded_layout(arch)),
        ("PPO + SFT step", lambda: m.test_one_ppo_step_with_critic_and_reference_and_one_sft_step(arch)),
    ]


def timeout(signum, frame):
    raise TimeoutError("over the time limit")


def sweep_one(m, model_type, limit):
    try:
        model, tok = build(model_type)
    except SkipArch as e:
        return {"arch": model_type, "status": "skipped", "why": str(e)}
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in m.PROMPTS]
    m.model_for = lambda arch, **overrides: (model, tok, prompts)  # the checks' model is this one
    m.NOTES[model_type] = []  # notes are allowed (the plain path runs); the numbers are checked
    state = {k: v.clone() for k, v in model.state_dict().items()}
    signal.signal(signal.SIGALRM, timeout)
    notes = []
    from rlhfkit.models.loading import position_offset

    for name, run in checks(m, model_type):
        if name.startswith("greedy") and position_offset(model):
            notes.append(f"{name}: not compared (transformers' generate numbers positions from 0, its forward from "
                         "pad_token_id + 1; the engine follows the forward)")
            continue
        model.load_state_dict(state)  # a training check moves the weights
        m.logprobs_module.note_once.cache_clear()
        signal.alarm(limit)
        try:
            run()
        except AssertionError as e:
            if not rounding(str(e)):
                return failure(model_type, name, e)
            notes.append(f"{name}: {rounding(str(e))}")
        except Exception as e:  # noqa: BLE001 - the failure is the report
            return failure(model_type, name, e)
        finally:
            signal.alarm(0)
    return {"arch": model_type, "status": "ok", **({"why": "; ".join(notes)} if notes else {})}


def rounding(message: str) -> str:
    """'k of n elements off by d' where a comparison missed by float32 rounding only (a few elements, within
    10x the tolerance), else ''."""
    found = re.search(r"Mismatched elements: (\d+) / (\d+).*?Greatest absolute difference: ([0-9.e+-]+)", message,
                      re.S)
    if not found:
        return ""
    bad, total, diff = int(found[1]), int(found[2]), float(found[3])
    return f"{bad} of {total} elements off by {diff:.1e} (float32 rounding)" if bad <= max(3, total // 500) \
        and diff < 1e-4 else ""


def failure(model_type, name, e) -> dict:
    """The failed check, the error's first line and the deepest rlhfkit frame (else the last one)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "/rlhfkit/" in f.filename]
    last = ours[-1] if ours and "/_comparison.py" not in frames[-1].filename else frames[-1]
    msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return {"arch": model_type, "status": "failed", "check": name,
            "why": f"{type(e).__name__}: {msg} ({Path(last.filename).name}:{last.lineno})"}


def main(argv=None):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model types (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated model types to leave out")
    ap.add_argument("--out", default="", help="append one JSON line per architecture to this file")
    ap.add_argument("--limit", type=int, default=300, help="seconds per check before it counts as failed")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    types = [t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if not args.only or t in args.only.split(",")]
    types = [t for t in types if t not in args.skip.split(",")]
    m = load_checks()
    for model_type in types:
        start = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            result = sweep_one(m, model_type, args.limit)
        result["seconds"] = round(time.perf_counter() - start, 1)
        detail = {"ok": result.get("why", ""), "skipped": result.get("why", ""),
                  "failed": f"{result.get('check')}: {result.get('why')}"}[result["status"]]
        print(f"{model_type:28s} {result['status']:8s} {result['seconds']:6.1f}s {detail}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    sys.exit(main())
