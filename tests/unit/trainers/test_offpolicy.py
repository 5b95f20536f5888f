"""The update stage's off-policy corrections (IS correction, decoupled PPO) and the rollout/trainer
logprob gap metrics, with a tiny model and values worked out by hand."""

import dataclasses
import math

import pytest
import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.errors import TrainingError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


def traj(prompt, response, group):
    r = torch.tensor(response)
    return Trajectory(torch.tensor(prompt), r, torch.ones(len(response), dtype=torch.bool),
                      torch.zeros(len(response)), "stop", 0, group)


TRAJS = [traj([5, 6], [7, 8], 0), traj([5, 6], [9], 0)]  # 3 action tokens; advantages +-a


def experience(model, tok, proximal):
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 2), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=True, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=False, temperature=1.0, autocast=None, proximal=proximal)
    return maker(TRAJS, torch.tensor([1.0, 0.0]), kl_coef=0.0)


def update(model, tok, **settings):
    learner = Learner(model, 1e-2, (0.9, 0.95), 1e-8, 0.0, total_steps=10)
    return PolicyUpdate(model, learner, MicroBatcher(tok.pad_token_id, 2), LossSettings(max_len=4, **settings),
                        batch_size=2, max_epochs=1, shuffle_gen=torch.Generator().manual_seed(0), autocast=None)


def loss_and_grads(model, tok, exp, **settings):
    """One micro-batch's loss metrics and the gradients it leaves."""
    model.zero_grad(set_to_none=True)
    up = update(model, tok, **settings)
    counts = dict(num_tokens=3, num_seqs=2, max_len=4)
    out = up.micro_step(exp, torch.arange(2), up.batcher.layout(exp.batch), 0.0, counts)
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out, grads


CORRECTIONS = [dict(is_kind="tis"), dict(is_kind="icepop"), dict(is_kind="seq_mask_tis"), dict(decoupled=True),
               dict(decoupled=True, is_kind="tis")]


@pytest.mark.parametrize("settings", CORRECTIONS)
def test_rollout_logprobs_equal_to_the_trainers_change_nothing(tiny, settings):
    model, tok = tiny
    exp = experience(model, tok, proximal=True)
    exp = dataclasses.replace(exp, rollout_logp=exp.old_logp.clone())  # the engine agrees with the trainer
    plain, g_plain = loss_and_grads(model, tok, exp)
    fixed, g_fixed = loss_and_grads(model, tok, exp, **settings)
    assert fixed["policy_loss"] == plain["policy_loss"]
    assert all(torch.equal(a, b) for a, b in zip(g_plain, g_fixed, strict=True)) and g_plain
    assert fixed["rollout/logprob_gap_mean"] == 0.0 and fixed["rollout/is_clipped_frac"] == 0.0


def test_without_stored_old_logprobs_the_first_pass_is_the_trainers(tiny):
    model, tok = tiny
    with_old = experience(model, tok, proximal=True)
    exp = dataclasses.replace(experience(model, tok, proximal=False), rollout_logp=with_old.old_logp.clone())
    assert exp.old_logp is None
    plain, g_plain = loss_and_grads(model, tok, exp)
    fixed, g_fixed = loss_and_grads(model, tok, exp, is_kind="tis")
    assert fixed["policy_loss"] == pytest.approx(plain["policy_loss"], abs=1e-6)
    for a, b in zip(g_plain, g_fixed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert fixed["rollout/logprob_gap_max"] < 1e-5


@pytest.mark.parametrize("settings,weights,clipped", [
    (dict(is_kind="tis"), [math.exp(-0.1), 5.0, math.exp(0.3)], 1),   # exp(2) = 7.39 clamped to 5
    (dict(is_kind="icepop"), [math.exp(-0.1), 0.0, math.exp(0.3)], 1),  # zeroed outside [0.5, 5]
    (dict(decoupled=True), [math.exp(-0.1), math.exp(2.0), math.exp(0.3)], 0),  # untruncated
])
def test_perturbed_rollout_logprobs_weigh_the_loss_by_hand(tiny, settings, weights, clipped):
    model, tok = tiny
    exp = experience(model, tok, proximal=True)
    delta = torch.tensor([[0.1, -2.0], [-0.3, 0.0]])  # rollout - old on the 3 action tokens
    exp = dataclasses.replace(exp, rollout_logp=exp.old_logp + delta)
    out, _ = loss_and_grads(model, tok, exp, **settings)
    a = exp.advantages  # +-1/sqrt(2): group_norm of {1, 0}
    adv = [float(a[0, 0]), float(a[0, 1]), float(a[1, 0])]
    # the first pass: ratio 1 on every token, per-token loss -w * A, token_mean over 3 tokens
    want = -sum(w * x for w, x in zip(weights, adv, strict=True)) / 3
    assert out["policy_loss"] == pytest.approx(want, abs=1e-5)
    assert out["rollout/logprob_gap_mean"] == pytest.approx(0.1 + 2.0 + 0.3, abs=1e-5)  # a sum over tokens
    assert out["rollout/logprob_gap_max"] == pytest.approx(2.0, abs=1e-5)
    assert out["rollout/is_clipped_frac"] == pytest.approx(clipped)  # token-weighted sum: tokens truncated


def test_update_reports_the_gap_as_a_mean_and_a_max(tiny):
    model, tok = tiny
    model = type(model)(model.config)
    exp = experience(model, tok, proximal=True)
    exp = dataclasses.replace(exp, rollout_logp=exp.old_logp + torch.tensor([[0.1, -2.0], [-0.3, 0.0]]))
    out = update(model, tok, is_kind="tis")(exp, kl_coef=0.0)
    assert out["rollout/logprob_gap_mean"] == pytest.approx(2.4 / 3, abs=1e-5)
    assert out["rollout/logprob_gap_max"] == pytest.approx(2.0, abs=1e-5)
    assert out["rollout/is_clipped_frac"] == pytest.approx(1 / 3)


def test_decoupled_experience_computes_the_proximal_logprobs(tiny):
    model, tok = tiny
    assert experience(model, tok, proximal=False).old_logp is None  # one step, no KL: nothing to precompute
    assert experience(model, tok, proximal=True).old_logp.shape == (2, 2)


def test_a_correction_without_rollout_logprobs_is_a_training_error(tiny):
    model, tok = tiny
    exp = dataclasses.replace(experience(model, tok, proximal=True), rollout_logp=None)
    with pytest.raises(TrainingError, match="needs the engine's logprobs"):
        loss_and_grads(model, tok, exp, is_kind="tis")
