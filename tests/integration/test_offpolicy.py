"""Off-policy corrections in a real loop on the tiny model: an engine that samples at another
temperature than the trainer's (a known rollout/trainer mismatch) shows the logprob gap, and the
IS-corrected and decoupled runs train."""

import dataclasses

import pytest
import torch

import rlhfkit
from rlhfkit.api.engines import build_engine
from tests.integration.conftest import rl_flags


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(16)]
    return tiny_ws("offpolicy", rows, sevens=True)


class HotterEngine:
    """The config's engine, sampling at `temperature` whatever the trainer's (the trainer computes
    its logprobs at --rollout.temperature): the engine's logprobs are another policy's."""

    def __init__(self, inner, temperature):
        self.inner, self.temperature = inner, temperature

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def version(self):
        return self.inner.version

    def generate(self, prompts, params, *args, **kwargs):
        return self.inner.generate(prompts, dataclasses.replace(params, temperature=self.temperature), *args, **kwargs)


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "6",
        "rollout.temperature": "1.0", "train.batch_size": "16", "train.micro_batch_size": "8",
        "train.max_steps": "2", "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant",
        "train.num_threads": "1", **over})


def run(ws, out, engine_temperature, **over):
    cfg = rlhfkit.RLConfig.from_args(flags(ws, out, **over))

    def make_engine(policy, tok):
        inner = build_engine(policy, tok, cfg)
        return inner if engine_temperature is None else HotterEngine(inner, engine_temperature)

    trainer = rlhfkit.RLTrainer.from_config(cfg, make_engine=make_engine)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    history = trainer.loop.train()
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True))
    return history, moved, trainer.loop.update.losses


def test_same_engine_and_trainer_show_no_gap(ws, tmp_path):
    history, moved, _ = run(ws, tmp_path / "same", None, **{"algo.advantage.is_correction_enable": "true"})
    assert moved and all(h["rollout/logprob_gap_max"] < 1e-4 for h in history)
    assert all(h["rollout/is_clipped_frac"] == 0.0 for h in history)


@pytest.mark.parametrize("over", [
    {"algo.advantage.is_correction_enable": "true", "algo.advantage.is_correction_type": "tis"},
    {"algo.advantage.is_correction_enable": "true", "algo.advantage.is_correction_type": "icepop",
     "algo.advantage.is_correction_threshold": ("0.8", "1.25")},
    {"enable_vllm_is_correction": "true", "vllm_is_correction_type": "seq-mask-tis"},  # OpenRLHF's names
    {"algo.advantage.decoupled_enable": "true"},
], ids=["tis", "icepop", "seq-mask-tis", "decoupled"])
def test_an_engine_at_another_temperature_shows_the_gap_and_trains(ws, tmp_path, monkeypatch, over):
    from rlhfkit.models import response_logprobs
    from rlhfkit.trainers.rl.experience import ExperienceMaker

    weights = []  # per step, before its update: pi_old / pi_rollout of each action token
    make = ExperienceMaker.__call__

    def recording(self, *args, **kwargs):
        exp = make(self, *args, **kwargs)
        with torch.no_grad():
            old = response_logprobs(self.policy, exp.batch, temperature=1.0)[0]
        weights.append(torch.exp(old - exp.rollout_logp)[exp.batch.loss_mask])
        return exp

    monkeypatch.setattr(ExperienceMaker, "__call__", recording)
    history, moved, losses = run(ws, tmp_path / "hot", 0.5, **over)
    assert losses.decoupled == ("algo.advantage.decoupled_enable" in over)
    assert losses.is_kind == {"tis": "tis", "icepop": "icepop", "seq-mask-tis": "seq_mask_tis", None: None}[
        over.get("algo.advantage.is_correction_type", over.get("vllm_is_correction_type"))]
    assert moved and len(history) == 2
    assert all(h["rollout/logprob_gap_mean"] > 0.05 for h in history)  # T' = 0.5 vs T = 1
    assert all(h["rollout/logprob_gap_max"] >= h["rollout/logprob_gap_mean"] for h in history)
    # the share of tokens whose weight the correction truncated (tis) or zeroed (icepop), by hand;
    # decoupled PPO alone weighs untruncated (measured: tis 0.40 and 0.67, icepop 0.76 and 0.92)
    want = [0.0 if losses.is_kind is None else float(((w < losses.is_low) | (w > losses.is_high)).float().mean())
            for w in weights]
    assert [h["rollout/is_clipped_frac"] for h in history] == pytest.approx(want, abs=1e-6)
    assert losses.is_kind is None or min(want) > 0.1
    assert all(torch.isfinite(torch.tensor(h["policy_loss"])) for h in history)
