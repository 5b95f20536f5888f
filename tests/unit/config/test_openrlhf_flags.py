"""OpenRLHF's flags (config/openrlhf.py): every flag of train_ppo_ray, train_sft, train_rm, train_dpo
train_kto, train_prm and train_kd, flat and dotted, is mapped, noticed or refused, never unknown and never a traceback;
docs/migration.md is the table's rendering."""

import logging
import typing
from pathlib import Path

import pytest

from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig, parse_config
from rlhfkit.config import openrlhf as orl
from rlhfkit.config.kd import KDConfig
from rlhfkit.config.openrlhf_doc import BEGIN, END, render, rewrite
from rlhfkit.config.openrlhf_names import OPENRLHF_COMMANDS
from rlhfkit.config.parse import Alias, _strip_optional, field_table
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.prm import PRMConfig
from rlhfkit.config.rl import RL_ALIASES
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError

DOC = Path(__file__).resolve().parents[3] / "docs" / "migration.md"
# OpenRLHF command -> (our config class, our alias table)
COMMANDS = {
    "train_ppo_ray": (RLConfig, RL_ALIASES),
    "train_sft": (SFTConfig, orl.SFT_ALIASES),
    "train_rm": (RMConfig, orl.RM_ALIASES),
    "train_dpo": (DPOConfig, orl.DPO_ALIASES),
    "train_kto": (KTOConfig, orl.KTO_ALIASES),
    "train_prm": (PRMConfig, orl.PRM_ALIASES),
    "train_kd": (KDConfig, orl.KD_ALIASES),
}


def rl(*argv):
    return parse_config(RLConfig, list(argv), aliases=RL_ALIASES)


# ------------------------------------------------------------------ the table itself
@pytest.mark.parametrize("command", COMMANDS)
def test_the_table_has_exactly_the_flags_of_each_openrlhf_command(command):
    cls, table = COMMANDS[command]
    names = OPENRLHF_COMMANDS[command]
    assert len(names) == len(set(names))
    missing = [n for n in names if not isinstance(table.get(n), Alias)]
    assert not missing
    if command == "train_ppo_ray":
        assert set(orl.RL_FLAGS) == set(names)
    else:
        assert set(orl.SUPERVISED_FLAGS[command[6:]]) == set(names)


def test_supervised_rules_are_all_used():
    used = {n for kind in ("sft", "rm", "dpo", "kto", "prm", "kd") for n in OPENRLHF_COMMANDS[f"train_{kind}"]}
    assert set(orl.SUPERVISED_RULES) == used


@pytest.mark.parametrize("command", COMMANDS)
def test_mapped_targets_exist_and_take_what_openrlhf_passes(command):
    cls, table = COMMANDS[command]
    fields = field_table(cls)
    for name in OPENRLHF_COMMANDS[command]:
        rule = table[name]
        assert "\n" not in rule.note and rule.kind in ("mapped", "noticed", "refused")
        if rule.kind != "mapped" or rule.convert is not None:
            continue
        base, _ = _strip_optional(fields[rule.to])
        args = typing.get_args(base)
        # a switch sets a bool, two values a pair, one value a scalar
        want = 0 if base is bool else len(args) if typing.get_origin(base) is tuple else 1
        assert rule.nargs == want, (command, name, rule.nargs, rule.to)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_name_that_is_also_ours_keeps_our_meaning(command):
    """An OpenRLHF name that is one of our flags maps onto it (a noticed alias must not hide a flag of
    ours; when a field of the same name is added, its row becomes mapped)."""
    cls, table = COMMANDS[command]
    fields = field_table(cls)
    for name, rule in table.items():
        if name in fields:
            assert rule.kind == "mapped" and rule.to == name, (command, name)


def test_rm_packing_is_mapped_as_for_sft():
    assert RMConfig.from_args(["--data.dataset", "d", "--packing_samples"]).ds.packing_samples
    assert RMConfig.from_args(["--data.dataset", "d", "--ds.packing_samples"]).ds.packing_samples


