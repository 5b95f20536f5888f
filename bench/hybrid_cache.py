"""The HF engine on models with convolution or recurrent layers (LFM2, Falcon-H1, Qwen3-Next): decoding
with its cache (the layers' states copied per sample, rows dropped when done) against decoding without
one (the whole sequence at every step, one prompt at a time), side by side in one process.

Random 4-layer models (hidden 256) built from their configs, 8 prompts x 4 samples x 48 new tokens, no
stop token, per-prompt seeds (both engines sample the same tokens); the best of two runs each, alternating.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/hybrid_cache.py
"""

from __future__ import annotations

import time

from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine


def main() -> None:
    for arch in ("lfm2", "falcon_h1", "qwen3_next"):
        model, tok = tiny_model_and_tokenizer(seed=0, arch=arch, hidden=256, layers=4, heads=4, kv_heads=2,
                                              intermediate=512)
        prompts = [tok(f"what is {i}+{i}? " * 3, add_special_tokens=False)["input_ids"] for i in range(8)]
        params = SamplingParams(max_new_tokens=48, temperature=1.0, n=4, stop_token_ids=())
        best: dict[bool, tuple[float, list]] = {}
        for cached in (True, False, True, False):
            engine = HFEngine(model, tok)
            engine._cached = engine._cached and cached
            start = time.perf_counter()
            trajs = engine.generate(prompts, params, seeds=list(range(len(prompts))))
            seconds = time.perf_counter() - start
            if cached not in best or seconds < best[cached][0]:
                best[cached] = (seconds, [t.response_ids.tolist() for t in trajs])
        (c, c_ids), (u, u_ids) = best[True], best[False]
        print(f"{arch:11s} cached {c:6.2f} s  uncached {u:6.2f} s  {u / c:5.1f}x  same samples: {c_ids == u_ids}")


if __name__ == "__main__":
    main()
