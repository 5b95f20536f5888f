"""float16 under FSDP2 (what --actor.dtype float16 becomes with --fsdp.enable): 2 gloo processes run
tests/integration/fsdp_fp16_worker.py, float32 shards computing in fp16 with the dynamic loss scale.

- An overflow on ONE rank (an inf in one of its gradient shards) skips the step on both and halves both
  scales alike: the gradient norm the Learner tests is that of the whole sharded model (reduced over the
  ranks), so every rank sees the inf. With the norm of each rank's own shards (the worker's `local` mode)
  the ranks part ways: one steps at 2^10, the other skips at 2^9. So too for a LoRA policy and the critic,
  with --train.max_norm 0 (no clipping) as with 1 (the worker's `paths` mode).
- The steps then train like the one-process float16 run (float16 matrices over float32 masters, the same
  overflow) on the same global batch, within float16's tolerance: the weights' update within 3% of its size
  (L2), each step's gradient norm within 1e-3 relative. Measured: 1.2%, 1.4e-5 and 1.1e-4.
- A sharded checkpoint written after step 1 resumes bit for bit: the loss scale's state, step 2's
  gradient norm and the weights after it."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.conftest import torchrun_worker, worker_module

WORKER = Path(__file__).with_name("fsdp_fp16_worker.py")


def run_worker(out: Path, *mode: str) -> list[dict]:
    """The worker in 2 torchrun processes; each rank's record."""
    torchrun_worker(WORKER, str(out), *mode)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]


def one_process(w):
    """The same 3 steps in one process (float16 matrices, float32 masters), step 0 overflowing."""
    torch.manual_seed(0)
    model, learner = w.build(world=1)
    ids = w.global_batch()
    steps = w.train(model, learner, ids, ids[:, 1:].numel(), range(3), overflow=True)
    return {k: v.detach().float() for k, v in model.state_dict().items()}, steps


# ~10 s on 2 shared cores, 5 of them the 2 ranks' start-up; the default run keeps the 1-rank unit test
# (tests/unit/distributed/test_fsdp_fp16.py: fp16 gathers, the whole model's scaled norm)
@pytest.mark.slow
def test_fp16_under_fsdp_skips_together_trains_like_one_process_and_resumes_bit_exact(tmp_path):
    w = worker_module(WORKER)
    ranks = run_worker(tmp_path / "two.safetensors")
    for r in ranks:  # rank 1's overflow: both skipped step 0 and halved the scale, then stepped alike
        assert [s["loss_scale"] for s in r["steps"]] == [512.0, 512.0, 512.0]
        assert [s["skipped_steps"] for s in r["steps"]] == [1.0, 1.0, 1.0]
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["final_scale"] == ranks[1]["final_scale"]
    one, steps = one_process(w)
    assert [s["loss_scale"] for s in steps] == [512.0] * 3 and steps[0]["skipped_steps"] == 1.0
    two = load_file(tmp_path / "two.safetensors")
    assert {v.dtype for v in two.values()} == {torch.float32}
    init = w.tiny_model_and_tokenizer(seed=0, **w.SIZE)[0].state_dict()
    moved = sum(float(((one[k] - init[k]) ** 2).sum()) for k in two) ** 0.5
    apart = sum(float(((one[k] - two[k]) ** 2).sum()) for k in two) ** 0.5
    assert apart < 0.03 * moved, (apart, moved)
    for a, b in zip(steps[1:], ranks[0]["steps"][1:], strict=True):
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-3 * a["grad_norm"], (steps, ranks[0]["steps"])
    assert ranks[0]["gathered"] == ["torch.float16"]  # the float32 shards were gathered in fp16
    # the sharded checkpoint of step 1 resumes bit for bit
    for r in ranks:
        assert r["scale_at_resume"] == r["scale_at_save"] == {"scale": 512.0, "hysteresis_left": 1, "iteration": 2,
                                                               "last_overflow": 0}
        assert r["resumed"] == r["steps"][2:] and r["resumed_final_scale"] == r["final_scale"]
    resumed = load_file(tmp_path / "two.safetensors.resumed")
    assert all(torch.equal(resumed[k], two[k]) for k in two)


# ~10 s on 2 shared cores (the ranks' start-up and 6 tiny models sharded)
@pytest.mark.slow
def test_an_overflow_on_one_rank_skips_on_both_for_lora_the_critic_and_without_clipping(tmp_path):
    """The loss-scaled Learner's overflow check over a LoRA policy's and a critic's shards, with clipping on
    and off (--train.max_norm 0 takes no clipping norm, but the overflow check reads the same whole-model
    norm): rank 1's inf skips the step on both ranks and halves both scales."""
    ranks = run_worker(tmp_path / "paths", "paths")
    assert ranks[0] == ranks[1]
    assert [(s["path"], s["max_norm"]) for s in ranks[0]] == [
        (p, n) for p in ("policy", "lora", "critic") for n in (0.0, 1.0)]
    assert all(s["loss_scale"] == 8.0 and s["skipped_steps"] == 1.0 for s in ranks[0]), ranks