# ------------------------------------------------------------------ mapped: the same config as our flags
@pytest.mark.parametrize("theirs,ours", [
    (["--pretrain", "m", "--remote_rm_url", "r.py", "--prompt_data", "p.jsonl"],
     ["--actor.model_name_or_path", "m", "--reward.remote_url", "r.py", "--data.prompt_dataset", "p.jsonl"]),
    (["--n_samples_per_prompt", "4", "--rollout_batch_size", "32"],
     ["--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "32"]),
    (["--bf16"], ["--actor.dtype", "bfloat16"]),
    (["--ds.param_dtype", "bf16"], ["--actor.dtype", "bfloat16"]),
    (["--param_dtype", "fp16"], ["--actor.dtype", "float16", "--actor.autocast", "float16"]),
    (["--actor.autocast", "none", "--ds.param_dtype", "fp16"], ["--actor.dtype", "float16", "--actor.autocast",
                                                              "none"]),  # an autocast given is kept
    (["--eps_clip", "0.3"], ["--actor.eps_clip_low_high", "0.3", "0.3"]),
    (["--actor.eps_clip", "0.3", "--actor.eps_clip_low_high", "0.2", "0.28"],
     ["--actor.eps_clip_low_high", "0.2", "0.28"]),
    (["--eps_clip_low_high", "0.2", "0.28", "--eps_clip", "0.3"], ["--actor.eps_clip_low_high", "0.2", "0.28"]),
    (["--adam_betas", "0.9", "0.99", "--l2", "0.1", "--max_norm", "0.5"],
     ["--actor.adam.betas", "0.9", "0.99", "--critic.adam.betas", "0.9", "0.99", "--actor.adam.weight_decay", "0.1",
      "--critic.adam.weight_decay", "0.1", "--actor.max_norm", "0.5", "--critic.max_norm", "0.5"]),
    (["--no_advantage_std_norm"], ["--algo.advantage.whiten", "mean"]),
    (["--algo.advantage.no_std_norm"], ["--algo.advantage.whiten", "mean"]),
    (["--enable_ema"], ["--actor.ema_beta", "0.992"]),
    (["--ema_beta", "0.9", "--enable_ema"], ["--actor.ema_beta", "0.9"]),
    (["--train.enable_ema", "--train.ema_beta", "0.95"], ["--actor.ema_beta", "0.95"]),
    (["--ema_beta", "0.9"], []),  # OpenRLHF keeps no EMA without --enable_ema
    (["--use_wandb", "KEY", "--wandb_project", "p", "--wandb_run_name", "r", "--wandb_group", "g"],
     ["--logger.wandb.project", "p", "--logger.wandb.name", "r", "--logger.wandb.group", "g"]),
    (["--use_wandb", "KEY"], ["--logger.wandb.project", "openrlhf_train_ppo"]),
    (["--wandb_project", "p", "--wandb_run_name", "r"], []),  # no wandb without --use_wandb, as in OpenRLHF
    (["--logger.wandb.run_name", "r"], ["--logger.wandb.name", "r"]),
    # OpenRLHF's total cap: prompt budget = max_len - max_new_tokens, or max_new_tokens = max_len - prompt_max_len
    (["--max_len", "3072", "--generate_max_len", "1024"], ["--rollout.max_new_tokens", "1024",
                                                          "--data.prompt_max_len", "2048"]),
    (["--data.max_len", "2048"], ["--rollout.max_new_tokens", "1024"]),
    (["--prompt_max_len", "512", "--max_len", "2048"], ["--data.prompt_max_len", "512",
                                                       "--rollout.max_new_tokens", "1536"]),
    (["--data.max_len", "2048", "--data.prompt_max_len", "100", "--rollout.max_new_tokens", "7"],
     ["--data.prompt_max_len", "100", "--rollout.max_new_tokens", "7"]),  # both given: ours win
    (["--overlong_buffer_len", "16.0", "--overlong_penalty_factor", "2"],  # float-typed in OpenRLHF
     ["--reward.overlong_buffer_len", "16", "--reward.overlong_penalty_factor", "2"]),
    (["--eval.n_samples_per_prompt", "4", "--eval_temperature", "0.6"], ["--eval.n_samples", "4",
                                                                        "--eval.temperature", "0.6"]),
    (["--train_max_tokens_per_gpu", "2048", "--use_dynamic_batch"],
     ["--train.max_tokens_per_micro_batch", "2048", "--train.dynamic_batch_enable"]),
    (["--reward_clip_range", "-5", "5", "--dynamic_filtering", "--dynamic_filtering_reward_range", "0", "1"],
     ["--reward.clip_range", "-5", "5", "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range",
      "0", "1"]),
    (["--apply_chat_template", "false", "--use_kl_loss", "true"], ["--algo.kl.use_loss"]),
    (["--eval_steps=-1", "--save_steps=5"], ["--eval.steps", "-1", "--ckpt.save_steps", "5"]),
    (["--train.agent_func_path", "a.py"], ["--agent.func_path", "a.py"]),
    (["--critic_learning_rate", "1e-5", "--lr_scheduler", "constant"],
     ["--critic.adam.lr", "1e-5", "--actor.lr_scheduler", "constant"]),
    (["--actor.optim", "adam", "--aux_loss_coef", "0", "--freezing_actor_steps", "-1"], []),  # no effect: accepted
    (["--actor.optim", "muon", "--actor.muon.lr", "0.01", "--actor.muon.momentum", "0.9", "--actor.muon.ns_steps",
      "3", "--actor.muon.no_nesterov", "--critic.optim", "muon", "--critic.muon.nesterov"],
     ["--actor.optim", "muon", "--actor.muon.lr", "0.01", "--actor.muon.momentum", "0.9", "--actor.muon.ns_steps",
      "3", "--actor.muon.nesterov", "false", "--critic.optim", "muon"]),
    (["--freezing_actor_steps", "4", "--advantage_estimator", "gae"],
     ["--actor.freezing_steps", "4", "--algo.advantage.estimator", "gae"]),
    (["--critic.freezing_steps", "2", "--algo.advantage.estimator", "gae"],
     ["--actor.freezing_steps", "2", "--algo.advantage.estimator", "gae"]),
    (["--critic.freezing_steps", "-1", "--actor.muon.no_nesterov", "false"], []),  # OpenRLHF's default: off
    (["--aux_loss_coef", "0.01"], ["--actor.aux_loss_coef", "0.01"]),
    (["--prompt_data", "a.jsonl,b.jsonl", "--prompt_data_probs", "0.7,0.3"],
     ["--data.prompt_dataset", "a.jsonl,b.jsonl", "--data.prompt_probs", "0.7,0.3"]),
    (["--stop_properly_penalty_coef", "-0.5"], ["--reward.stop_properly_penalty_coef", "-0.5"]),
])
def test_mapped_flags_give_the_config_of_our_flags(theirs, ours):
    assert rl(*theirs) == rl(*ours)


IS_OURS = ["--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type"]


@pytest.mark.parametrize("theirs,ours", [
    (["--enable_vllm_is_correction", "--vllm_is_correction_type", "seq-mask-tis", "--vllm_is_truncated_threshold",
      "0.5", "5"], [*IS_OURS, "seq-mask-tis", "--algo.advantage.is_correction_threshold", "0.5", "5"]),
    (["--enable_vllm_is_correction", "--vllm_is_truncated_threshold", "2"],  # older releases: HIGH alone
     ["--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_threshold", "0", "2"]),
    (["--enable_vllm_is_correction", "--use_icepop"], [*IS_OURS, "icepop"]),
    (["--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type", "icepop",
      "--algo.advantage.is_correction_threshold", "0.8", "1.25"],
     [*IS_OURS, "icepop", "--algo.advantage.is_correction_threshold", "0.8", "1.25"]),
    (["--use_icepop", "false"], []),
])
def test_is_correction_flags_of_every_release_are_ours(theirs, ours, caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        assert rl(*theirs) == rl(*ours)
    assert not caplog.records
    a = rl(*theirs).algo.advantage
    assert a.is_correction_enable == bool(ours)


@pytest.mark.parametrize("config,theirs,ours", [
    (SFTConfig, ["--pretrain", "p", "--dataset", "d", "--learning_rate", "1e-5", "--l2", "0.1", "--adam_betas",
                 "0.9", "0.98", "--max_norm", "0.5", "--lr_scheduler", "constant", "--min_lr_ratio", "0.2"],
     ["--model.model_name_or_path", "p", "--data.dataset", "d", "--adam.lr", "1e-5", "--adam.weight_decay", "0.1",
      "--adam.betas", "0.9", "0.98", "--train.max_norm", "0.5", "--train.lr_scheduler", "constant",
      "--train.min_lr_ratio", "0.2"]),
    (SFTConfig, ["--target_modules", "q_proj", "v_proj", "--lora_rank", "8", "--bf16"],
     ["--ds.lora.target_modules", "q_proj,v_proj", "--ds.lora.rank", "8", "--model.dtype", "bfloat16"]),
    (SFTConfig, ["--ds.lora.target_modules", "q_proj", "v_proj", "--eval.steps", "5", "--eval.dataset", "e"],
     ["--ds.lora.target_modules", "q_proj,v_proj", "--train.eval_steps", "5", "--data.eval_dataset", "e"]),
    (DPOConfig, ["--beta", "0.2", "--ipo", "--ref_pretrain", "r", "--nll_loss_coef", "0"],
     ["--model.beta", "0.2", "--model.ipo_enable", "--ref.model_name_or_path", "r"]),
    (SFTConfig, ["--pretrain_mode", "--dataset", "a.jsonl,b.jsonl", "--dataset_probs", "0.3,0.7",
                 "--apply_chat_template", "--tokenizer_chat_template", "{{x}}"],
     ["--model.pretrain_mode_enable", "--data.dataset", "a.jsonl,b.jsonl", "--data.dataset_probs", "0.3,0.7",
      "--data.apply_chat_template", "--data.tokenizer_chat_template", "{{x}}"]),
    (RMConfig, ["--margin_loss", "--data.dataset_probs", "1"],
     ["--model.margin_loss_enable", "--data.dataset_probs", "1"]),
    (RMConfig, ["--margin_loss", "--loss", "logexpsigmoid"], []),
    (SFTConfig, ["--param_dtype", "fp16"], ["--model.dtype", "float16", "--model.autocast", "float16"]),
    (DPOConfig, ["--ds.param_dtype", "bf16"], ["--model.dtype", "bfloat16"]),  # OpenRLHF's logexpsigmoid has no margin
    (DPOConfig, ["--nll_loss_coef", "0.2", "--aux_loss_coef", "0.01"], ["--model.nll_loss_coef", "0.2",
                                                                       "--model.aux_loss_coef", "0.01"]),
    (SFTConfig, ["--optim", "muon", "--muon.lr", "0.01", "--muon.momentum", "0.9", "--muon.ns_steps", "3",
                 "--muon.no_nesterov"],
     ["--train.optim", "muon", "--muon.lr", "0.01", "--muon.momentum", "0.9", "--muon.ns_steps", "3",
      "--muon.nesterov", "false"]),
    (DPOConfig, ["--optim", "muon", "--muon.nesterov"], ["--train.optim", "muon"]),
    (KTOConfig, ["--desirable_loss_weight", "2", "--undesirable_loss_weight", "0.5", "--label_key", "ok",
                 "--model.beta", "0.2"],
     ["--model.desirable_weight", "2", "--model.undesirable_weight", "0.5", "--data.label_key", "ok",
      "--model.beta", "0.2"]),
])
def test_supervised_mapped_flags_give_the_config_of_our_flags(config, theirs, ours):
    table = {SFTConfig: orl.SFT_ALIASES, RMConfig: orl.RM_ALIASES, DPOConfig: orl.DPO_ALIASES,
             KTOConfig: orl.KTO_ALIASES}[config]
    assert parse_config(config, theirs, table) == parse_config(config, ours, table)


@pytest.mark.parametrize("argv,needle", [
    (["--max_len", "long"], "--max_len: cannot read 'long'"),
    (["--data.max_len", "2048", "--rollout.max_new_tokens", "x"], "--data.max_len: cannot read '2048' (or a flag"),
    (["--zero_stage"], "--zero_stage: a value is required"),
    (["--adam_betas", "0.9"], "--adam_betas: expected 2 values"),
    (["--vllm_is_truncated_threshold"], "--vllm_is_truncated_threshold: a value is required"),
    (["--n_samples_per_prompt", "many"], "--rollout.n_samples_per_prompt: expected int, got 'many'"),
])
def test_bad_values_of_openrlhf_flags_are_one_line_errors(argv, needle):
    with pytest.raises(ConfigError) as e:
        rl(*argv)
    assert str(e.value).startswith(needle)


def test_flags_of_another_command_stay_unknown():
    with pytest.raises(ConfigError, match="unknown flag --beta"):
        SFTConfig.from_args(["--beta", "0.1"])
    with pytest.raises(ConfigError, match="unknown flag --learning_rate"):
        rl("--learning_rate", "1e-6")


def test_yaml_keys_may_be_openrlhf_flags(tmp_path, caplog):
    f = tmp_path / "run.yaml"
    f.write_text("n_samples_per_prompt: 4\nbf16: true\nzero_stage: 3\nadam_betas: [0.9, 0.99]\n"
                 "gradient_checkpointing: false\nalgo:\n  advantage:\n    no_std_norm: true\n")
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        cfg = rl("--config", str(f))
    assert cfg == rl("--rollout.n_samples_per_prompt", "4", "--actor.dtype", "bfloat16", "--actor.adam.betas", "0.9",
                     "0.99", "--critic.adam.betas", "0.9", "0.99", "--algo.advantage.whiten", "mean")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["--zero_stage"]  # a switch set false: silent


# ------------------------------------------------------------------ noticed: accepted, consumed, one line logged
@pytest.mark.parametrize("argv,notice", [
    (["--zero_stage", "3"], "--zero_stage: ignored: DeepSpeed is not used; to shard the policy over GPUs"),
    (["--ds.zero_stage", "3"], "run under torchrun with --fsdp.enable true"),
    (["--colocate_all_models"], "--colocate_all_models: ignored: by default every model shares one process"),
    (["--vllm_num_engines", "4"], "--vllm_num_engines: with --distributed.backend ray: the rollout worker actors"),
    (["--gradient_checkpointing_use_reentrant"], "--gradient_checkpointing_use_reentrant: ignored"),
    (["--adam_offload"], "not supported yet"),
    (["--normalize_reward"], "--normalize_reward: accepted: a reward model's score is always divided"),
    (["--micro_rollout_batch_size", "16"], "--micro_rollout_batch_size: ignored: experience passes use"),
    (["--enforce_eager", "--vllm_sync_backend", "nccl"], "--enforce_eager: ignored"),
])
def test_noticed_flags_are_accepted_with_a_one_line_notice(argv, notice, caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        cfg = rl(*argv, "--train.seed", "7")  # the values are consumed: the next flag still parses
    assert cfg == rl("--train.seed", "7")
    messages = [r.getMessage() for r in caplog.records if r.name == "rlhfkit"]
    assert any(notice in m for m in messages), messages
    assert all("\n" not in m for m in messages)
    assert len(messages) == sum(a.startswith("--") for a in argv)  # one line per flag


def test_vllm_num_engines_is_the_number_of_ray_rollout_workers_on_the_ray_backend():
    ray = ("--distributed.backend", "ray", "--rollout.engine", "vllm")
    assert rl(*ray, "--vllm_num_engines", "4", "--vllm_tensor_parallel_size", "2") == \
        rl(*ray, "--rollout.num_workers", "4", "--vllm.tensor_parallel_size", "2")
    assert rl(*ray, "--vllm.num_engines", "3").rollout.num_workers == 3
    assert rl(*ray, "--vllm_num_engines", "4", "--rollout.num_workers", "2").rollout.num_workers == 2  # ours wins
    assert rl("--vllm_num_engines", "4").rollout.num_workers == 1  # one process: one engine


def test_actor_gpus_are_the_fsdp_trainer_actors_on_the_ray_backend():
    ray = ("--distributed.backend", "ray", "--fsdp.enable")
    assert rl(*ray, "--actor_num_nodes", "2", "--actor_num_gpus_per_node", "4") == rl(*ray, "--fsdp.num_ranks", "8")
    assert rl(*ray, "--actor.num_gpus_per_node", "4").fsdp.num_ranks == 4
    assert rl(*ray, "--actor_num_gpus_per_node", "4", "--fsdp.num_ranks", "2").fsdp.num_ranks == 2  # ours wins
    assert rl("--distributed.backend", "ray", "--actor_num_gpus_per_node", "4").fsdp.num_ranks == 1  # no FSDP
    assert rl("--fsdp.enable", "--actor_num_gpus_per_node", "4").fsdp.num_ranks == 1  # torchrun's own count


def test_a_switch_set_false_is_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        assert rl("--gradient_checkpointing", "false", "--colocate_all_models", "0") == rl()
    assert not caplog.records
    with pytest.raises(ConfigError, match="--enforce_eager: expected true or false, got 'maybe'"):
        rl("--enforce_eager", "maybe")


def test_notices_reach_the_cli(tmp_path, capsys, caplog):
    """`rlhfkit plan` (no model loaded) with OpenRLHF flags: exit 0, a notice per noticed flag."""
    (tmp_path / "p.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n' * 4)
    argv = ["plan", "--pretrain", "smollm2", "--prompt_data", str(tmp_path / "p.jsonl"), "--input_key", "question",
            "--label_key", "answer", "--zero_stage", "3", "--adam_offload", "--rollout_batch_size", "4",
            "--n_samples_per_prompt", "4", "--train_batch_size", "16", "--micro_train_batch_size", "4"]
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        assert main(argv) == 0
    assert "samples per rollout            16" in capsys.readouterr().out
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["--zero_stage", "--adam_offload"]


# ------------------------------------------------------------------ refused: one line naming what to use
@pytest.mark.parametrize("argv,needle", [
    (["train", "rl", "--freezing_actor_steps", "5"], "error: --actor.freezing_steps 5 warms up the critic, and "
                                                     "--algo.advantage.estimator group_norm trains none"),
    (["train", "rl", "--actor.optim", "sgd"], "error: --actor.optim: unknown value 'sgd'; valid: adam, muon"),
    (["train", "rl", "--stop_properly_penalty_coef", "1.5"],
     "error: --reward.stop_properly_penalty_coef must be < 0 or in [0, 1]"),
    (["train", "rl", "--param_dtype", "fp8"], "error: rlhfkit trains in float32, bfloat16 or float16, not fp8"),
    (["train", "rl", "--actor.dtype", "float16"], "error: --actor.dtype float16 with --actor.autocast bfloat16: "
                                                  "pass --actor.autocast float16 (or none"),
    (["train", "rl", "--actor.dtype", "float16", "--actor.autocast", "auto"],
     "error: --actor.dtype float16 with --actor.autocast auto: pass --actor.autocast float16 (or none"),
    (["train", "sft", "--model.dtype", "bfloat16", "--model.autocast", "float16"],
     "error: --model.dtype bfloat16 with --model.autocast float16: pass --model.autocast bfloat16"),
])
def test_refused_flags_are_one_line_cli_errors(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(needle) and err.count("\n") == 1 and "Traceback" not in err


# ------------------------------------------------------------------ every flag, with a plausible value
SAMPLES = {  # flags whose value must be of a given form (others: from their target's type or default)
    "input_template": ["Q: {}"], "data.input_template": ["Q: {}"],
    "param_dtype": ["bf16"], "ds.param_dtype": ["bf16"], "eps_clip": ["0.2"], "actor.eps_clip": ["0.2"],
    "max_len": ["2048"], "data.max_len": ["2048"], "adam_betas": ["0.9", "0.95"], "l2": ["0.01"],
    "max_norm": ["0.5"], "ema_beta": ["0.99"], "train.ema_beta": ["0.99"], "reward_clip_range": ["-5", "5"],
    "reward.clip_range": ["-5", "5"], "dual_clip": ["3"], "actor.dual_clip": ["3"],
    "stop_properly_penalty_coef": ["0.5"], "reward.stop_properly_penalty_coef": ["0.5"],
}
COMPANIONS = {"async_train": ["--distributed.backend", "ray", "--train.max_staleness", "1"],
              "train.async_enable": ["--distributed.backend", "ray", "--train.max_staleness", "1"],
              "partial_rollout": ["--distributed.backend", "ray", "--async_train", "--train.max_staleness", "1"],
              "train.partial_rollout_enable": ["--distributed.backend", "ray", "--async_train",
                                               "--train.max_staleness", "1"],
              "freezing_actor_steps": ["--algo.advantage.estimator", "gae"],  # the critic it warms up
              "critic.freezing_steps": ["--algo.advantage.estimator", "gae"],
              "load_in_4bit": ["--lora_rank", "4"],  # QLoRA: adapters over the 4-bit base
              "ds.load_in_4bit": ["--lora_rank", "4"]}
FROM_ARGS = {RLConfig: RLConfig.from_args, SFTConfig: SFTConfig.from_args, RMConfig: RMConfig.from_args,
             DPOConfig: DPOConfig.from_args, KTOConfig: KTOConfig.from_args, PRMConfig: PRMConfig.from_args,
             KDConfig: KDConfig.from_args}


def plausible(cls, name: str, rule: Alias) -> list[str]:
    if name in SAMPLES and (cls is RLConfig or name not in ("max_len", "data.max_len", "max_norm", "l2")):
        return SAMPLES[name]
    if rule.nargs == 0:
        return []
    if rule.nargs == "*":
        return ["q_proj", "v_proj"]
    if isinstance(rule.nargs, tuple):
        return ["0.5", "5"]
    if rule.kind == "mapped" and rule.to:
        value = cls()
        for part in rule.to.split("."):
            value = getattr(value, part)
        if value is not None:
            return [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
        if rule.to == "vllm.gpu_memory_utilization":  # a share in (0, 1], none by default
            return ["0.5"]
        base, _ = _strip_optional(field_table(cls)[rule.to])
        return {int: ["2"], float: ["2.0"]}.get(base, ["x"])
    return ["3"] * (rule.nargs if isinstance(rule.nargs, int) else 1)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_parses_and_validates_or_is_refused(command, caplog):
    cls, table = COMMANDS[command]
    extra = {"train_kto": ["--train.micro_batch_size", "2", "--train.batch_size", "8"],
             "train_kd": ["--teacher.model_name_or_path", "t"]}.get(command, [])
    wrong = []
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        for name in OPENRLHF_COMMANDS[command]:
            rule = table[name]
            argv = [f"--{name}", *plausible(cls, name, rule), *COMPANIONS.get(name, []), *extra]
            try:
                FROM_ARGS[cls](argv)
                outcome = "ok"
            except ConfigError as e:
                outcome = "refused" if f"--{name}" in str(e) or "rlhfkit trains" in str(e) else f"error: {e}"
            except Exception as e:  # noqa: BLE001  (the point: no other exception, ever)
                outcome = f"crash: {type(e).__name__}: {e}"
            if outcome != ("refused" if rule.kind == "refused" else "ok"):
                wrong.append((argv, outcome))
    assert not wrong


# ------------------------------------------------------------------ a stock OpenRLHF GRPO command line
STOCK_GRPO = """
--ref_num_nodes 1 --ref_num_gpus_per_node 8 --actor_num_nodes 1 --actor_num_gpus_per_node 8
--vllm_num_engines 8 --vllm_tensor_parallel_size 1 --colocate_all_models --vllm_gpu_memory_utilization 0.6
--vllm_enable_sleep --deepspeed_enable_sleep --vllm_sync_backend nccl --enforce_eager
--pretrain Qwen/Qwen2.5-0.5B-Instruct --remote_rm_url /data/reward_func.py
--save_path /ckpt/qwen-grpo --ckpt_path /ckpt/qwen-grpo/ckpt --save_hf_ckpt --save_steps 20 --max_ckpt_num 2
--micro_train_batch_size 4 --train_batch_size 128 --micro_rollout_batch_size 16 --rollout_batch_size 16
--n_samples_per_prompt 8 --max_epochs 1 --num_episodes 2 --prompt_max_len 1024 --max_samples 100000
--generate_max_len 2048 --advantage_estimator group_norm --zero_stage 3 --bf16 --actor_learning_rate 1e-6
--init_kl_coef 1e-3 --use_kl_loss --kl_estimator k3 --prompt_data openai/gsm8k --input_key question
--label_key answer --apply_chat_template --normalize_reward --gradient_checkpointing --packing_samples
--flash_attn --adam_offload --eps_clip_low_high 0.2 0.28 --entropy_loss_coef 0 --temperature 1.0 --top_p 1.0
--lr_warmup_ratio 0.03 --seed 42 --use_wandb KEY --wandb_project grpo-gsm8k --wandb_run_name run1
""".split()

OURS = """
--actor.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --reward.remote_url /data/reward_func.py
--ckpt.output_dir /ckpt/qwen-grpo --ckpt.save_steps 20 --ckpt.max_num 2
--train.micro_batch_size 4 --train.batch_size 128 --rollout.batch_size 16 --rollout.n_samples_per_prompt 8
--train.max_epochs 1 --train.num_episodes 2 --data.prompt_max_len 1024 --data.max_samples 100000
--rollout.max_new_tokens 2048 --algo.advantage.estimator group_norm --actor.dtype bfloat16 --actor.adam.lr 1e-6
--algo.kl.init_coef 1e-3 --algo.kl.use_loss --algo.kl.estimator k3 --data.prompt_dataset openai/gsm8k
--data.input_key question --data.label_key answer --data.apply_chat_template
--actor.eps_clip_low_high 0.2 0.28 --actor.entropy_coef 0 --rollout.temperature 1.0 --rollout.top_p 1.0
--actor.lr_warmup_ratio 0.03 --train.seed 42 --logger.wandb.project grpo-gsm8k --logger.wandb.name run1
--vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.6 --vllm.enable_sleep
--actor.gradient_checkpointing_enable
""".split()

NOTICED = ["--ref_num_nodes", "--ref_num_gpus_per_node", "--actor_num_nodes", "--actor_num_gpus_per_node",
           "--vllm_num_engines", "--colocate_all_models", "--deepspeed_enable_sleep", "--vllm_sync_backend",
           "--enforce_eager", "--ckpt_path", "--save_hf_ckpt", "--micro_rollout_batch_size", "--zero_stage",
           "--normalize_reward", "--packing_samples", "--flash_attn", "--adam_offload",
           "--use_wandb"]


def test_a_stock_openrlhf_grpo_command_line_parses_into_the_expected_config(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        cfg = RLConfig.from_args(STOCK_GRPO)  # parsed and validated
    assert cfg == RLConfig.from_args(OURS)
    assert (cfg.algo.advantage.estimator, cfg.rollout.n_samples_per_prompt, cfg.actor.dtype) == \
        ("group_norm", 8, "bfloat16")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == NOTICED


def test_the_same_command_line_with_dotted_names_gives_the_same_config(caplog):
    dotted = """
    --ref.num_nodes 1 --ref.num_gpus_per_node 8 --actor.num_nodes 1 --actor.num_gpus_per_node 8
    --vllm.num_engines 8 --vllm.tensor_parallel_size 1 --train.colocate_all --vllm.gpu_memory_utilization 0.6
    --vllm.enable_sleep --ds.enable_sleep --vllm.sync_backend nccl --vllm.enforce_eager
    --actor.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --reward.remote_url /data/reward_func.py
    --ckpt.output_dir /ckpt/qwen-grpo --ckpt.path /ckpt/qwen-grpo/ckpt --ckpt.save_hf --ckpt.save_steps 20
    --ckpt.max_num 2 --train.micro_batch_size 4 --train.batch_size 128 --rollout.micro_batch_size 16
    --rollout.batch_size 16 --rollout.n_samples_per_prompt 8 --train.max_epochs 1 --train.num_episodes 2
    --data.max_len 3072 --data.max_samples 100000 --rollout.max_new_tokens 2048
    --algo.advantage.estimator group_norm --ds.zero_stage 3 --ds.param_dtype bf16 --actor.adam.lr 1e-6
    --algo.kl.init_coef 1e-3 --algo.kl.use_loss --algo.kl.estimator k3 --data.prompt_dataset openai/gsm8k
    --data.input_key question --data.label_key answer --data.apply_chat_template --reward.normalize_enable
    --actor.gradient_checkpointing_enable --ds.packing_samples --ds.attn_implementation flash_attention_2
    --ds.adam_offload --actor.eps_clip_low_high 0.2 0.28 --actor.entropy_coef 0 --rollout.temperature 1.0
    --rollout.top_p 1.0 --actor.lr_warmup_ratio 0.03 --train.seed 42 --logger.wandb.key KEY
    --logger.wandb.project grpo-gsm8k --logger.wandb.run_name run1
    """.split()
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        assert RLConfig.from_args(dotted) == RLConfig.from_args(STOCK_GRPO)
    assert len(caplog.records) == 2 * len(NOTICED) + 1  # + --data.max_len


# ------------------------------------------------------------------ the doc is the table's rendering
def test_migration_doc_lists_every_flag_as_the_table_says():
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert generated == "\n" + render(), "docs/migration.md is stale: python -m rlhfkit.config.openrlhf_doc " \
                                         "docs/migration.md"
    assert rewrite(text) == text
    for command, names in OPENRLHF_COMMANDS.items():
        for name in names:
            assert f"`--{name}`" in generated, (command, name)


def test_doc_counts_are_the_table_s():
    rows = {line.split("|")[1].strip(): line for line in render().splitlines() if line.startswith("| `train_")}
    kinds = [sum(r.kind == k for r in orl.RL_FLAGS.values()) for k in ("mapped", "noticed", "refused")]
    assert rows["`train_ppo_ray`"].split("|")[3:7] == [f" {x} " for x in (len(orl.RL_FLAGS), *kinds)]
