"""The update's forward + backward on one rollout batch, in each training layout, side by side.

SmolLM2-135M-Instruct, bf16 autocast, the demo's 16 chat prompts x 8 samples with responses of
6-12 tokens (random ids: the cost does not depend on which tokens they are), the loss the RL
update backpropagates (logprobs at T 0.7 + entropy as a metric). Each layout runs the same 128
samples; the padded layout with random micro-batches is what the trainer did before the
shared-prefix layout (and what --train.shared_prefix_enable false still does); the shared layout
over random micro-batches shows why the trainer orders a step's samples by group first.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/update_layouts.py [--repeats N]

Prints seconds per 128-sample update (min over repeats), the tokens the forward ran on and
the ratio to the padded layout.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlhfkit.cli.demo import INSTRUCTION
from rlhfkit.data.batch import collate, select_rows
from rlhfkit.data.packing import pack_shared_prefix
from rlhfkit.data.synthetic import arithmetic_problems
from rlhfkit.data.types import Trajectory
from rlhfkit.models import load_causal_lm, load_tokenizer, materialize_smollm2, response_logprobs

PROMPTS, GROUP, MICRO = 16, 8, 32


def rollout_batch(tok):
    g = torch.Generator().manual_seed(0)
    trajs = []
    for gid, r in enumerate(arithmetic_problems(PROMPTS, 0, seed=0)[0]):
        text = tok.apply_chat_template([{"role": "user", "content": INSTRUCTION.format(question=r["input"])}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
        for _ in range(GROUP):
            n = int(torch.randint(6, 13, (1,), generator=g))
            trajs.append(Trajectory(prompt_ids=prompt, response_ids=torch.randint(100, 40000, (n,), generator=g),
                                    loss_mask=torch.ones(n, dtype=torch.bool), logprobs=torch.zeros(n),
                                    finish_reason="stop", version=0, group_id=gid))
    return collate(trajs, tok.pad_token_id)


def update(model, micro_batches) -> float:
    t0 = time.perf_counter()
    for mb in micro_batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = response_logprobs(model, mb, temperature=0.7, with_entropy=True, entropy_grad=False)
        (logp.float() * mb.loss_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    path = materialize_smollm2()
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    batch = rollout_batch(tok)
    n = batch.batch_size
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    pad = tok.pad_token_id
    layouts = {
        "padded, random micro-batches": [select_rows(batch, perm[i : i + MICRO]) for i in range(0, n, MICRO)],
        "shared prefix, random micro-batches": [pack_shared_prefix(batch, perm[i : i + MICRO], pad, 512)
                                                for i in range(0, n, MICRO)],
        "shared prefix, by group": [pack_shared_prefix(batch, torch.arange(i, i + MICRO), pad, 512)
                                    for i in range(0, n, MICRO)],
    }
    update(model, layouts["shared prefix, by group"][:1])  # warm-up
    times = {k: min(update(model, mbs) for _ in range(a.repeats)) for k, mbs in layouts.items()}
    base = times["padded, random micro-batches"]
    print(f"{n} samples ({PROMPTS} prompts x {GROUP}), micro-batches of {MICRO}, {torch.get_num_threads()} threads")
    for k, mbs in layouts.items():
        tokens = sum(mb.num_tokens for mb in mbs)
        print(f"{k:38}{times[k]:8.2f} s  {tokens:6d} tokens  {base / times[k]:5.2f}x")


if __name__ == "__main__":
    main()
