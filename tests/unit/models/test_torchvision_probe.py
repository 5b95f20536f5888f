"""A torchvision that does not import beside this torch (PyPI's Linux wheels are CUDA builds; beside a
CPU torch their operators fail to register) is named in one line before anything loads or is written,
instead of transformers' "Could not import module ..." from deep inside the model's loading."""

import json

import pytest

from rlhfkit.cli.main import main
from rlhfkit.errors import ConfigError
from rlhfkit.models.tiny_vision import save_tiny_vision
from rlhfkit.models.vision import check_torchvision

BROKEN = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def install_broken_torchvision(folder, monkeypatch):
    (folder / "site" / "torchvision").mkdir(parents=True)
    (folder / "site" / "torchvision" / "__init__.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(folder / "site"))


def test_an_absent_torchvision_is_fine():
    assert check_torchvision() is None  # the test environment has none: processors are built image-only


def test_a_torchvision_that_does_not_import_is_named(tmp_path, monkeypatch):
    install_broken_torchvision(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"torchvision is installed but does not import beside torch .*"
                                          r"RuntimeError: operator torchvision::nms does not exist"):
        check_torchvision()


def test_train_rl_with_a_vlm_stops_in_one_line_before_writing_anything(tmp_path, monkeypatch, capsys):
    ws = tmp_path
    save_tiny_vision(ws / "vlm", "qwen2_vl")  # built before the broken torchvision is importable
    from PIL import Image

    Image.new("RGB", (32, 32), (220, 40, 40)).save(ws / "red.png")
    row = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}],
           "images": ["red.png"], "label": "red"}
    (ws / "data.jsonl").write_text(json.dumps(row) + "\n")
    install_broken_torchvision(ws, monkeypatch)
    (ws / "reward.py").write_text("def reward_func(queries, prompts, labels, **kw):\n    return [0.0] * len(queries)\n")
    out = ws / "run"
    rc = main(["train", "rl", "--actor.model_name_or_path", str(ws / "vlm"), "--data.prompt_dataset",
               str(ws / "data.jsonl"), "--data.input_key", "prompt", "--data.label_key", "label",
               "--reward.remote_url", str(ws / "reward.py"), "--rollout.batch_size", "1",
               "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "2", "--train.micro_batch_size", "2",
               "--ckpt.output_dir", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(lines) == 1 and "torchvision is installed but does not import" in lines[0], err
    assert "Traceback" not in err and not out.exists()
