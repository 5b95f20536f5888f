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


def fake_gpu(monkeypatch, capability, name):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.version, "hip", None)


@pytest.mark.parametrize("capability,fsdp,choice,words", [
    ((8, 0), False, "bfloat16", "bfloat16 (A100 supports it)"),
    ((9, 0), True, "bfloat16", "bfloat16 (A100 supports it)"),
    # a T4 / V100: torch.cuda.is_bf16_supported() says yes (emulation), but bf16 would run many times slower
    ((7, 5), False, "float16", "float16 with dynamic loss scaling"),
    # under FSDP too: float32 shards computing in float16, the loss scaled as in one process
    ((7, 0), True, "float16", "float16 with dynamic loss scaling, over FSDP's float32 shards"),
])
def test_choose_autocast_on_cuda_follows_native_bf16(monkeypatch, capability, fsdp, choice, words):
    fake_gpu(monkeypatch, capability, "A100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    got, line = precision.choose_autocast(torch.device("cuda"), fsdp=fsdp)
    assert got == choice and words in line


def test_bf16_on_a_gpu_that_emulates_it_is_warned_in_one_line(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    line = precision.emulated_bf16_warning(torch.device("cuda"), "float32", "bfloat16")
    assert "Tesla T4, compute capability 7.5 has no native bf16" in line and "--actor.autocast auto" in line
    assert precision.emulated_bf16_warning(torch.device("cuda"), "bfloat16", None) == line
    assert precision.emulated_bf16_warning(torch.device("cuda"), "float32", "float16") is None
    assert precision.emulated_bf16_warning(torch.device("cpu"), "float32", "bfloat16") is None
    fake_gpu(monkeypatch, (8, 6), "RTX 3090")
    assert precision.emulated_bf16_warning(torch.device("cuda"), "float32", "bfloat16") is None


def test_a_bad_value_is_one_line_naming_auto(capsys):
    assert main(["plan", *ARGV, "--actor.autocast", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "auto" in err[0] and "actor.autocast" in err[0]


def test_the_run_warns_of_emulated_bf16_where_it_is_built(monkeypatch, caplog):
    import rlhfkit.api.builder as builder

    fake_gpu(monkeypatch, (7, 0), "Tesla V100")
    monkeypatch.setattr(builder, "run_device", lambda cfg: torch.device("cuda"))
    cfg = RLConfig.from_args(ARGV)  # the default --actor.autocast bfloat16
    with caplog.at_level("WARNING", logger="rlhfkit"):
        assert resolve_autocast(cfg) is cfg
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "Tesla V100, compute capability 7.0 has no native bf16"]


def test_auto_with_bf16_parameters_on_a_gpu_that_emulates_bf16_is_warned_too(monkeypatch, caplog, capsys):
    """auto picks float16 on a T4, but --actor.dtype bfloat16 keeps bf16 parameters (and the hf engine's bf16
    decode matmuls): the same warning as an explicit bf16 run."""
    import rlhfkit.api.builder as builder

    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    monkeypatch.setattr(builder, "run_device", lambda cfg: torch.device("cuda"))
    cfg = RLConfig.from_args([*ARGV, "--actor.autocast", "auto", "--actor.dtype", "bfloat16"])
    with caplog.at_level("WARNING", logger="rlhfkit"):
        assert resolve_autocast(cfg).actor.autocast == "float16"
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "Tesla T4, compute capability 7.5 has no native bf16"]
    assert capsys.readouterr().out.startswith("--actor.autocast auto: float16")
