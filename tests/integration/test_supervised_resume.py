"""Exact resume of `rlhfkit train sft|rm|dpo|kto|prm|kd`: a real CLI subprocess on the tiny model is killed
with SIGKILL (mid-step, or mid-way through writing a checkpoint), resumed with --ckpt.load_enable
(in this process: nothing but the checkpoint carries over), and must end with the same weights, metrics, optimizer state
and summary as the uninterrupted run, bit for bit (CPU, one thread). Also: a plain line per step on the console, wandb
logging through a stand-in wandb module, OpenRLHF's checkpoint and wandb flags, and a LoRA model's checkpoint round
trip."""

import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.lora import add_lora
from rlhfkit.trainers import checkpoint as ck
from rlhfkit.trainers.checkpoint import Checkpointer
from rlhfkit.trainers.supervised.loop import StepLoop, SupervisedState, build_learner

REPO = Path(__file__).resolve().parents[2]
# Runs the CLI, but SIGKILLs itself at the N-th call of Learner.step (after the step's backward
# passes, before its optimizer step) or of the checkpoint writer's fsync (mid-write).
KILLER = '''
import os, signal, sys
import rlhfkit.trainers.checkpoint as ckpt
from rlhfkit.trainers.learner import Learner
where, n, calls = sys.argv[1], int(sys.argv[2]), [0]
def killing(f):
    def call(*args):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return f(*args)
    return call
if where == "step":
    Learner.step = killing(Learner.step)
else:
    ckpt._fsync = killing(ckpt._fsync)
from rlhfkit.cli.main import main
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
sys.exit(main(sys.argv[3:]))
'''
STEPS = 6  # 12 items / batch 4 = 3 steps per epoch, 2 epochs: the kills land in the 2nd epoch
SFT = [{"input": f"{k}=", "output": v} for k, v in zip("abcdefghijkl", ["cat", "dog", "owl", "fox", "emu", "yak"] * 2)]
PAIRS = [{"prompt": f"q{i}:", "chosen": "7" * (1 + i % 3), "rejected": "1" * (1 + i % 3)} for i in range(12)]
KTO = [{"prompt": f"q{i}:", "output": ("7" if i % 2 else "1") * 2, "label": bool(i % 2)} for i in range(12)]
PRM = [{"input": f"{i % 5}+1={i % 5 + 1 + i % 2} #\n", "label": ["-" if i % 2 else "+"]} for i in range(12)]
DATA = {"sft": SFT, "rm": PAIRS, "dpo": PAIRS, "kto": KTO, "prm": PRM, "kd": SFT}
# Flags a kind needs besides the shared ones.
EXTRA = {"prm": {"data.placeholder_token": "#", "data.reward_tokens": "+"},
         "kd": {"kd.coef": 0.5}}  # the teacher: the run folder's "teacher" (another seed)
# Where each run is killed, and the step it resumes from (--ckpt.save_steps 2): ("step", n) = during
# optimizer step n (with n even, step n - 1 is trained and logged again); ("fsync", n) = mid-way
# through writing the 2nd checkpoint (one checkpoint takes about 14 fsyncs).
KILLS = {"sft": ("step", 4, 2), "rm": ("fsync", 17, 2), "dpo": ("fsync", 17, 2), "kto": ("step", 6, 4),
         "prm": ("step", 4, 2), "kd": ("fsync", 17, 2)}


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("supres")
    for kind, rows in DATA.items():
        (root / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "killer.py").write_text(KILLER)
    teacher, tok = tiny_model_and_tokenizer(seed=1)  # train kd's teacher: the tiny shape, other weights
    teacher.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    return root


def argv(ws, kind, out, **over):
    f = {"model.model_name_or_path": ws / "tiny", "data.dataset": ws / f"{kind}.jsonl",
         "data.eval_dataset": ws / f"{kind}.jsonl", "train.eval_steps": 2, "train.batch_size": 4,
         "train.micro_batch_size": 2, "train.max_epochs": 2, "train.num_threads": 1, "adam.lr": 1e-2,
         "train.lr_warmup_ratio": 0.2, "ckpt.save_steps": 2, "ckpt.max_num": 2, "ckpt.load_enable": "true",
         "ckpt.output_dir": out, **EXTRA.get(kind, {})}
    if kind == "kd":
        f["teacher.model_name_or_path"] = ws / "teacher"
    f.update(over)
    args = ["train", kind] + [x for k, v in f.items() for x in (f"--{k}", str(v))]
    if kind == "prm":  # two reward tokens: good, bad
        args.insert(args.index("--data.reward_tokens") + 2, "-")
    return args


