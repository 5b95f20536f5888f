"""--actor.config_overrides (verl's model.override_config): fields set on the loaded config before the weights
load, worked out on the tiny Llama (64 hidden, 4 heads: head_dim 16, rope_theta 10000)."""

import pytest
import torch

from rlhfkit.config import RLConfig, parse_config, validate
from rlhfkit.config.rl import RL_ALIASES
from rlhfkit.config.rl_checks import config_overrides
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import apply_config_overrides, load_causal_lm, load_policy
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.rollout.vllm import llm_kwargs


@pytest.fixture
def folder(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return tmp_path


def test_fields_replace_dicts_merge_unknown_keys_refused():
    from transformers import LlamaConfig

    config = LlamaConfig(max_position_embeddings=128)
    apply_config_overrides(config, {"max_position_embeddings": 256, "attention_dropout": 0.25,
                                    "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert (config.max_position_embeddings, config.attention_dropout) == (256, 0.25)
    # merged: rope_theta stays beside the keys given
    assert config.rope_scaling == {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}
    with pytest.raises(ConfigError, match="LlamaConfig has no field 'max_positon_embeddings'"):
        apply_config_overrides(config, {"max_positon_embeddings": 1})


def test_the_weights_load_into_the_overridden_config(folder):
    plain = load_causal_lm(folder)
    scaled = load_causal_lm(folder, config_overrides={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                                      "max_position_embeddings": 4096})
    assert scaled.config.max_position_embeddings == 4096
    # linear RoPE scaling divides every frequency by the factor: inv_freq[1] = 10000 ** (-2 / 16) / 2
    inv = scaled.model.rotary_emb.inv_freq
    assert inv[1].item() == pytest.approx(10000 ** (-2 / 16) / 2, rel=1e-6)
    assert torch.equal(inv, plain.model.rotary_emb.inv_freq / 2)
    for (name, p), q in zip(plain.named_parameters(), scaled.parameters()):
        assert torch.equal(p, q), name  # the same weights, all loaded
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert not torch.allclose(plain(ids).logits[0, -1], scaled(ids).logits[0, -1])


def test_load_policy_passes_them_and_the_flag_is_checked(folder):
    model, _ = load_policy(str(folder), "float32", config_overrides={"attention_dropout": 0.5})
    assert model.config.attention_dropout == 0.5 and model.model.layers[0].self_attn.attention_dropout == 0.5

    def cfg(*argv):
        return parse_config(RLConfig, list(argv), aliases=RL_ALIASES)

    assert config_overrides(cfg()) is None
    assert config_overrides(cfg("--actor.config_overrides", '{"attention_dropout": 0.5}')) == {"attention_dropout": 0.5}
    with pytest.raises(ConfigError, match="expected a JSON object"):
        validate(cfg("--actor.config_overrides", "[1, 2]"))
    with pytest.raises(ConfigError, match="expected a JSON object"):
        validate(cfg("--actor.config_overrides", "max_position_embeddings=8"))
    with pytest.raises(ConfigError, match="HF engines of Ray rollout workers"):
        validate(cfg("--actor.config_overrides", "{}", "--distributed.backend", "ray"))


def test_a_vllm_engine_gets_them_as_hf_overrides():
    assert llm_kwargs("/m", "auto", 0, 0.5, False, 1, None, hf_overrides={"a": 1})["hf_overrides"] == {"a": 1}
    assert "hf_overrides" not in llm_kwargs("/m", "auto", 0, 0.5, False, 1, None)


def test_train_rl_builds_the_policy_and_reference_with_them(folder):
    from rlhfkit.api.builder import build_models

    cfg = parse_config(RLConfig, ["--actor.model_name_or_path", str(folder), "--ref.model_name_or_path", str(folder),
                                  "--algo.kl.init_coef", "0.01", "--actor.device", "cpu",
                                  "--actor.config_overrides", '{"attention_dropout": 0.5}'], aliases=RL_ALIASES)
    policy, _, ref, _ = build_models(cfg)
    assert policy.config.attention_dropout == 0.5 and ref.config.attention_dropout == 0.5
