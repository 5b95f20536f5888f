"""The update's forward + backward on one rollout batch, in each training layout, side by side.

SmolLM2-135M-Instruct, bf16 autocast, the demo's 16 chat prompts x 8 samples with responses of
6-12 tokens (random ids: the cost does not depend on which tokens they are), the loss the RL
update backpropagates (logprobs at T 0.7 + entropy as a metric). Each layout runs the same 128
samples; the padded layout with random micro-batches is what the trainer did before the
shared-prefix layout (and what --train.shared_prefix_enable false still does); the shared layout
over random micro-batches shows why the trainer orders a step's samples by group first.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/update_layouts.py [--repeats N] [--compile]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/update_layouts.py --prompts 4 --group 4 --lengths 64,512  # long responses

Prints seconds per 128-sample update (min over interleaved repeats), the tokens the forward ran
on and the ratio to the padded layout; also the trainer's layout with the LM head called as a
module (before the fused head), and with --compile the decoder layers under torch.compile.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from rlhfkit.cli.demo import INSTRUCTION
from rlhfkit.data.batch import collate, select_rows
from rlhfkit.data.packing import pack_shared_prefix
from rlhfkit.data.synthetic import arithmetic_problems
from rlhfkit.data.types import Trajectory
from rlhfkit.models import (
    load_causal_lm,
    load_tokenizer,
    materialize_smollm2,
    response_logprobs,
)
from rlhfkit.models import logprobs as logprobs_module

PROMPTS, GROUP, MICRO, LENGTHS = 16, 8, 32, (6, 12)  # defaults; LENGTHS: response lengths drawn uniformly


def rollout_batch(tok, prompts=PROMPTS, group=GROUP, lengths=LENGTHS):
    g = torch.Generator().manual_seed(0)
    trajs = []
    for gid, r in enumerate(arithmetic_problems(prompts, 0, seed=0)[0]):
        text = tok.apply_chat_template([{"role": "user", "content": INSTRUCTION.format(question=r["input"])}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        for _ in range(group):
            n = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
            trajs.append(Trajectory(prompt_ids=prompt, response_ids=torch.randint(100, 40000, (n,), generator=g),
                                    loss_mask=torch.ones(n, dtype=torch.bool), logprobs=torch.zeros(n),
                                    finish_reason="stop", version=0, group_id=gid))
    return collate(trajs, tok.pad_token_id)


def update(model, micro_batches) -> float:
    """Forward + backward of every micro-batch in one autocast region (as PolicyUpdate runs an
    optimizer step: the bf16 weight casts are reused across micro-batches)."""
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for mb in micro_batches:
            logp, _ = response_logprobs(model, mb, temperature=0.7, with_entropy=True, entropy_grad=False)
            (logp.float() * mb.loss_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


@contextlib.contextmanager
def unfused_head():
    """The LM head called as a module and autograd through logprobs_and_entropy (before the fused head)."""
    real = logprobs_module._plain_linear
    logprobs_module._plain_linear = lambda head: False
    try:
        yield
    finally:
        logprobs_module._plain_linear = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compile", action="store_true",
                    help="also time the decoder layers under torch.compile(dynamic=True) (needs a C++ compiler)")
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--group", type=int, default=GROUP)
    ap.add_argument("--micro", type=int, default=MICRO)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="MIN,MAX response tokens")
    a = ap.parse_args()
    path = materialize_smollm2()
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    lo, hi = (int(x) for x in a.lengths.split(","))
    batch = rollout_batch(tok, a.prompts, a.group, (lo, hi))
    micro = a.micro
    n = batch.batch_size
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    pad = tok.pad_token_id
    by_group = [pack_shared_prefix(batch, torch.arange(i, i + micro), pad, 512) for i in range(0, n, micro)]
    rows = [  # (name, micro-batches, context)
        ("padded, random micro-batches", [select_rows(batch, perm[i : i + micro]) for i in range(0, n, micro)],
         contextlib.nullcontext),
        ("shared prefix, random micro-batches",
         [pack_shared_prefix(batch, perm[i : i + micro], pad, 512) for i in range(0, n, micro)],
         contextlib.nullcontext),
        ("shared prefix, by group, head unfused", by_group, unfused_head),
        ("shared prefix, by group (the trainer)", by_group, contextlib.nullcontext),
    ]
    update(model, by_group[:1])  # warm-up
    times = {}
    for _ in range(a.repeats):  # interleaved rounds: a machine slowing down hits every row alike
        for name, mbs, ctx in rows:
            with ctx():
                times[name] = min(times.get(name, float("inf")), update(model, mbs))
    compile_s = None
    if a.compile:
        for layer in model.model.layers:
            layer.compile(dynamic=True)
        compile_s = update(model, by_group)  # the first call compiles
        name = "shared prefix, by group, layers compiled"
        rows.append((name, by_group, contextlib.nullcontext))
        times[name] = min(update(model, by_group) for _ in range(a.repeats))
    base = times["padded, random micro-batches"]
    print(f"{n} samples ({a.prompts} prompts x {a.group}, responses of {lo}-{hi} tokens), micro-batches of "
          f"{micro}, {torch.get_num_threads()} threads")
    for name, mbs, _ in rows:
        tokens = sum(mb.num_tokens for mb in mbs)
        responses = int(batch.response_mask.sum())
        print(f"{name:42}{times[name]:8.2f} s  {tokens:6d} tokens  {base / times[name]:5.2f}x  "
              f"{1000 * times[name] / responses:7.2f} ms per response token")
    if compile_s is not None:
        print(f"first compiled update (compiling included): {compile_s:.1f} s")


if __name__ == "__main__":
    main()
