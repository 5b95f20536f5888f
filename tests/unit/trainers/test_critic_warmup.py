"""The critic's warm-up (--actor.freezing_steps, OpenRLHF's --critic.freezing_steps): an update with
the actor frozen trains the critic alone; the policy, its Adam state and its schedule stay as they were."""

import pytest
import torch

from rlhfkit.errors import TrainingError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.critic import Critic
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate
from tests.unit.trainers.test_stages import traj


def setup(with_critic=True):
    model, tok = tiny_model_and_tokenizer(seed=0)
    critic = Critic.from_causal_lm(model) if with_critic else None
    batcher = MicroBatcher(tok.pad_token_id, 2)
    maker = ExperienceMaker(model, None, critic, batcher, estimator="gae" if with_critic else "group_norm", gamma=1.0,
                            lam=0.95, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=True, temperature=1.0, autocast=None)
    trajs = [traj([5, 6], [7, 8], 0), traj([5, 6], [9], 0), traj([5], [7, 8, 9], 1), traj([5], [9], 1)]
    exp = maker(trajs, torch.tensor([1.0, 0.0, 0.5, -1.0]), kl_coef=0.0)
    learner = Learner(model, 1e-2, total_steps=10)
    critic_learner = Learner(critic, 1e-2, total_steps=10, name="critic") if with_critic else None
    update = PolicyUpdate(model, learner, batcher, LossSettings(max_len=4, value_clip=0.5), batch_size=2,
                          max_epochs=1, shuffle_gen=torch.Generator().manual_seed(0), autocast=None, critic=critic,
                          critic_learner=critic_learner)
    return update, exp


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(module, snap):
    return all(torch.equal(v, snap[k]) for k, v in module.state_dict().items())


def test_a_frozen_update_trains_the_critic_alone_then_the_actor_trains():
    update, exp = setup()
    policy0, critic0 = snapshot(update.policy), snapshot(update.critic)
    out = update(exp, kl_coef=0.0, train_actor=False)
    assert same(update.policy, policy0) and not same(update.critic, critic0)
    assert update.learner.steps == 0 and update.learner.scheduler.last_epoch == 0  # no Adam step, no schedule
    assert update.critic_learner.steps == 2 and out["optimizer_steps"] == 2.0
    assert "policy_loss" not in out and not any(k.startswith("actor/") for k in out) and out["value_loss"] > 0
    assert all(p.grad is None for p in update.policy.parameters())  # no pass of the policy at all
    critic1 = snapshot(update.critic)
    update(exp, kl_coef=0.0)  # warm-up over: both train
    assert not same(update.policy, policy0) and not same(update.critic, critic1)
    assert update.learner.steps == 2 and update.critic_learner.steps == 4


def test_the_critic_trains_the_same_whether_the_actor_is_frozen_or_not():
    """The critic's gradients do not depend on the policy's pass: one update of each kind gives the
    same critic, bit for bit (the switch only removes the actor's part)."""
    frozen, exp = setup()
    frozen(exp, kl_coef=0.0, train_actor=False)
    both, exp2 = setup()
    both(exp2, kl_coef=0.0)
    assert same(both.critic, snapshot(frozen.critic))
    assert not same(both.policy, snapshot(frozen.policy))


def test_freezing_the_actor_without_a_critic_is_refused():
    update, exp = setup(with_critic=False)
    with pytest.raises(TrainingError, match="no critic to train"):
        update(exp, kl_coef=0.0, train_actor=False)
