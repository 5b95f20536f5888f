"""`rlhfkit serve-reward`'s flags: OpenRLHF's serve_rm names (flat and dotted) and the refusals."""

import logging

import pytest

from rlhfkit.config.openrlhf_serve import OPENRLHF_SERVE_RM, SERVE_RM_FLAGS
from rlhfkit.config.parse import Alias
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.errors import ConfigError


def test_every_serve_rm_flag_has_a_row_and_nothing_else_does():
    assert len(OPENRLHF_SERVE_RM) == len(set(OPENRLHF_SERVE_RM))
    assert set(SERVE_RM_FLAGS) == set(OPENRLHF_SERVE_RM)
    assert all(isinstance(rule, Alias) for rule in SERVE_RM_FLAGS.values())


@pytest.mark.parametrize("argv", [
    ["--reward_pretrain", "RM", "--normalize_reward", "--max_len", "512", "--batch_size", "4", "--bf16",
     "--port", "5001"],
    ["--reward.model_name_or_path", "RM", "--reward.normalize_enable", "--data.max_len", "512", "--batch_size", "4",
     "--ds.param_dtype", "bf16", "--port", "5001"],
])
def test_openrlhfs_flat_and_dotted_names_set_our_flags(argv):
    cfg = ServeRewardConfig.from_args(argv)
    assert (cfg.reward.model_name_or_path, cfg.reward.normalize_enable, cfg.data.max_len, cfg.batch_size,
            cfg.dtype, cfg.port) == ("RM", True, 512, 4, "bfloat16", 5001)
    assert cfg.host == "127.0.0.1"  # OpenRLHF binds 0.0.0.0 unless told; rlhfkit this machine only


@pytest.mark.parametrize("argv, dtype", [
    (["--param_dtype", "fp16"], "float16"), (["--ds.param_dtype", "bf16"], "bfloat16"), (["--bf16"], "bfloat16"),
    (["--dtype", "float16"], "float16"), ([], "float32")])
def test_param_dtype_picks_the_weights_dtype(argv, dtype):
    assert ServeRewardConfig.from_args(["--reward_pretrain", "RM", *argv]).dtype == dtype


def test_openrlhfs_defaults_where_no_flag_is_given():
    cfg = ServeRewardConfig.from_args(["--reward_pretrain", "RM"])
    assert (cfg.reward.normalize_enable, cfg.data.max_len, cfg.batch_size, cfg.port) == (False, 2048, None, 5000)


def test_engine_flags_are_noticed(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        ServeRewardConfig.from_args(["--reward_pretrain", "RM", "--flash_attn", "--value_head_prefix", "score",
                                     "--load_in_4bit", "--packing_samples", "--disable_fast_tokenizer", "--use_ms"])
    text = caplog.text
    for name in ("flash_attn", "value_head_prefix", "load_in_4bit", "packing_samples", "disable_fast_tokenizer",
                 "use_ms"):
        assert f"--{name}" in text, name


@pytest.mark.parametrize("argv, needle", [
    (["--reward_pretrain", "RM", "--param_dtype", "fp8"], "not fp8"),
    (["--reward_pretrain", "RM", "--reward.remote_url", "r.py"], "not both"),
    ([], "needs --reward.remote_url"),
    (["--reward.remote_url", "r.py", "--normalize_reward"], "--reward.normalize_enable normalises a reward model"),
    (["--reward_pretrain", "RM", "--max_len", "0"], "--data.max_len"),
    (["--reward_pretrain", "RM", "--batch_size", "0"], "--batch_size"),
    (["--reward_pretrain", "RM", "--dtype", "float64"], "--dtype"),
    (["--reward_pretrain", "RM", "--device", "tpu"], "--device"),
])
def test_refusals_name_the_flag(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        ServeRewardConfig.from_args(argv)
