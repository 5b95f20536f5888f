"""The update's cost per response token at 32, 128 and 512 new tokens: the layout before the
no-compute-on-padding changes ("old") and the trainer's ("new"), side by side in one process.

SmolLM2-135M-Instruct, bf16 autocast, 4 prompts x 4 samples (the small setting), micro-batches of
8 samples cut and laid out as the trainer does (trainers.rl.batching.MicroBatcher: by group, shared
prefix), the RL update's loss (logprobs at T 0.7 + entropy as a metric), forward + backward in one
autocast region. Response lengths are drawn uniformly between 10% and 100% of the maximum, as a
rollout whose samples stop at different points (random ids: the cost does not depend on which).

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python bench/long_responses.py [--lengths 32,128,512]
        [--repeats 2] [--ablate] [--variants old,new,new-sdpa]

"old" undoes the four changes of docs/performance.md ("Every size, and long responses"): the LM
head over every [B, R] entry (padding included), eager attention for every shared-prefix row on
CPU, one prompt per row (rows padded to the widest), and the whole float32 softmax kept for the
head's backward. `--ablate` adds "new" with each change undone alone. Prints milliseconds per
response token (min over interleaved repeats), the tokens the forward ran on (padding included)
and the ratio of the longest length's cost per token to 128's, in wall time and in the process's
CPU time (with one thread, the CPU time is what a machine shared with other jobs distorts least).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from update_layouts import rollout_batch  # bench/ is on the path when run as a script

from rlhfkit.core import lm_head
from rlhfkit.data.packing import pack_shared_prefix
from rlhfkit.models import (
    load_causal_lm,
    load_tokenizer,
    materialize_smollm2,
    response_logprobs,
)
from rlhfkit.models import logprobs as logprobs_module
from rlhfkit.trainers.rl.batching import MicroBatcher

CHANGES = ("head on responses only", "SDPA for wide rows", "rows by length", "bounded head backward")
SHORT = dict(zip(("head", "sdpa", "rows", "backward"), CHANGES))  # --variants new-head = new without CHANGES[0]


@contextlib.contextmanager
def undone(changes):
    """The library with `changes` (names from CHANGES) undone; "rows by length" is the layout's."""
    saved = (logprobs_module.head_positions, logprobs_module.EAGER_ROW_TOKENS, lm_head.KEEP_PROBS_BYTES)
    if "head on responses only" in changes:
        logprobs_module.head_positions = lambda batch: torch.ones_like(batch.response_mask)
    if "SDPA for wide rows" in changes:
        logprobs_module.EAGER_ROW_TOKENS = 1 << 30
    if "bounded head backward" in changes:
        lm_head.KEEP_PROBS_BYTES = 1 << 62
    try:
        yield
    finally:
        logprobs_module.head_positions, logprobs_module.EAGER_ROW_TOKENS, lm_head.KEEP_PROBS_BYTES = saved


def micro_batches(batch, pad_id, micro, by_length):
    batcher = MicroBatcher(pad_id, micro)
    group_ids = torch.arange(batch.batch_size) // 4
    rows = batcher.cut(batch, group_ids, torch.arange(batch.batch_size))
    return [pack_shared_prefix(batch, r, pad_id, batcher.row_tokens(batch), by_length=by_length) for r in rows]


def update(model, mbs, changes) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of the forward + backward of every micro-batch."""
    with undone(changes):
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for mb in mbs:
                logp, _ = response_logprobs(model, mb, temperature=0.7, with_entropy=True, entropy_grad=False)
                (logp.float() * mb.loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="32,128,512", help="max new tokens, comma-separated")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ablate", action="store_true", help="also the new layout with each change undone alone")
    ap.add_argument("--variants", default="old,new",
                    help=f"comma-separated: old, new, new-KEY (new with one change undone; KEY in {list(SHORT)})")
    a = ap.parse_args()
    path = materialize_smollm2()
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    model.train()
    names = a.variants.split(",") + ([f"new-{k}" for k in SHORT] if a.ablate else [])
    variants = {"old": CHANGES} if "old" in names else {}
    variants.update({"new": ()} if "new" in names else {})
    variants.update({f"new without {SHORT[n[4:]]}": (SHORT[n[4:]],) for n in names if n.startswith("new-")})
    cases = []  # (max new, variant, micro-batches, undone changes, response tokens)
    for m in (int(x) for x in a.lengths.split(",")):
        batch = rollout_batch(tok, a.prompts, a.group, (max(1, m // 10), m))
        for name, changes in variants.items():
            mbs = micro_batches(batch, tok.pad_token_id, a.micro, "rows by length" not in changes)
            cases.append((m, name, mbs, changes, int(batch.response_mask.sum())))
    update(model, cases[0][2][:1], ())  # warm-up
    times: dict = {}
    for _ in range(a.repeats):  # interleaved rounds: a machine slowing down hits every case alike
        for m, name, mbs, changes, _ in cases:
            wall, cpu = update(model, mbs, changes)
            best = times.get((m, name), (float("inf"), float("inf")))
            times[m, name] = (min(best[0], wall), min(best[1], cpu))
    print(f"{a.prompts} prompts x {a.group} samples, micro-batches of {a.micro}, response lengths uniform in "
          f"[10%, 100%] of max new, {torch.get_num_threads()} threads, min of {a.repeats}")
    print(f"{'max new':>7}  {'variant':36}{'resp tok':>9}{'computed':>9}{'wall s':>8}{'cpu s':>8}"
          f"{'ms/resp tok (wall, cpu)':>25}")
    per_token = {}
    for m, name, mbs, _, responses in cases:
        wall, cpu = times[m, name]
        per_token[m, name] = (1000 * wall / responses, 1000 * cpu / responses)
        computed = sum(mb.input_ids.numel() for mb in mbs)
        print(f"{m:7d}  {name:36}{responses:9d}{computed:9d}{wall:8.2f}{cpu:8.2f}"
              f"{per_token[m, name][0]:14.2f}{per_token[m, name][1]:11.2f}")
    lengths = sorted({m for m, *_ in cases})
    if 128 in lengths and lengths[-1] > 128 and len(cases) > len(variants):
        for name in variants:
            (w_long, c_long), (w_128, c_128) = per_token[lengths[-1], name], per_token[128, name]
            print(f"ratio {lengths[-1]}/128 of ms per response token, {name}: {w_long / w_128:.2f}x wall, "
                  f"{c_long / c_128:.2f}x cpu")


if __name__ == "__main__":
    main()
