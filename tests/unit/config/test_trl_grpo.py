"""A TRL GRPOConfig read field by field (config/trl_grpo.py): the batch arithmetic worked by hand, a rule for
every field of the installed TRL's GRPOConfig, one-line refusals and warnings, and one RL step of
`RLTrainer.from_config(RLConfig.from_trl(...))` on the tiny model."""

import dataclasses
import logging

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.config.trl_grpo import GRPO_RULES, grpo_argv
from rlhfkit.errors import ConfigError

trl = pytest.importorskip("trl")
CPU = dict(output_dir="out", bf16=False, use_cpu=True, report_to="none", lr_scheduler_type="constant")


def grpo(**kw):
    return trl.GRPOConfig(**{**CPU, **kw})


def test_every_grpo_config_field_has_a_rule():
    names = {f.name for f in dataclasses.fields(trl.GRPOConfig) if not f.name.startswith("_")}
    assert names - set(GRPO_RULES) == set()


def test_a_field_without_a_rule_is_refused_by_name():
    @dataclasses.dataclass
    class Newer(trl.GRPOConfig):
        brand_new_knob: int = 0

    with pytest.raises(ConfigError, match="brand_new_knob"):
        grpo_argv(Newer(**CPU))


def test_only_a_config_instance_is_read():
    from types import SimpleNamespace

    for wrong in (SimpleNamespace(learning_rate=1e-5), trl.GRPOConfig):
        with pytest.raises(ConfigError, match="expected a TRL GRPOConfig instance"):
            grpo_argv(wrong)


def test_batch_arithmetic_by_hand():
    # 4 completions per micro step, 2 micro steps per optimizer step -> 8 per step; TRL's generation is
    # 4 * steps_per_generation (default: the accumulation, 2) = 8 completions = 8 / 4 generations = 2 prompts.
    cfg = RLConfig.from_trl(grpo(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                                 max_steps=10, num_iterations=2))
    assert (cfg.train.micro_batch_size, cfg.train.batch_size, cfg.rollout.batch_size,
            cfg.rollout.n_samples_per_prompt, cfg.train.max_epochs) == (4, 8, 2, 4, 2)
    # one rollout = 8 / 8 = 1 optimizer step per pass, 2 passes -> 2 TRL steps; 10 TRL steps = 5 rollouts
    assert cfg.train.max_steps == 5
    # TRL passes over the prompts as often as max_steps takes (num_train_epochs, 3 by default, unread): as many
    # passes as rollouts, so a small dataset does not end the run early
    assert cfg.train.num_episodes == 5
    # generation_batch_size 24 = 6 prompts of 4, 3 optimizer steps per pass; 10 steps -> ceil(10 / 3) = 4 rollouts
    cfg = RLConfig.from_trl(grpo(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                                 generation_batch_size=24, max_steps=10))
    assert (cfg.rollout.batch_size, cfg.train.batch_size, cfg.train.max_steps) == (6, 8, 4)
    # steps_per_generation 4: 4 * 4 = 16 completions = 4 prompts per rollout, 16 / 8 = 2 optimizer steps each;
    # 7 TRL steps -> ceil(7 / 2) = 4 rollouts
    cfg = RLConfig.from_trl(grpo(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                                 steps_per_generation=4, max_steps=7))
    assert (cfg.rollout.batch_size, cfg.train.batch_size, cfg.train.max_steps) == (4, 8, 4)
    cfg = RLConfig.from_trl(grpo(per_device_train_batch_size=2, num_generations=2, num_train_epochs=3))
    assert (cfg.train.num_episodes, cfg.train.max_steps, cfg.rollout.batch_size) == (3, None, 1)


