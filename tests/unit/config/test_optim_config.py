"""The optimizer choice (--actor.optim / --critic.optim / --train.optim adam|muon, the --*.muon.* settings)
and the critic's warm-up (--actor.freezing_steps): what each command accepts and refuses, in one line."""

import pytest

from rlhfkit.config.generate import RSConfig
from rlhfkit.config.preference import DPOConfig
from rlhfkit.config.rl import MuonConfig, RLConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError

GAE = ["--algo.advantage.estimator", "gae"]


def test_the_defaults_are_adamw_and_no_warm_up_with_openrlhf_s_muon_settings():
    cfg = RLConfig.from_args([])
    assert (cfg.actor.optim, cfg.critic.optim, cfg.actor.freezing_steps) == ("adam", "adam", 0)
    assert cfg.actor.muon == cfg.critic.muon == MuonConfig(lr=0.02, momentum=0.95, ns_steps=5, nesterov=True)
    assert SFTConfig.from_args([]).train.optim == "adam"


def test_openrlhf_s_flags_set_ours():
    cfg = RLConfig.from_args(["--actor.optim", "muon", "--actor.muon.lr", "0.01", "--actor.muon.no_nesterov",
                              "--critic.optim", "muon", "--critic.muon.ns_steps", "3", "--critic.freezing_steps", "4",
                              *GAE])
    assert cfg.actor.optim == cfg.critic.optim == "muon" and cfg.actor.freezing_steps == 4
    assert cfg.actor.muon == MuonConfig(lr=0.01, nesterov=False) and cfg.critic.muon == MuonConfig(ns_steps=3)
    assert RLConfig.from_args(["--freezing_actor_steps", "-1"]).actor.freezing_steps == 0  # OpenRLHF's off
    sft = SFTConfig.from_args(["--optim", "muon", "--muon.momentum", "0.9", "--muon.no_nesterov"])
    assert sft.train.optim == "muon" and sft.muon == MuonConfig(momentum=0.9, nesterov=False)
    assert DPOConfig.from_args(["--optim", "muon"]).train.optim == "muon"
    # under FSDP too (trainers.sharded_muon: each sharded matrix's update orthogonalised whole)
    assert RLConfig.from_args(["--actor.optim", "muon", "--critic.optim", "muon", "--fsdp.enable", *GAE]).fsdp.enable


@pytest.mark.parametrize("cls,argv,needle", [
    (RLConfig, ["--actor.optim", "lion"], "--actor.optim: unknown value 'lion'; valid: adam, muon"),
    (RLConfig, ["--critic.muon.ns_steps", "0"], "--critic.muon.ns_steps must be"),
    (RLConfig, ["--actor.muon.momentum", "1.0"], "--actor.muon.momentum must be"),
    (RLConfig, ["--actor.freezing_steps", "-2"], "--actor.freezing_steps must be"),
    (RLConfig, ["--actor.freezing_steps", "2"], ("--actor.freezing_steps 2 warms up the critic, and "
                                                 "--algo.advantage.estimator group_norm trains none")),
    (SFTConfig, ["--train.optim", "sgd"], "--train.optim: unknown value 'sgd'"),
    (SFTConfig, ["--muon.lr", "0"], "--muon.lr must be"),
    (RSConfig, ["--sft.train.optim", "sgd"], "--sft.train.optim: unknown value 'sgd'"),
])
def test_bad_settings_are_one_line_errors(cls, argv, needle):
    with pytest.raises(ConfigError) as e:
        cls.from_args(argv)
    assert needle in str(e.value) and "\n" not in str(e.value)
