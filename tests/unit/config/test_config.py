import pytest

from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
from rlhfkit.errors import ConfigError


def parse(*argv):
    return parse_config(RLConfig, list(argv), aliases=RL_ALIASES)


def test_defaults_validate_and_batch_plan_matches_seed_002():
    cfg = parse("--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "8",
                "--train.batch_size", "64", "--train.micro_batch_size", "8", "--train.max_epochs", "2")
    plan = validate(cfg)
    assert plan.samples_per_rollout == 128
    assert plan.micro_batches_per_step == 8
    assert plan.optimizer_steps_per_rollout == 4  # 128 / 64 * 2 epochs


def test_flag_forms_types_and_booleans():
    cfg = parse("--actor.adam.lr=3e-5", "--algo.kl.use_loss", "--rollout.dynamic_filtering", "false",
                "--actor.eps_clip_low_high", "0.2", "0.28", "--train.max_steps", "5", "--actor.autocast", "none")
    assert cfg.actor.adam.lr == 3e-5 and isinstance(cfg.actor.adam.lr, float)
    assert cfg.algo.kl.use_loss is True and cfg.algo.dynamic_filtering_enable is False  # old name: an alias
    assert cfg.actor.eps_clip_low_high == (0.2, 0.28)
    assert cfg.train.max_steps == 5 and cfg.actor.autocast is None


def test_negative_numbers_are_values_not_flags():
    cfg = parse("--reward.clip_range", "-1", "1", "--rollout.top_k", "-1")
    assert cfg.reward.clip_range == (-1.0, 1.0) and cfg.rollout.top_k == -1


def test_openrlhf_flat_aliases():
    cfg = parse("--pretrain", "m", "--n_samples_per_prompt", "4", "--advantage_estimator", "rloo", "--use_kl_loss")
    assert cfg.actor.model_name_or_path == "m"
    assert cfg.rollout.n_samples_per_prompt == 4
    assert cfg.algo.advantage.estimator == "rloo" and cfg.algo.kl.use_loss


def test_yaml_then_flags_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  batch_size: 4\n  temperature: 0.5\ntrain.seed: 7\n")
    cfg = parse("--config", str(f), "--rollout.temperature", "0.9")
    assert cfg.rollout.batch_size == 4 and cfg.rollout.temperature == 0.9 and cfg.train.seed == 7


def test_config_is_frozen():
    cfg = parse()
    with pytest.raises(Exception):
        cfg.train.seed = 3


@pytest.mark.parametrize("argv,needle", [
    (["--train.sed", "1"], "did you mean --train.seed"),
    (["--lr", "1"], "unknown flag --lr; did you mean --actor.adam.lr"),
    (["--train.seed", "1.5"], "expected int"),
    (["--algo.kl.use_loss", "maybe"], "--algo.kl.use_loss: expected bool, got 'maybe'"),
    (["--actor.eps_clip_low_high", "0.2"], "expected 2 values"),
    (["--train.seed"], "a value is required"),
    (["positional"], "unexpected argument"),
])
def test_bad_flags_are_clear_errors(argv, needle):
    with pytest.raises(ConfigError, match=None) as e:
        parse(*argv)
    assert needle in str(e.value)


def test_yaml_unknown_key_and_bad_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  batch_sise: 4\n")
    with pytest.raises(ConfigError, match="unknown key 'rollout.batch_sise'; did you mean --rollout.batch_size"):
        parse("--config", str(f))
    f.write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse("--config", str(f))
    with pytest.raises(ConfigError, match="no such file"):
        parse("--config", str(tmp_path / "missing.yaml"))


def test_distributed_flags_parse_and_valid_combinations():
    cfg = parse_config(RLConfig, ["--distributed.backend", "ray", "--rollout.num_workers", "3",
                                  "--distributed.address", "10.0.0.1:6379", "--async_train",
                                  "--train.max_staleness", "2"], aliases=RL_ALIASES)
    validate(cfg)
    assert (cfg.distributed.backend, cfg.rollout.num_workers, cfg.distributed.address) == ("ray", 3, "10.0.0.1:6379")
    assert cfg.train.async_enable and cfg.train.max_staleness == 2
    d = parse_config(RLConfig, [])
    assert (d.distributed.backend, d.rollout.num_workers, d.train.async_enable, d.train.max_staleness) == \
        ("local", 1, False, 0)
    validate(parse_config(RLConfig, ["--distributed.backend", "ray", "--rollout.num_workers", "2"]))  # sync ray