def test_the_other_mapped_fields():
    cfg = RLConfig.from_trl(grpo(
        learning_rate=3e-6, lr_scheduler_type="cosine", warmup_steps=7, weight_decay=0.01, adam_beta1=0.8,
        adam_beta2=0.95, adam_epsilon=1e-6, max_grad_norm=0.5, seed=3, max_completion_length=64, temperature=0.7,
        top_p=0.9, top_k=20, repetition_penalty=1.1, beta=0.04, epsilon_high=0.28, scale_rewards="none",
        gradient_checkpointing=False, save_steps=50, save_total_limit=2, log_completions=True,
        num_completions_to_print=3, num_generations_eval=4, disable_dropout=True, mask_truncated_completions=True))
    a, r = cfg.actor, cfg.rollout
    assert (a.adam.lr, a.lr_scheduler, a.lr_warmup_steps, a.adam.weight_decay, a.adam.betas, a.adam.eps) == (
        3e-6, "cosine", 7, 0.01, (0.8, 0.95), 1e-6)
    assert (a.max_norm, cfg.train.seed, a.gradient_checkpointing_enable, a.disable_dropout) == (0.5, 3, False, True)
    assert (r.max_new_tokens, r.temperature, r.top_p, r.top_k, r.repetition_penalty) == (64, 0.7, 0.9, 20, 1.1)
    assert (cfg.algo.kl.init_coef, cfg.algo.kl.use_loss, cfg.algo.kl.estimator) == (0.04, True, "k3")
    assert (a.eps_clip_low_high, cfg.algo.advantage.estimator, a.mask_truncated_completions) == (
        (0.2, 0.28), "dr_grpo", True)
    assert (cfg.ckpt.output_dir, cfg.ckpt.save_steps, cfg.ckpt.max_num) == ("out", 50, 2)
    assert (cfg.logger.log_samples, cfg.eval.n_samples, cfg.eval.temperature, cfg.eval.top_k) == (3, 4, 0.7, 20)
    assert RLConfig.from_trl(grpo(top_k=0)).rollout.top_k == -1
    assert RLConfig.from_trl(grpo(lr_scheduler_type="constant", warmup_steps=5)).actor.lr_warmup_steps == 0
    ratio = RLConfig.from_trl(grpo(lr_scheduler_type="cosine", warmup_steps=0.1)).actor
    assert (ratio.lr_warmup_ratio, ratio.lr_warmup_steps) == (0.1, -1)


def test_trls_default_linear_schedule_maps_to_ours():
    assert RLConfig.from_trl(trl.GRPOConfig(**{**CPU, "lr_scheduler_type": "linear"})).actor.lr_scheduler == "linear"


@pytest.mark.parametrize(("scale", "estimator"), [("group", "group_norm"), ("none", "dr_grpo"),
                                                 ("batch", "group_mean_batch_std")])
def test_scale_rewards_picks_the_estimator(scale, estimator):
    assert RLConfig.from_trl(grpo(scale_rewards=scale)).algo.advantage.estimator == estimator


def test_our_flags_win_over_the_trl_config():
    cfg = RLConfig.from_trl(grpo(learning_rate=3e-6), ["--actor.adam.lr", "1e-5"])
    assert cfg.actor.adam.lr == 1e-5


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(lr_scheduler_type="cosine_with_restarts"), "lr_scheduler_type='cosine_with_restarts'"),
    (dict(min_p=0.1), "min_p=0.1"),
    (dict(entropy_coef=0.01), "entropy_coef=0.01"),
    (dict(reward_weights=[1.0, 0.5]), "reward_weights="),
    (dict(optim="sgd"), "optim="),
    (dict(num_train_epochs=1.5), "num_train_epochs=1.5"),
])
def test_math_rlhfkit_cannot_honour_is_refused_in_one_line(kw, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        grpo_argv(grpo(**kw))
    assert "\n" not in str(err.value)


def test_trainer_machinery_is_noticed_once_and_defaults_are_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        grpo_argv(grpo())
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        grpo_argv(grpo(dataloader_num_workers=4, push_to_hub=False, hub_model_id="me/x", logging_steps=5))
    notes = [r.getMessage() for r in caplog.records]
    assert sorted(n.split("=")[0] for n in notes) == [
        "TRL dataloader_num_workers", "TRL hub_model_id", "TRL logging_steps"]


def test_one_rl_step_from_a_trl_config(tmp_path):
    import rlhfkit
    from rlhfkit.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    trl_cfg = grpo(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                   max_completion_length=4, max_steps=1, learning_rate=1e-3, save_steps=100)
    cfg = RLConfig.from_trl(trl_cfg, ["--actor.model_name_or_path", str(tmp_path / "tiny"), "--actor.autocast", "none",
                                      "--logger.progress_bar", "false", "--train.num_threads", "1"])
    assert (cfg.rollout.batch_size, cfg.train.batch_size, cfg.train.max_steps) == (2, 4, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    def reward(completions, **_):  # TRL's reward function form
        return [float(sum(map(ord, c)) % 7) for c in completions]

    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=reward,
                                            train_dataset=[{"prompt": f"{i} plus {i}:"} for i in range(4)])
    metrics = trainer.train()
    assert metrics["optimizer_steps"] == 1 and metrics["advantage_abs"] > 0
    after = trainer.loop.policy.state_dict()
    assert any(not (after[k] == before[k]).all() for k in before)


def test_the_migration_guide_python_runs():
    """docs/migration.md's TRL example: the config block runs as written (its assert is the batch arithmetic);
    the training block compiles (it downloads a model and a dataset)."""
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "migration.md").read_text(encoding="utf-8")
    section = doc.split("## TRL `GRPOConfig`", 1)[1]
    config_block, train_block = (part.split("```", 1)[0] for part in section.split("```python\n")[1:3])
    assert "RLConfig.from_trl" in config_block and "RLTrainer.from_config" in train_block
    exec(compile(config_block, "migration.md", "exec"), {})
    compile(train_block, "migration.md", "exec")
