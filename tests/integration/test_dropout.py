"""A policy whose config sets dropout (GPT-2's 0.1, Seed-OSS's attention and residual dropout) trains
without it by default: the update's forward then gives the rollout's logprobs (the gap ~1e-7 in fp32), as
on-policy ratios of 1 need; --actor.disable_dropout false keeps the config's dropout in the update."""

import json

import pytest

from rlhfkit.cli.main import main
from rlhfkit.models import tiny_model_and_tokenizer
from tests.integration.conftest import SEVENS_REWARD, rl_flags

DROPOUT = {"gpt2": {"resid_pdrop": 0.3, "embd_pdrop": 0.3, "attn_pdrop": 0.3},  # nn.Dropout modules
           "llama": {"attention_dropout": 0.3}}  # a rate the attention module passes to functional dropout


@pytest.mark.parametrize("arch", list(DROPOUT))
def test_the_update_runs_without_the_configs_dropout_unless_asked(arch, tmp_path, capsys):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch, **DROPOUT[arch])
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"q": f"{i}+{i}=", "a": str(2 * i)}) + "\n"
                                                    for i in range(4)))
    (tmp_path / "reward.py").write_text(SEVENS_REWARD)
    gaps = {}
    for disable in ("true", "false"):
        out = tmp_path / f"out_{disable}"
        argv = rl_flags(tmp_path, out, **{"rollout.batch_size": 2, "rollout.n_samples_per_prompt": 2,
                                          "rollout.max_new_tokens": 6, "train.batch_size": 4,
                                          "train.micro_batch_size": 4, "train.max_steps": 1, "train.num_threads": 1,
                                          "actor.disable_dropout": disable})
        assert main(["train", "rl", *map(str, argv)]) == 0
        (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        gaps[disable] = row["rollout/logprob_gap_max"]
    assert gaps["true"] < 1e-5 < 1e-2 < gaps["false"], gaps
    assert "dropout rates set to 0 for training" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out_true" / "final" / "config.json").read_text())
    assert all(saved[k] == v for k, v in DROPOUT[arch].items())  # the saved config keeps its rates
