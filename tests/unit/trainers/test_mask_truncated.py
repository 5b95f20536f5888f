"""--actor.mask_truncated_completions (TRL's mask_truncated_completions): samples cut at the token
budget leave the loss; their rewards still count in their group's baseline; a step of truncated
samples only changes nothing (no 0/0)."""

import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate


def trajs(finishes):
    def traj(prompt, response, group, finish):
        r = torch.tensor(response)
        return Trajectory(torch.tensor(prompt), r, torch.ones(len(r), dtype=torch.bool), torch.zeros(len(r)) - 1.0,
                          finish, 0, group)
    rows = [([5, 6], [7, 8], 0), ([5, 6], [9], 0), ([3, 4, 5], [6, 7, 8], 1), ([3, 4, 5], [2], 1)]
    return [traj(*row, finish) for row, finish in zip(rows, finishes)]


def experience(model, tok, finishes, mask):
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 4), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=False, temperature=1.0, autocast=None, mask_truncated=mask)
    return maker(trajs(finishes), torch.tensor([1.0, 0.0, 0.5, 0.0]), kl_coef=0.0)


def test_truncated_samples_leave_the_loss_but_keep_their_place_in_the_baseline():
    model, tok = tiny_model_and_tokenizer(seed=0)
    finishes = ["stop", "length", "stop", "stop"]
    off, on = experience(model, tok, finishes, False), experience(model, tok, finishes, True)
    assert off.batch.loss_mask[1].any() and not on.batch.loss_mask[1].any()
    assert torch.equal(on.batch.loss_mask[[0, 2, 3]], off.batch.loss_mask[[0, 2, 3]])
    # group 0's baseline is the mean of 1 and 0 (the truncated sample's 0 counted): advantages +-1 / std
    assert torch.equal(on.advantages, off.advantages) and float(on.advantages[0, 0]) > 0


def test_a_step_of_truncated_samples_only_changes_nothing():
    model, tok = tiny_model_and_tokenizer(seed=0)
    exp = experience(model, tok, ["length"] * 4, True)
    before = [p.detach().clone() for p in model.parameters()]
    learner = Learner(model, 1e-2, (0.9, 0.95), 1e-8, 0.0, total_steps=10)
    up = PolicyUpdate(model, learner, MicroBatcher(tok.pad_token_id, 4), LossSettings(max_len=4), batch_size=4,
                      max_epochs=1, shuffle_gen=torch.Generator().manual_seed(0), autocast=None)
    metrics = up(exp, kl_coef=0.0)
    assert all(v == v for v in metrics.values() if isinstance(v, float))  # no NaN
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_trl_grpo_config_field_maps_to_the_flag():
    from types import SimpleNamespace

    from rlhfkit.config import RLConfig
    from rlhfkit.config.trl_names import grpo_config_flags

    flags = grpo_config_flags(SimpleNamespace(loss_type="dapo", mask_truncated_completions=True))
    assert RLConfig.from_args(flags).actor.mask_truncated_completions
    assert "--actor.mask_truncated_completions" not in grpo_config_flags(SimpleNamespace(loss_type="dapo"))


def test_trl_grpo_configs_dropout_choice_maps_to_the_flag():
    from types import SimpleNamespace

    from rlhfkit.config import RLConfig
    from rlhfkit.config.trl_names import grpo_config_flags

    assert not RLConfig.from_args(grpo_config_flags(SimpleNamespace(disable_dropout=False))).actor.disable_dropout
    assert RLConfig.from_args(grpo_config_flags(SimpleNamespace(disable_dropout=True))).actor.disable_dropout
    assert RLConfig.from_args(grpo_config_flags(SimpleNamespace())).actor.disable_dropout  # ours by default