def launch_killed(args, script, where, n):
    """`rlhfkit ARGS` in a subprocess that SIGKILLs itself at the `n`-th call of `where`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script), where, str(n), *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout


def rows(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time/step"} for line in path.read_text().splitlines()]


def tensors_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_same_run(ref, out):
    def same_tensors(rel):
        return tensors_equal(load_file(str(ref / rel)), load_file(str(out / rel)))

    assert same_tensors("final/model.safetensors")
    assert rows(out / "metrics.jsonl") == rows(ref / "metrics.jsonl")
    assert json.loads((out / "summary.json").read_text()) == json.loads((ref / "summary.json").read_text())
    assert same_tensors(f"checkpoints/step_{STEPS:08d}/state.safetensors")  # Adam, RNG and data-order states


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo", "kto", "prm", "kd"])
def test_sigkill_then_resume_equals_the_uninterrupted_run(ws, kind, tmp_path, capsys):
    ref = tmp_path / "ref"
    assert main(argv(ws, kind, ref)) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("train ")]
    assert [x.split()[1] for x in lines] == [f"{i}/{STEPS}" for i in range(1, STEPS + 1)]  # a line per step
    assert re.match(r"train 1/6 loss=\S+ " + (r"acc=\S+ " if kind in ("rm", "dpo", "prm") else ""), lines[0]), lines[0]
    assert sorted(p.name for p in (ref / "checkpoints").glob("step_*")) == ["step_00000004", "step_00000006"]
    assert len(rows(ref / "metrics.jsonl")) == STEPS + 1  # and the final evaluation

    out = tmp_path / "run"
    where, n, resumed = KILLS[kind]
    rc, log = launch_killed(argv(ws, kind, out), ws / "killer.py", where, n)
    assert rc == -signal.SIGKILL, log
    if where == "fsync":
        assert list((out / "checkpoints").glob(".tmp.step_*"))  # the torn write is left behind
    assert main(argv(ws, kind, out)) == 0  # the resumed run: a fresh process state but for the checkpoint
    assert f"(step {resumed} of {STEPS})" in capsys.readouterr().out
    assert_same_run(ref, out)
    assert not list((out / "checkpoints").glob(".t*"))  # torn temporary folders were cleaned up


FP16 = {"model.dtype": "float16", "model.autocast": "float16", "train.loss_scale.initial_scale_power": 14,
        "train.loss_scale.window": 2}


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_fp16_loss_scale_resumes_exactly(ws, kind, tmp_path, capsys):
    """float16 with dynamic loss scaling, the scale doubling every 2 good steps (2^14 first): killed during
    optimizer step 4 and resumed from step 2's checkpoint, the run ends bit for bit as the uninterrupted one,
    its loss scales included (a scale not restored would restart at 2^14 and scale the gradients otherwise)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(argv(ws, kind, ref, **FP16)) == 0
    scales = [r["loss_scale"] for r in rows(ref / "metrics.jsonl") if "loss_scale" in r]
    assert scales[:4] == [2.0**14, 2.0**15, 2.0**15, 2.0**16] and len(scales) == STEPS
    rc, log = launch_killed(argv(ws, kind, out, **FP16), ws / "killer.py", "step", 4)
    assert rc == -signal.SIGKILL, log
    assert main(argv(ws, kind, out, **FP16)) == 0
    assert f"(step 2 of {STEPS})" in capsys.readouterr().out
    assert_same_run(ref, out)


