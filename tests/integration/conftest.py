"""Shared set-up of the integration tests: a folder with the tiny model saved as `tiny/`, the
prompts and, when asked, the "sevens" reward file."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer

# Reward: the share of response characters that are "7" (dense, learnable by a tiny model).
SEVENS_REWARD = '''
import torch

def reward_func(queries, prompts, labels, **kwargs):
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    r = torch.tensor([sum(c == "7" for c in s) / 8.0 for s in responses])
    return {"rewards": r, "scores": r.clamp(0, 1), "extra_logs": {"sevens": r * 8}}
'''


# A `vllm` package that stands in for vLLM in other processes (tests/fakes/vllm: an HF model behind the
# real weight-sync extension); never imported into the test process, where vLLM must stay absent.
FAKES = Path(__file__).resolve().parents[1] / "fakes"


def fake_vllm_env(log: Path) -> dict[str, str]:
    """Environment variables of a process whose `import vllm` is the fake, which logs to `log`."""
    paths = [str(FAKES), str(FAKES.parents[1]), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "FAKE_VLLM_LOG": str(log)}


def fake_vllm_events(log: Path) -> list[dict]:
    """The fake engines' records (init, generate, load), in the order they were written."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(autouse=True)
def restore_threads():
    """Runs use --train.num_threads 1 (tiny models are faster on one thread); give the process its
    thread count back afterwards."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_ws(tmp_path_factory):
    """`tiny_ws(name, rows=None, sevens=False)`: a fresh folder with the tiny model + tokenizer in
    `tiny/`, when `rows` are given those records in `prompts.jsonl`, and with `sevens` the
    SEVENS_REWARD file as `reward.py`."""

    def make(name, rows=None, sevens=False):
        root = tmp_path_factory.mktemp(name)
        model, tok = tiny_model_and_tokenizer(seed=0)
        model.save_pretrained(root / "tiny")
        tok.save_pretrained(root / "tiny")
        if rows is not None:
            (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if sevens:
            (root / "reward.py").write_text(SEVENS_REWARD)
        return root

    return make


def cli_flags(values: dict) -> list[str]:
    """`{"section.name": value}` as command-line flags: `--section.name VALUE`; a None value leaves the flag
    out, a tuple gives several values (`--actor.eps_clip_low_high 0.2 0.28`)."""
    argv: list[str] = []
    for name, value in values.items():
        if value is not None:
            argv += [f"--{name}", *(map(str, value) if isinstance(value, tuple) else [str(value)])]
    return argv


def rl_flags(ws, out, **over) -> list[str]:
    """The flags of a tiny `train rl` run in the workspace `ws` (`tiny/`, `prompts.jsonl` with keys q and a,
    `reward.py`) writing to `out`; `over` (dotted names) adds or replaces flags, None drops one."""
    return cli_flags({"actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "prompts.jsonl",
                      "data.input_key": "q", "data.label_key": "a", "reward.remote_url": ws / "reward.py",
                      "actor.autocast": "none", "logger.progress_bar": "false", "ckpt.output_dir": out, **over})


def refuse(argv, capsys, needle):
    """`rlhfkit ARGV` exits with code 2 and one line `error: ...` containing `needle`, no traceback; returns it."""
    from rlhfkit.cli.main import main

    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert rc == 2, err
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def colour_workspace(root):
    """`root` with a tiny random Qwen2-VL in `vlm/`, the colour task (16 training images) in `colours/` and
    `varied.py` (a reward that varies within groups); returns `root`."""
    from rlhfkit.data.synthetic_vision import write_colour_task
    from rlhfkit.models.tiny_vision import save_tiny_vision
    from tests.integration.test_vision_rl import VARIED_REWARD

    save_tiny_vision(root / "vlm", "qwen2_vl")
    write_colour_task(root / "colours", n_train=16, n_test=4)
    (root / "varied.py").write_text(VARIED_REWARD)
    return root


def vision_rl_flags(ws, out, **over) -> list[str]:
    """The flags of a tiny `train rl` run of the colour task in a `colour_workspace` `ws` writing to `out`
    (2 steps of 4 prompts x 2 samples); `over` (dotted names) adds or replaces flags."""
    return cli_flags({
        "actor.model_name_or_path": ws / "vlm", "data.prompt_dataset": ws / "colours" / "train.jsonl",
        "data.input_key": "prompt", "data.label_key": "label", "data.image_key": "images",
        "reward.remote_url": ws / "varied.py", "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 2,
        "rollout.max_new_tokens": 4, "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": 2,
        "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant", "actor.autocast": "none",
        "logger.progress_bar": "false", "train.num_threads": 1, "ckpt.output_dir": out, **over})


def worker_module(script: Path):
    """A torchrun worker script of tests/integration imported as a module (its helpers, for the one-process run)."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun_worker(script: Path, *args: str) -> None:
    """`script ARGS` in 2 torchrun processes (gloo on the CPU); it must exit 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
