"""--actor.autocast auto: the probe's choice replaces it in the config where the run is built (not when the
flags are parsed: `plan` probes nothing), printed in one line."""

import pytest
import torch

import rlhfkit.models.precision as precision
from rlhfkit.api.builder import resolve_autocast
from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig

ARGV = ["--actor.model_name_or_path", "tiny", "--actor.device", "cpu"]


@pytest.mark.parametrize("speedup,choice,words", [(3.0, "bfloat16", "bfloat16 (bf16 matmuls run 3.0x float32's"),
                                                  (0.01, None, "float32 (bf16 matmuls run 100.0x slower")])
def test_auto_follows_the_bf16_probe_on_the_cpu(monkeypatch, capsys, speedup, choice, words):
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: speedup)
    parsed = RLConfig.from_args([*ARGV, "--actor.autocast", "auto"])
    assert parsed.actor.autocast == "auto" and not capsys.readouterr().out  # parsing probes nothing
    cfg = resolve_autocast(parsed)
    assert cfg.actor.autocast == choice
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("--actor.autocast auto: ") and words in lines[0]


def test_explicit_values_do_not_probe(monkeypatch):
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: pytest.fail("probed"))
    assert resolve_autocast(RLConfig.from_args([*ARGV, "--actor.autocast", "none"])).actor.autocast is None
    cfg = RLConfig.from_args([*ARGV, "--actor.autocast", "bfloat16"])
    assert cfg.actor.autocast == "bfloat16" and resolve_autocast(cfg) is cfg


def test_choose_autocast_on_cuda_follows_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert precision.choose_autocast(torch.device("cuda"))[0] is None


def test_a_bad_value_is_one_line_naming_auto(capsys):
    assert main(["plan", *ARGV, "--actor.autocast", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "auto" in err[0] and "actor.autocast" in err[0]
