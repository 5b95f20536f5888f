"""`plan_run` / `plan_warnings`: the step arithmetic of OpenRLHF's batch sizes, worked out by hand."""

import pytest

from rlhfkit.config import RLConfig, parse_config, validate
from rlhfkit.config.plan import plan_run, plan_warnings
from rlhfkit.config.rl import RL_ALIASES
from rlhfkit.errors import ConfigError


def cfg_of(**flags) -> RLConfig:
    argv = []
    for k, v in flags.items():
        argv += [f"--{k.replace('__', '.')}", str(v)]
    return parse_config(RLConfig, argv, aliases=RL_ALIASES)


def plan_of(num_prompts, **flags):
    cfg = cfg_of(**flags)
    return cfg, plan_run(cfg, validate(cfg), num_prompts)


def test_counts_with_a_partial_rollout_batch():
    # 100 prompts, 16 per rollout x 8 samples = 128 samples; 64 per optimizer step, 2 epochs.
    cfg, p = plan_of(100, rollout__batch_size=16, rollout__n_samples_per_prompt=8, train__batch_size=64,
                     train__micro_batch_size=8, train__max_epochs=2, train__num_episodes=3, eval__steps=5)
    assert p.samples_per_rollout == 128
    assert p.micro_batches_per_step == 8            # 64 / 8
    assert p.optimizer_steps_per_rollout == 4       # 128 / 64 * 2
    assert p.rollouts_per_episode == 6              # 100 // 16
    assert p.prompts_dropped_per_episode == 4       # 100 - 96
    assert p.optimizer_steps_per_episode == 24      # 6 * 4
    assert p.seed002_update_steps_per_episode == 24  # 100 * 8 // 64 * 2 = 12 * 2
    assert p.total_rollouts == 18                   # 6 * 3
    assert p.total_optimizer_steps == 72
    assert p.total_samples == 2304                  # 18 * 128
    assert p.eval_points == (5, 10, 15)
    assert any("4 of 100 prompts are left out" in w for w in plan_warnings(cfg, p))


def test_seed_formula_counts_the_partial_batch_ours_does_not():
    # 20 prompts, 8 per rollout x 4 = 32 samples, 16 per step: OpenRLHF's arithmetic gives 20*4//16 = 5 steps per
    # episode; our trainer runs 2 whole rollout batches x 2 steps = 4.
    _, p = plan_of(20, rollout__batch_size=8, rollout__n_samples_per_prompt=4, train__batch_size=16,
                   train__micro_batch_size=4)
    assert (p.optimizer_steps_per_episode, p.seed002_update_steps_per_episode) == (4, 5)


def test_max_steps_caps_rollouts_and_warns_about_unused_episodes():
    cfg, p = plan_of(64, rollout__batch_size=8, rollout__n_samples_per_prompt=4, train__batch_size=32,
                     train__micro_batch_size=16, train__max_steps=4, train__num_episodes=2,
                     actor__lr_warmup_ratio=0.1)
    assert (p.rollouts_per_episode, p.total_rollouts, p.total_optimizer_steps) == (8, 4, 4)
    assert p.warmup_steps == 1                      # ceil(0.1 * 4), as OpenRLHF rounds it
    w = " | ".join(plan_warnings(cfg, p))
    assert "ends the run inside episode 1" in w


def test_warmup_in_optimizer_steps_wins_over_the_ratio():
    # 64 prompts / 8 per rollout = 8 RL steps; 8 x 4 = 32 samples / 16 per optimizer step = 2 steps each: 16 in all
    flags = dict(rollout__batch_size=8, rollout__n_samples_per_prompt=4, train__batch_size=16,
                 train__micro_batch_size=16, actor__lr_warmup_ratio=0.5)
    assert plan_of(64, **flags)[1].warmup_steps == 8                        # int(0.5 * 16)
    assert plan_of(64, **flags, actor__lr_warmup_steps=3)[1].warmup_steps == 3  # optimizer steps, not RL steps
    cfg, p = plan_of(64, **flags, actor__lr_warmup_steps=0)                     # 0: no warmup, the ratio unread
    assert p.warmup_steps == 0 and not any("warmup" in w for w in plan_warnings(cfg, p))
    cfg, p = plan_of(64, **flags, actor__lr_warmup_steps=20)
    assert any("lr_warmup_steps 20 > the 16 optimizer steps" in w for w in plan_warnings(cfg, p))
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        validate(cfg_of(actor__lr_warmup_steps=-2))


def test_max_steps_beyond_the_data_and_too_few_prompts_warn():
    cfg, p = plan_of(16, rollout__batch_size=8, rollout__n_samples_per_prompt=2, train__batch_size=16,
                     train__max_steps=10)
    assert p.total_rollouts == 2
    assert any("stops after 2" in w for w in plan_warnings(cfg, p))
    cfg, p = plan_of(5, rollout__batch_size=8, rollout__n_samples_per_prompt=2, train__batch_size=16)
    assert p.rollouts_per_episode == 0
    assert any("cannot start" in w for w in plan_warnings(cfg, p))


def test_dynamic_filtering_top_ups_warn_that_the_prompts_may_run_out():
    flags = dict(rollout__batch_size=8, rollout__n_samples_per_prompt=4, train__batch_size=32,
                 algo__dynamic_filtering_enable="true")
    cfg, p = plan_of(64, algo__dynamic_filtering_max_rounds=3, **flags)
    assert p.total_rollouts == 8  # 64 // 8
    assert any("may run out after as few as 2 of the 8 planned steps" in w for w in plan_warnings(cfg, p))  # 8 // 3
    cfg, p = plan_of(64, algo__dynamic_filtering_max_rounds=1, **flags)  # drop only: no prompts drawn
    assert not any("may run out" in w for w in plan_warnings(cfg, p))


def test_clean_settings_give_no_warnings():
    cfg, p = plan_of(64, rollout__batch_size=8, rollout__n_samples_per_prompt=4, train__batch_size=32,
                     train__micro_batch_size=16)
    assert plan_warnings(cfg, p) == []


@pytest.mark.parametrize("flags,msg", [
    (dict(eval__n_samples=4), "identical greedy samples"),
    (dict(eval__n_samples=4, eval__temperature=0.7, eval__k="1,8"), "every k must be in"),
    (dict(logger__wandb__mode="cloud"), "valid: online, offline, disabled"),
])
def test_eval_and_wandb_settings_are_validated(flags, msg):
    with pytest.raises(ConfigError, match=msg):
        validate(cfg_of(**flags))


def test_eval_k_parses_a_list():
    assert cfg_of(eval__n_samples=8, eval__temperature=1.0, eval__k="1,4,8").eval.k == (1, 4, 8)
