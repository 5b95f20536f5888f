"""The demo computes in bf16 only where this CPU runs bf16 matmuls faster than float32."""

import pytest

from rlhfkit.cli import demo
from rlhfkit.models.precision import bf16_matmul_speedup


class Stop(Exception):
    pass


def demo_config(monkeypatch, speedup, argv=()):
    seen = {}

    def stop(cfg):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(demo, "bf16_matmul_speedup", lambda: speedup)
    monkeypatch.setattr(demo, "prepare_run_dir", stop)
    with pytest.raises(Stop):
        demo.run(list(argv))
    return seen["cfg"]


def test_the_probe_returns_a_positive_ratio():
    assert bf16_matmul_speedup(size=32, repeats=2) > 0


def test_demo_falls_back_to_float32_where_bf16_is_slow(monkeypatch, capsys):
    assert demo_config(monkeypatch, 0.02).actor.autocast is None
    assert "computes in float32" in capsys.readouterr().out
    assert demo_config(monkeypatch, 1.7).actor.autocast == "bfloat16"


def test_an_explicit_autocast_flag_wins(monkeypatch):
    assert demo_config(monkeypatch, 0.02, ["--actor.autocast", "bfloat16"]).actor.autocast == "bfloat16"