def test_checkpoints_of_an_earlier_run_need_load_enable(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(argv(ws, "sft", out, **{"train.max_epochs": 1, "ckpt.load_enable": "false"})) == 0
    capsys.readouterr()
    assert main(argv(ws, "sft", out, **{"train.max_epochs": 1, "ckpt.load_enable": "false"})) == 2
    err = capsys.readouterr().err
    assert "already holds checkpoints of an earlier run; pass --ckpt.load_enable true" in err
    assert len(err.strip().splitlines()) == 1


class FakeWandb(types.ModuleType):
    """Records what rlhfkit hands to wandb: init's arguments, each log call, finish."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def finish(self):
        self.finished += 1


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo", "kto"])
def test_supervised_runs_log_each_step_to_wandb(ws, kind, tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline mode sets it; restored after the test
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = tmp_path / "run"
    flags = argv(ws, kind, out, **{"train.max_epochs": 1, "ckpt.save_steps": -1, "logger.progress_bar": "false"})
    assert main([*flags, "--use_wandb", "KEY", "--wandb_run_name", "r1", "--logger.wandb.mode", "offline"]) == 0
    (init,) = fake.inits
    assert (init["project"], init["name"], init["mode"]) == (f"openrlhf_train_{kind}", "r1", "offline")
    assert init["config"]["train"]["batch_size"] == 4 and init["dir"] == str(out)
    assert [s for s, _ in fake.logged] == [1, 2, 3, 3]  # each step, then the final evaluation
    assert "loss" in fake.logged[0][1] and fake.finished == 1
    assert fake.logged[0][1]["loss"] == rows(out / "metrics.jsonl")[0]["loss"]


def test_lora_model_checkpoint_round_trip(tmp_path):
    """A LoRA model is checkpointed as one state dict (base and adapter weights) and loads back."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    model = add_lora(model, 4, 8, "all-linear", 0.0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.5)
    path = ck.save_checkpoint(tmp_path, 1, {}, {"model": (model, tok)}, 2)
    assert (path / "model.safetensors").is_file() and ck.verify(path) is None
    fresh = add_lora(tiny_model_and_tokenizer(seed=0)[0], 4, 8, "all-linear", 0.0)
    ck.load_checkpoint(path, {"model": (fresh, tok)})
    assert tensors_equal(fresh.state_dict(), model.state_dict())


@pytest.mark.parametrize("config_class", [SFTConfig, RMConfig, DPOConfig, KTOConfig])
def test_openrlhf_checkpoint_and_wandb_flags_map(config_class):
    cfg = config_class.from_args(["--save_steps", "5", "--max_ckpt_num", "2", "--load_checkpoint",
                                  "--ckpt_path", "/ds/ckpt", "--use_wandb", "KEY", "--wandb_group", "g"])
    assert (cfg.ckpt.save_steps, cfg.ckpt.max_num, cfg.ckpt.load_enable) == (5, 2, True)
    kind = {SFTConfig: "sft", RMConfig: "rm", DPOConfig: "dpo", KTOConfig: "kto"}[config_class]
    assert (cfg.logger.wandb.project, cfg.logger.wandb.group) == (f"openrlhf_train_{kind}", "g")
    assert config_class.from_args(["--wandb_project", "p"]).logger.wandb.project is None  # not without --use_wandb


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("ckpt.save_steps", "0", "--ckpt.save_steps must be -1 or >= 1 (got 0)"),
    ("ckpt.max_num", "0", "--ckpt.max_num must be >= 1 (got 0)"),
    ("logger.wandb.mode", "cloud", "--logger.wandb.mode: unknown value 'cloud'; valid: online, offline, disabled"),
])
def test_bad_checkpoint_and_wandb_flags_fail_in_one_line(ws, tmp_path, capsys, flag, value, message):
    assert main(argv(ws, "dpo", tmp_path / "run", **{flag: value})) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


class CountingAlgorithm:
    """A supervised algorithm with state of its own (through the optional hooks): a running count of
    the items it has seen, on a linear model."""

    def __init__(self, items):
        torch.manual_seed(0)
        self.model, self.tokenizer, self.seen = torch.nn.Linear(2, 1), None, torch.zeros(())
        train = types.SimpleNamespace(batch_size=2, micro_batch_size=1, max_epochs=3, max_steps=None, seed=3,
                                      eval_steps=-1, lr_warmup_ratio=0.0, lr_warmup_steps=-1,
                                      lr_scheduler="constant", min_lr_ratio=0.0,
                                      max_norm=1.0, optim="adam")
        adam = types.SimpleNamespace(lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
        self.loop = StepLoop(build_learner(self.model, adam, train, 9), items, train)

    def micro_loss(self, items, step_items):
        self.seen += len(items)
        x = torch.tensor(items, dtype=torch.float32)
        loss = (self.model(x).squeeze(-1) - x.sum(-1)).pow(2).sum() / len(step_items)
        return loss, {"loss": float(loss.detach())}

    def extra_state_dict(self):
        return {"seen": self.seen}

    def load_extra_state_dict(self, state):
        self.seen = state["seen"].clone()


def test_supervised_state_saves_the_loop_and_the_algorithms_own_state(tmp_path):
    """Stopped after 4 of 9 steps (a mid-epoch checkpoint) and resumed in a fresh algorithm, the run ends
    as the uninterrupted one: weights, optimizer, data order and the algorithm's own counter."""
    items = [[float(i), float(i % 3)] for i in range(7)]  # 3 steps per epoch, 1 item dropped each epoch
    whole = CountingAlgorithm(items)
    whole.loop.fit(whole.micro_loss)
    first = CountingAlgorithm(items)
    first.loop.total_steps = 4
    first.loop.fit(first.micro_loss)
    ckpt = Checkpointer(tmp_path, save_steps=-1, max_num=1)
    ckpt.save(SupervisedState(first))
    resumed = CountingAlgorithm(items)
    ckpt.load(SupervisedState(resumed), ck.latest_good(tmp_path)[0])
    assert (resumed.loop.step, resumed.loop.pos, resumed.seen.item()) == (4, 2, 8.0)
    resumed.loop.fit(resumed.micro_loss)
    assert tensors_equal(resumed.model.state_dict(), whole.model.state_dict())
    assert resumed.seen.item() == whole.seen.item() == 18.0 and resumed.loop.order == whole.loop.order
