"""float16 training end to end on the tiny model (CPU): `train sft` in fp16 (float16 parameters, float32
masters, float16 autocast, dynamic loss scaling) follows the float32 run; rm, dpo and kto train in fp16; a
`train rl` run (GRPO, and PPO with its critic) samples with the hf engine and trains in fp16, its reward
rising as in float32."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from tests.integration.test_rl_loop import base_flags, read_metrics
from tests.integration.test_supervised_resume import DATA, argv

FP16 = {"model.dtype": "float16", "model.autocast": "float16"}


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("fp16")
    for kind, rows in DATA.items():
        (root / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def sft_losses(ws, out, **over) -> list[dict]:
    """The per-step rows of a 9-step `train sft` run (lr 1e-2, no warmup, no checkpoints)."""
    args = argv(ws, "sft", out, **{"train.max_epochs": 3, "train.lr_warmup_ratio": 0.0, "ckpt.save_steps": -1,
                                   "train.eval_steps": -1, "ckpt.load_enable": "false", **over})
    assert main(args) == 0
    return [r for r in read_metrics(out) if "loss_scale" in r or "grad_norm" in r]


def test_sft_in_fp16_follows_the_float32_run(ws, tmp_path):
    """The first step's loss (the same weights) differs by the forward's float16 rounding only: fp16's unit
    roundoff is 2^-11 = 4.9e-4, and the loss, softmax and norms run in float32 under autocast, so 1e-3 relative.
    The later steps differ also by the rounding of the weights to float16 (2^-11 of each weight at every step,
    the masters keeping the rest) that Adam at lr 1e-2 carries forward: measured at most 0.65% over the 9 steps
    on this CPU (bf16, with 2^-8 rounding: 0.9%), so 2% relative. The run learns (the last loss a third of the
    first), the loss scale is logged and no step overflowed at 2^16 on this model."""
    ref = sft_losses(ws, tmp_path / "fp32")
    fp16 = sft_losses(ws, tmp_path / "fp16", **FP16)
    assert len(ref) == len(fp16) == 9
    assert "loss_scale" not in ref[0] and all(r["loss_scale"] == 2.0**16 for r in fp16)
    assert fp16[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-3)
    for a, b in zip(fp16, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=0.02)
    assert fp16[-1]["loss"] < fp16[0]["loss"] / 3 and fp16[-1]["skipped_steps"] == 0.0
    final = load_file(str(tmp_path / "fp16" / "final" / "model.safetensors"))
    assert {v.dtype for v in final.values()} == {torch.float16}


def test_an_overflow_in_a_run_skips_its_step_and_lowers_the_scale(ws, tmp_path):
    """A first scale of 2^19 overflows float16's gradients (max 65504) on this model: the first steps are
    skipped, each halving the scale (hysteresis 1), until the gradients fit; then the run trains at that scale
    (the window, 1000 steps, never ends here). The skips are counted; the unit tests check the weights stay."""
    rows = sft_losses(ws, tmp_path / "fp16", **FP16, **{"train.loss_scale.initial_scale_power": 19,
                                                         "train.loss_scale.hysteresis": 1})
    scales, skipped = [r["loss_scale"] for r in rows], int(rows[-1]["skipped_steps"])
    assert 1 <= skipped <= 4 and scales[:skipped] == [2.0 ** (19 - k) for k in range(1, skipped + 1)]
    assert [r["skipped_steps"] for r in rows] == [float(min(i + 1, skipped)) for i in range(9)]
    assert set(scales[skipped:]) == {scales[skipped - 1]}
    assert rows[-1]["loss"] < rows[0]["loss"] / 2


@pytest.mark.parametrize("kind", ["rm", "dpo", "kto"])
def test_preference_stages_train_in_fp16(ws, tmp_path, kind):
    out = tmp_path / kind
    assert main(argv(ws, kind, out, **FP16, **{"ckpt.save_steps": -1, "ckpt.load_enable": "false"})) == 0
    rows = [r for r in read_metrics(out) if "loss_scale" in r]
    assert len(rows) == 6 and all(r["loss_scale"] == 2.0**16 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    final = load_file(str(out / "final" / "model.safetensors"))
    assert {v.dtype for v in final.values()} == {torch.float16}


@pytest.fixture(scope="module")
def workspace(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(64)]
    return tiny_ws("rl16", rows, sevens=True)


@pytest.mark.parametrize("estimator", ["group_norm", "gae"])
def test_rl_trains_in_fp16_with_the_hf_engine(workspace, tmp_path, estimator):
    """`--param_dtype fp16` (OpenRLHF's flag): the hf engine samples under float16 autocast, the policy (and
    PPO's float32 critic, computing under the same autocast) train with loss scaling, and the reward rises as
    in test_rl_loop's float32 runs; the saved policy has float16 matrices and float32 norms."""
    out = tmp_path / estimator
    extra = {"algo.advantage.estimator": estimator}
    if estimator == "gae":
        extra.update({"algo.advantage.gamma": "1.0", "algo.advantage.lambd": "0.95", "critic.adam.lr": "1e-2"})
    flags = [f for f in base_flags(workspace, out, **extra) if f not in ("--actor.autocast", "none")]
    assert main(["train", "rl", *flags, "--param_dtype", "fp16"]) == 0
    metrics = [m for m in read_metrics(out) if "reward" in m]
    assert all(m["actor/loss_scale"] == 2.0**16 for m in metrics)
    assert all(("critic/loss_scale" in m) == (estimator == "gae") for m in metrics)
    rewards = [m["reward"] for m in metrics]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards
    final = load_file(str(out / "final" / "model.safetensors"))
    assert all(v.dtype == (torch.float16 if v.dim() > 1 else torch.float32) for v in final.values())
