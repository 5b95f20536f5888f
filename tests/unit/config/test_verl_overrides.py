"""verl's Hydra overrides on `rlhfkit train rl`: the values worked out by hand from verl's docs
(docs/examples/config.rst: data.train_batch_size counts prompts, ppo_mini_batch_size prompts times rollout.n,
micro-batches samples per GPU), every key of verl's PPO config and of its example scripts has a rule, and
docs/migration.md's table is the rendering of the rules."""

from pathlib import Path

import pytest

from rlhfkit.config.parse import parse_config
from rlhfkit.config.rl import RL_ALIASES, RLConfig, validate
from rlhfkit.config.verl import VERL_RL_RULES, verl_rule, verl_values
from rlhfkit.config.verl_convert import hydra_value
from rlhfkit.config.verl_doc import BEGIN, END, render
from rlhfkit.config.verl_names import VERL_MEGATRON_KEYS, VERL_PPO_KEYS
from rlhfkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
A, RO = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."

# verl's examples/grpo_trainer/run_qwen2-7b.sh (GSM8K, GRPO), as the shell hands it over.
GSM8K_GRPO = """algorithm.adv_estimator=grpo data.train_files=/data/gsm8k/train.parquet
data.val_files=/data/gsm8k/test.parquet data.train_batch_size=1024 data.max_prompt_length=512
data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 actor_rollout_ref.actor.use_kl_loss=True
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"]
trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b_function_rm
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15""".split()


def parse(*argv: str) -> RLConfig:
    """The config of `rlhfkit train rl ARGV`, not validated (verl's default batch sizes need a large run)."""
    return parse_config(RLConfig, list(argv), RL_ALIASES, positional=verl_values)


def test_verl_gsm8k_grpo_example_is_the_rlhfkit_config_worked_out_by_hand():
    cfg = RLConfig.from_args(GSM8K_GRPO)  # validated
    assert (cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt) == (1024, 5)
    assert cfg.train.batch_size == 256 * 5  # ppo_mini_batch_size counts prompts: 1280 samples a step
    assert cfg.train.micro_batch_size == 40
    plan = validate(cfg)
    assert plan.samples_per_rollout == 5120  # 1024 prompts x 5
    assert plan.optimizer_steps_per_rollout == 4  # 5120 / 1280
    assert plan.micro_batches_per_step == 32  # 1280 / 40
    assert cfg.algo.advantage.estimator == "group_norm"
    assert (cfg.algo.kl.use_loss, cfg.algo.kl.init_coef, cfg.algo.kl.estimator) == (True, 0.001, "k3")
    assert (cfg.data.prompt_max_len, cfg.rollout.max_new_tokens) == (512, 1024)
    assert (cfg.data.prompt_dataset, cfg.eval.dataset) == ("/data/gsm8k/train.parquet", "/data/gsm8k/test.parquet")
    assert (cfg.data.input_key, cfg.data.apply_chat_template, cfg.data.label_key) == (
        "prompt", True, "reward_model.ground_truth")
    assert cfg.reward.remote_url == "builtin:math"  # verl's default scorer for gsm8k
    assert cfg.actor.model_name_or_path == "Qwen/Qwen2-7B-Instruct"
    assert (cfg.actor.adam.lr, cfg.actor.entropy_coef, cfg.actor.gradient_checkpointing_enable) == (1e-6, 0.0, True)
    assert (cfg.rollout.engine, cfg.vllm.tensor_parallel_size, cfg.vllm.gpu_memory_utilization) == ("vllm", 2, 0.6)
    assert cfg.ref.offload is True
    assert (cfg.logger.wandb.project, cfg.logger.wandb.name) == ("verl_grpo_example_gsm8k", "qwen2_7b_function_rm")
    assert (cfg.ckpt.save_steps, cfg.eval.steps, cfg.train.num_episodes, cfg.actor.freezing_steps) == (20, 5, 15, 0)
    # verl's defaults where rlhfkit's differ
    assert (cfg.actor.lr_scheduler, cfg.actor.adam.weight_decay, cfg.actor.adam.betas) == ("constant", 0.01,
                                                                                          (0.9, 0.999))
    assert (cfg.actor.dual_clip, cfg.actor.eps_clip_low_high, cfg.algo.advantage.lambd) == (3.0, (0.2, 0.2), 1.0)
    assert cfg.ckpt.load_enable is True  # resume_mode=auto


def test_without_verl_overrides_nothing_changes():
    cfg = parse("--actor.model_name_or_path", "m")
    assert (cfg.actor.lr_scheduler, cfg.actor.dual_clip, cfg.data.label_key, cfg.reward.remote_url) == (
        "cosine_with_min_lr", None, None, None)


def test_global_micro_batch_is_divided_by_the_gpus_and_defaults_fill_the_rest():
    cfg = parse(A + "ppo_micro_batch_size=64", "trainer.n_gpus_per_node=8", "trainer.nnodes=2",
                "data.train_batch_size=32", A + "ppo_mini_batch_size=8", RO + "n=4")
    assert cfg.train.micro_batch_size == 4  # 64 / (8 x 2)
    assert cfg.train.batch_size == 32  # 8 prompts x 4
    assert cfg.algo.advantage.estimator == "gae"  # verl's default estimator
    assert cfg.rollout.max_new_tokens == 512