def test_partial_rollout_is_openrlhfs_flag_and_needs_async():
    cfg = parse_config(RLConfig, ["--distributed.backend", "ray", "--async_train", "--train.max_staleness", "1",
                                  "--partial_rollout", "--train.partial_rollout_tokens", "4"], aliases=RL_ALIASES)
    validate(cfg)
    assert cfg.train.partial_rollout_enable and cfg.train.partial_rollout_tokens == 4
    with pytest.raises(ConfigError, match="--train.partial_rollout_enable continues generations across the weight "
                                          "updates of async training: add --train.async_enable"):
        validate(parse_config(RLConfig, ["--train.partial_rollout_enable", "true"]))


def test_the_vllm_engine_and_qlora_run_on_ray_workers_and_partial_rollouts_stay_with_hf_engines():
    ray = ["--distributed.backend", "ray", "--rollout.num_workers", "2", "--rollout.engine", "vllm"]
    validate(parse_config(RLConfig, ray))
    validate(parse_config(RLConfig, [*ray, "--ds.load_in_4bit", "true", "--ds.lora.rank", "4"]))
    validate(parse_config(RLConfig, [*ray, "--train.async_enable", "true", "--train.max_staleness", "1"]))
    with pytest.raises(ConfigError, match="--train.partial_rollout_enable continues HF engine generations") as e:
        validate(parse_config(RLConfig, [*ray, "--train.async_enable", "true", "--train.max_staleness", "1",
                                         "--train.partial_rollout_enable", "true"]))
    assert "\n" not in str(e.value)


def test_routing_replay_flag_its_slime_name_and_the_compiled_layers_refused():
    assert not RLConfig.from_args([]).actor.routing_replay
    assert RLConfig.from_args(["--actor.routing_replay"]).actor.routing_replay
    assert RLConfig.from_args(["--use-rollout-routing-replay"]).actor.routing_replay  # slime's R3 switch
    with pytest.raises(ConfigError, match="--actor.routing_replay does not combine with --train.compile_enable"):
        RLConfig.from_args(["--actor.routing_replay", "--train.compile_enable", "true"])


def test_qlora_runs_under_fsdp_and_still_needs_lora_there():
    """--ds.load_in_4bit with --fsdp.enable (refused before: the 4-bit base is now held whole on every rank);
    without --ds.lora.rank it is refused as in one process."""
    fsdp = ["--fsdp.enable", "true", "--ds.load_in_4bit", "true"]
    cfg = parse_config(RLConfig, [*fsdp, "--ds.lora.rank", "4"])
    validate(cfg)
    assert cfg.fsdp.enable and cfg.ds.load_in_4bit and cfg.ds.lora.rank == 4
    for argv in (fsdp, fsdp[2:]):
        with pytest.raises(ConfigError, match="--ds.load_in_4bit \\(QLoRA\\) trains LoRA adapters over the 4-bit "
                                              "base: give --ds.lora.rank R"):
            validate(parse_config(RLConfig, argv))


@pytest.mark.parametrize("arch", ["llama4_text", "modernbert_decoder"])
def test_compiled_layers_are_the_decoders_where_get_decoder_is_not_it(arch):
    """Llama 4's get_decoder() is the LM itself, ModernBERT-decoder's its LM head: the compiled layers are
    those of the decoder the logprobs call (models.logprobs.decoder_backbone)."""
    from rlhfkit.models import tiny_model_and_tokenizer
    from rlhfkit.models.compile import CompiledLayers

    model = tiny_model_and_tokenizer(seed=0, arch=arch)[0]
    assert CompiledLayers(model).layers == list(model.model.layers)
