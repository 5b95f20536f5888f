"""Tracking: metrics.jsonl, TensorBoard events read back, samples.jsonl, PNG plots, progress bar."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from rlhfkit.tracking import (
    CompletionLogger,
    MetricsWriter,
    ProgressBar,
    TensorBoardWriter,
    Tracker,
    plot_curves,
    read_metrics,
)
from rlhfkit.tracking.metrics import to_float

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def read_tensorboard(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# --------------------------------------------------------------------------- metrics.jsonl


def test_metrics_writer_one_line_per_step_with_floats(tmp_path):
    run = tmp_path / "run" / "nested"
    writer = MetricsWriter(run)
    writer.log(0, {"reward": torch.tensor(0.5), "kl": np.float32(0.25), "n": 3, "ok": True})
    # flushed before close: readable while the run goes on
    assert read_jsonl(run / "metrics.jsonl") == [
        {"step": 0, "reward": 0.5, "kl": 0.25, "n": 3.0, "ok": 1.0}
    ]
    writer.log(1, {"reward": torch.tensor([0.75]), "loss": float("nan")})
    writer.close()
    rows = read_jsonl(run / "metrics.jsonl")
    assert rows[1] == {"step": 1, "reward": 0.75, "loss": None}
    assert all(type(v) is float for v in rows[0].values() if v is not rows[0]["step"])


def test_metrics_writer_appends_across_writers(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.log(0, {"a": 1.0})
    with MetricsWriter(tmp_path) as w:
        w.log(1, {"a": 2.0})
    assert [r["a"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1.0, 2.0]


def test_metrics_writer_rejects_non_scalars(tmp_path):
    with MetricsWriter(tmp_path) as w:
        with pytest.raises(TypeError, match="metric 'rewards' is a Tensor"):
            w.log(0, {"rewards": torch.ones(3)})
        with pytest.raises(TypeError, match="metric 'name' is a str"):
            w.log(0, {"name": "x"})
        with pytest.raises(ValueError, match="'step' is reserved"):
            w.log(0, {"step": 1})
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_to_float():
    assert to_float(torch.tensor(2, dtype=torch.int64)) == 2.0
    assert to_float(np.array([1.5])) == 1.5
    assert math.isnan(to_float(float("nan")))
    with pytest.raises(TypeError):
        to_float(np.zeros(2), "x")


# --------------------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_read_back(tmp_path):
    with TensorBoardWriter(tmp_path / "tb") as tb:
        tb.log(0, {"reward": 0.0, "kl": torch.tensor(0.5)})
        tb.log(5, {"reward": 1.0})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    scalars = read_tensorboard(tmp_path / "tb")
    assert scalars["reward"] == [(0, 0.0), (5, 1.0)]
    assert scalars["kl"] == [(0, 0.5)]


def test_tracker_fans_out_to_jsonl_and_tensorboard(tmp_path):
    with Tracker(tmp_path) as tracker:
        for step in range(3):
            tracker.log(step, {"reward": torch.tensor(step / 4), "accuracy": step / 2})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows == [{"step": s, "reward": s / 4, "accuracy": s / 2} for s in range(3)]
    scalars = read_tensorboard(tmp_path / "tensorboard")
    assert scalars["reward"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert scalars["accuracy"] == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_tracker_with_its_own_tensorboard_dir(tmp_path):
    with Tracker(tmp_path / "run", tensorboard_dir=tmp_path / "tb") as tracker:
        tracker.log(7, {"kl": 0.25})
    assert read_tensorboard(tmp_path / "tb") == {"kl": [(7, 0.25)]}
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_tracker_without_tensorboard(tmp_path):
    tracker = Tracker(tmp_path, tensorboard=False)
    tracker.log(0, {"reward": 1.0})
    tracker.close()
    tracker.close()  # closing twice is harmless
    assert tracker.tensorboard is None
    assert not (tmp_path / "tensorboard").exists()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 0, "reward": 1.0}]


# --------------------------------------------------------------------------- samples.jsonl


def test_completion_logger_writes_given_fields(tmp_path):
    with CompletionLogger(tmp_path / "run") as log:
        n = log.log(
            3,
            [
                {"prompt": "1+1=", "response": " 2", "reward": torch.tensor(1.0),
                 "advantage": np.float64(0.5), "length": torch.tensor(2)},
                {"prompt": "caf\u00e9?", "response": "oui", "reward": 0.0, "ids": torch.tensor([4, 5])},
            ],
        )
        assert n == 2
        log.log(4, [{"prompt": "p", "response": "r", "advantage": float("inf")}])
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert rows == [
        {"step": 3, "prompt": "1+1=", "response": " 2", "reward": 1.0, "advantage": 0.5, "length": 2},
        {"step": 3, "prompt": "caf\u00e9?", "response": "oui", "reward": 0.0, "ids": [4, 5]},
        {"step": 4, "prompt": "p", "response": "r", "advantage": None},
    ]


def test_completion_logger_max_per_step_and_errors(tmp_path):
    with CompletionLogger(tmp_path, max_per_step=2) as log:
        assert log.log(0, [{"response": str(i)} for i in range(5)]) == 2
        with pytest.raises(ValueError, match="reserved"):
            log.log(1, [{"step": 9}])
        with pytest.raises(TypeError, match="not a dict"):
            log.log(1, ["text"])
    assert [r["response"] for r in read_jsonl(tmp_path / "samples.jsonl")] == ["0", "1"]


# --------------------------------------------------------------------------- plots


def test_plot_curves_writes_a_png_with_present_keys(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(6):
            w.log(step, {"reward": step / 5, "loss": float("nan") if step == 2 else 1.0 / (step + 1)})
    out = tmp_path / "plots" / "curves.png"
    present = plot_curves(tmp_path / "metrics.jsonl", out, keys=["reward", "accuracy", "loss"])
    assert present == ["reward", "loss"]
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_plot_curves_with_no_known_key_lists_what_exists(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.log(0, {"kl": 0.1})
    with pytest.raises(ValueError, match=r"none of the keys \['reward'\].*\['kl'\]"):
        plot_curves(tmp_path / "metrics.jsonl", tmp_path / "x.png", keys=["reward"])
    assert not (tmp_path / "x.png").exists()


def test_read_metrics_skips_torn_last_line_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward": 1.0}\n{"step": 1, "rew', encoding="utf-8")
    assert read_metrics(path) == [{"step": 0, "reward": 1.0}]
    path.write_text('{"step": 0\n{"step": 1, "reward": 1.0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 1"):
        read_metrics(path)


# --------------------------------------------------------------------------- progress


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_step_total_reward_kl_and_time_left():
    stream = FakeTTY()
    with ProgressBar(total=10, stream=stream) as bar:
        assert bar.enabled
        bar.update(3, {"reward": torch.tensor(0.4123), "kl": 0.00312, "loss": 9.0})
        bar.update(4, {"reward": 0.5})
    text = stream.getvalue()
    assert "train 3/10" in text and "reward=0.4123 kl=0.00312" in text
    assert "train 4/10" in text and "reward=0.5" in text
    assert "<" in text and "loss" not in text  # elapsed<remaining; unshown metrics left out


def test_progress_bar_custom_keys_and_resume():
    stream = FakeTTY()
    bar = ProgressBar(total=100, show={"acc": "eval/accuracy"}, initial=50, stream=stream, desc="rl")
    bar.update(51, {"eval/accuracy": 0.75})
    bar.close()
    assert "rl 51/100" in stream.getvalue() and "acc=0.75" in stream.getvalue()


def test_progress_bar_without_tty_requirement_draws_on_any_stream():
    stream = io.StringIO()
    bar = ProgressBar(total=4, stream=stream, require_tty=False)
    bar.update(2, {"kl": 0.5})
    bar.close()
    assert "train 2/4" in stream.getvalue() and "kl=0.5" in stream.getvalue()


@pytest.mark.parametrize("stream", [io.StringIO(), FakeTTY()])
def test_progress_bar_disabled_prints_nothing(stream):
    bar = ProgressBar(total=10, stream=stream, enabled=False)
    assert not bar.enabled and bar.mode is None
    bar.update(5, {"reward": 1.0})
    bar.close()
    assert stream.getvalue() == ""


class FakeClock:
    def __init__(self, *times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_progress_without_a_terminal_prints_one_plain_line_per_step():
    stream = io.StringIO()  # not a TTY: nohup, a batch scheduler, `| tee`
    bar = ProgressBar(total=10, stream=stream, clock=FakeClock(0.0, 5.0, 8.0, 8.5, 30.0))
    assert bar.mode == "lines"
    bar.update(2, {"reward": torch.tensor(0.5), "kl": 0.0123, "loss": 3.0})  # t=5: 2.5 s/step, 8 left x 2.5
    bar.update(3, {"reward": 1.0})  # t=8: 3 s since the last line; left = 8 / 3 x 7 = 18.7 s
    bar.update(3, {"eval/accuracy": 0.5})  # the same step again (e.g. a final evaluation): no timing
    bar.update(10, {"reward": 1.0, "kl": 0.5})  # t=30: 22 s over 7 steps; nothing left
    bar.close()
    assert stream.getvalue() == (
        "train 2/10 reward=0.5 kl=0.0123 2.50s/step 0:20 left\n"
        "train 3/10 reward=1 3.00s/step 0:19 left\n"
        "train 3/10\n"
        "train 10/10 reward=1 kl=0.5 3.14s/step\n")


def test_progress_lines_of_a_resumed_run_count_from_its_first_step():
    stream = io.StringIO()
    bar = ProgressBar(total=10, initial=4, stream=stream, clock=FakeClock(100.0, 104.0))
    bar.update(6, {"kl": 0.25})  # 2 steps in 4 s: 2 s/step, 4 steps left
    assert stream.getvalue() == "train 6/10 kl=0.25 2.00s/step 0:08 left\n"


def test_progress_goes_to_stdout_as_lines_when_stdout_is_not_a_terminal(capsys):
    bar = ProgressBar(total=3, show={"loss": "loss"}, desc="sft")  # capsys: stdout is not a TTY
    bar.update(1, {"loss": 2.0})
    out, err = capsys.readouterr()
    assert out.startswith("sft 1/3 loss=2 ") and out.endswith(" left\n") and err == ""


def test_run_tracker_prints_the_step_line_where_the_bar_would_be(tmp_path, capsys):
    from rlhfkit.tracking.run import RunTracker

    tracker = RunTracker(tmp_path, None, total_steps=2, progress=True, panels=False)
    tracker.log(1, {"reward": 0.25, "kl": 0.125})
    tracker.close()
    assert capsys.readouterr().out.startswith("train 1/2 reward=0.25 kl=0.125 ")


def test_format_seconds():
    from rlhfkit.tracking.progress import format_seconds

    assert [format_seconds(s) for s in (0, 42, 500, 3725, -3)] == ["0:00", "0:42", "8:20", "1:02:05", "0:00"]


def test_plot_panels_writes_one_png_per_panel_with_data(tmp_path):
    from rlhfkit.tracking.plots import plot_panels

    rows = [{"step": 1, "reward": 0.1, "kl": 0.0, "response_length": 5.0},
            {"step": 2, "reward": 0.4, "eval/pass@1": 0.5, "eval/maj@4": 0.6, "eval/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = plot_panels(tmp_path / "metrics.jsonl", tmp_path)
    assert sorted(p.name for p in written) == ["accuracy.png", "kl.png", "length.png", "reward.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)  # no entropy: no entropy.png


def test_wandb_offline_writes_a_local_run_without_network(tmp_path, monkeypatch):
    import glob
    import os
    import time

    from rlhfkit.tracking import Tracker
    from rlhfkit.tracking.wandb_writer import WandbWriter

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any network use would fail loudly
    writer = WandbWriter("rlhfkit-test", tmp_path, mode="offline", config={"lr": 0.1})
    assert os.environ["WANDB_MODE"] == "offline"
    with Tracker(tmp_path, tensorboard=False, writers=(writer,)) as tracker:
        tracker.log(1, {"reward": 0.25})
        tracker.log(2, {"reward": torch.tensor(0.75)})
    files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    for _ in range(120):  # wandb's service process may still be writing the file after finish()
        data = open(files[0], "rb").read()
        if b"0.75" in data:
            break
        time.sleep(0.25)
    assert b"reward" in data and b"0.75" in data
    with pytest.raises(ValueError, match="valid: online, offline, disabled"):
        WandbWriter("p", tmp_path, mode="cloud")