@pytest.mark.parametrize("verl, ours", [("grpo", "group_norm"), ("grpo_vectorized", "group_norm"), ("rloo", "rloo"),
                                        ("reinforce_plus_plus", "reinforce"),
                                        ("reinforce_plus_plus_baseline", "reinforce_baseline"), ("gae", "gae")])
def test_estimators(verl, ours):
    assert parse(f"algorithm.adv_estimator={verl}").algo.advantage.estimator == ours


def test_grpo_without_std_is_dr_grpo_in_either_order():
    for argv in (["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False"],
                 ["algorithm.norm_adv_by_std_in_grpo=False", "algorithm.adv_estimator=grpo"]):
        assert parse(*argv).algo.advantage.estimator == "dr_grpo"


@pytest.mark.parametrize("argv, needle", [
    (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator: 'remax': rlhfkit has no such advantage estimator"),
    ([A + "policy_loss.loss_mode=gpg"], "'gpg': rlhfkit has no such policy loss"),
    ([A + "use_kl_loss=True", "algorithm.use_kl_in_reward=True"], "rlhfkit applies the KL in one place"),
    ([A + "use_kl_loss=True", A + "kl_loss_type=abs"], "'abs': rlhfkit has no such KL estimator"),
    (["data.truncation=left"], "data.truncation: rlhfkit never truncates a prompt"),
    (["critic.ppo_mini_batch_size=64", A + "ppo_mini_batch_size=32"],
     "differs from actor_rollout_ref.actor.ppo_mini_batch_size (32)"),
    ([A + "ppo_mini_batchsize=4"], "unknown verl override actor_rollout_ref.actor.ppo_mini_batchsize; did you mean "
                                   "actor_rollout_ref.actor.ppo_mini_batch_size?"),
    (["+trainer.nonsense=1"], "unknown verl override trainer.nonsense"),
    (["~trainer.logger"], "Hydra's key deletion is not read"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_refused_and_unknown_are_one_line(argv, needle):
    with pytest.raises(ConfigError) as e:
        parse(*argv)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_kl_in_the_reward_and_adaptive_control():
    cfg = parse("algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=mse", "algorithm.kl_ctrl.kl_coef=0.02",
                "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.05", "algorithm.kl_ctrl.horizon=500")
    assert (cfg.algo.kl.use_loss, cfg.algo.kl.init_coef, cfg.algo.kl.estimator) == (False, 0.02, "k2")
    assert (cfg.algo.kl.target, cfg.algo.kl.horizon) == (0.05, 500)
    assert parse("algorithm.use_kl_in_reward=False").algo.kl.init_coef == 0.0


def test_clip_ratios_losses_and_optimizer():
    # verl's losses read clip_ratio only where clip_ratio_low / clip_ratio_high are null (their defaults: 0.2)
    assert parse(A + "clip_ratio=0.3").actor.eps_clip_low_high == (0.2, 0.2)
    assert parse(A + "clip_ratio=0.3", A + "clip_ratio_low=null",
                 A + "clip_ratio_high=null").actor.eps_clip_low_high == (0.3, 0.3)
    assert parse(A + "clip_ratio=0.3", A + "clip_ratio_high=null").actor.eps_clip_low_high == (0.2, 0.3)
    cfg = parse(A + "clip_ratio_high=0.28", A + "clip_ratio_low=0.2", A + "clip_ratio_c=10",
                A + "loss_agg_mode=seq-mean-token-sum-norm", A + "policy_loss.loss_mode=geo_mean",
                A + "optim.lr_scheduler_type=cosine", A + "optim.min_lr_ratio=0.1", A + "optim.lr_warmup_steps=-1",
                A + "optim.lr_warmup_steps_ratio=0.05", A + "optim.clip_grad=0.5", A + "ppo_epochs=2")
    assert (cfg.actor.eps_clip_low_high, cfg.actor.dual_clip) == ((0.2, 0.28), 10.0)
    assert (cfg.actor.loss_agg_mode, cfg.actor.policy_loss_type) == ("seq_mean_token_sum_norm", "gmpo")
    assert (cfg.actor.lr_scheduler, cfg.actor.min_lr_ratio, cfg.actor.lr_warmup_ratio) == ("cosine_with_min_lr", 0.1,
                                                                                          0.05)
    assert (cfg.actor.max_norm, cfg.train.max_epochs) == (0.5, 2)
    with pytest.raises(ConfigError, match="lr_warmup_steps: rlhfkit's warm-up is a ratio"):
        parse(A + "optim.lr_warmup_steps=10")


def test_hydra_values_lists_nulls_and_additions():
    assert hydra_value('["console","wandb"]') == "console,wandb"
    assert (hydra_value("null"), hydra_value("True"), hydra_value("'error'"), hydra_value("1e-6")) == (
        "none", "true", "error", "1e-6")
    cfg = parse("actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=64",
                "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "trainer.total_training_steps=null",
                "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
                "++actor_rollout_ref.actor.entropy_from_logits_with_chunking=True")
    assert (cfg.ds.lora.rank, cfg.ds.lora.alpha, cfg.ds.lora.target_modules) == (32, 64, "q_proj,v_proj")
    assert cfg.train.max_steps is None


def test_rewards_and_dapo_overlong_penalty():
    cfg = parse("custom_reward_function.path=my_reward.py", "reward_model.reward_manager=dapo",
                "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512",
                "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5")
    assert (cfg.reward.remote_url, cfg.reward.overlong_buffer_len, cfg.reward.overlong_penalty_factor) == (
        "my_reward.py", 512, 0.5)
    assert parse("reward_model.enable=True", "reward_model.model.path=rm").reward.model_name_or_path == "rm"
    # custom_reward_function.name: the file's function of that name; without a path verl's default reward
    assert parse("custom_reward_function.path=my_reward.py",
                 "custom_reward_function.name=my_score").reward.remote_url == "my_reward.py:my_score"
    assert parse("custom_reward_function.name=my_score").reward.remote_url == "builtin:math"  # verl's default


def test_rlhfkit_flags_win_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="rlhfkit"):
        cfg = parse("--rollout.engine", "hf", RO + "name=vllm", "data.train_batch_size=8", "--train.batch_size", "4",
                    A + "ppo_mini_batch_size=2", RO + "n=4")
    assert (cfg.rollout.engine, cfg.train.batch_size, cfg.rollout.batch_size) == ("hf", 4, 8)
    assert "--rollout.engine hf wins over the verl overrides' vllm" in caplog.text
    assert "--train.batch_size 4 wins over the verl overrides' 8" in caplog.text


def test_mini_batch_counts_the_samples_of_the_n_that_runs():
    cfg = parse(A + "ppo_mini_batch_size=2", "--rollout.n_samples_per_prompt", "4")
    assert (cfg.rollout.n_samples_per_prompt, cfg.train.batch_size) == (4, 8)


def test_noticed_keys_log_one_line(caplog):
    with caplog.at_level("WARNING", logger="rlhfkit"):
        parse("trainer.nnodes=2", "--config-name=ppo_megatron_trainer")
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("trainer.nnodes: ignored: rlhfkit runs one process per device") for m in lines)
    assert any(m.startswith("--config-name: ignored") for m in lines)
    assert all("\n" not in m for m in lines)


def test_every_key_of_verls_ppo_configs_has_a_rule():
    assert len(VERL_PPO_KEYS) == 556 and len(VERL_MEGATRON_KEYS) == 158
    for key in VERL_PPO_KEYS + VERL_MEGATRON_KEYS:
        verl_rule(key)  # an unknown key raises


def test_every_override_of_verls_example_scripts_has_a_rule():
    lines = (ROOT / "tests" / "fixtures" / "verl" / "example_overrides.txt").read_text().splitlines()
    keys = [line.split()[0] for line in lines if line and not line.startswith("#")]
    assert len(keys) > 300
    for key in keys:
        verl_rule(key.lstrip("+"))


def test_the_rules_cover_what_users_set_most():
    for key in ("data.train_batch_size", A + "ppo_mini_batch_size", A + "ppo_micro_batch_size_per_gpu", RO + "n",
                "algorithm.adv_estimator", A + "use_kl_loss", A + "kl_loss_type", "algorithm.use_kl_in_reward",
                A + "loss_agg_mode", A + "entropy_coeff", RO + "temperature", RO + "response_length",
                "trainer.total_epochs", "custom_reward_function.path", "critic.optim.lr"):
        assert VERL_RL_RULES[key].kind == "mapped", key


def test_docs_migration_verl_table_is_current():
    doc = (ROOT / "docs" / "migration.md").read_text(encoding="utf-8")
    generated = doc.split(BEGIN, 1)[1].split(END, 1)[0]
    assert generated == "\n" + render(), "docs/migration.md is stale: python -m rlhfkit.config.openrlhf_doc " \
                                         "docs/migration.md"


def test_plan_reads_verl_overrides(tmp_path, capsys):
    """`rlhfkit plan` (no model loaded) counts verl's batches as train rl does."""
    from rlhfkit.cli.main import main

    (tmp_path / "p.jsonl").write_text('{"prompt": [{"role": "user", "content": "1+1?"}], '
                                      '"reward_model": {"ground_truth": "2"}}\n' * 8)
    argv = ["plan", "actor_rollout_ref.model.path=smollm2", f"data.train_files={tmp_path / 'p.jsonl'}",
            "data.train_batch_size=4", RO + "n=4", A + "ppo_mini_batch_size=2", A + "ppo_micro_batch_size_per_gpu=4",
            "algorithm.adv_estimator=grpo", "trainer.total_epochs=1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "samples per rollout            16" in out  # 4 prompts x 4
    assert "(group_norm)" in out
