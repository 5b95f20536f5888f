"""Conditional SFT's --data.reward_template is read by `train sft` only: the other supervised
commands refuse it in one line rather than ignore it."""

import pytest

from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.prm import PRMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError

TEMPLATE = ["--data.reward_template", "{input} <rm_score>: {reward} "]


@pytest.mark.parametrize("config, command", [(RMConfig, "train rm"), (DPOConfig, "train dpo"),
                                             (KTOConfig, "train kto"), (PRMConfig, "train prm")])
def test_only_sft_reads_the_reward_template(config, command):
    with pytest.raises(ConfigError, match=f"{command} does not read it"):
        config.from_args(TEMPLATE)


def test_sft_takes_the_reward_template():
    assert SFTConfig.from_args(TEMPLATE).data.reward_template == TEMPLATE[1]
