"""The update under FSDP: a rank with fewer micro-batches than another pads with idle passes (each
runs as many backwards as a micro-batch, every one a collective, and adds nothing to the gradients);
--actor.dtype bfloat16 becomes float32 shards computing in bf16, and a vLLM engine samples in bf16 as the trainer
computes."""

import copy

import pytest
import torch

from rlhfkit.api.builder import resolve_fsdp_dtype
from rlhfkit.api.engines import vllm_dtype
from rlhfkit.config import RLConfig
from rlhfkit.config.checks import fsdp_param_dtype
from rlhfkit.data.types import Trajectory
from rlhfkit.distributed import fsdp
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.opd import TeacherLossUpdate
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate


def traj(prompt, response, group):
    n = len(response)
    return Trajectory(torch.tensor(prompt), torch.tensor(response), torch.ones(n, dtype=torch.bool),
                      torch.zeros(n), "stop", 0, group)


@pytest.fixture
def setup():
    model, tok = tiny_model_and_tokenizer(seed=0)
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 4), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=True, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=True, temperature=1.0, autocast=None)
    trajs = [traj([5, 6], [7, 8], 0), traj([5, 6], [9], 0), traj([5], [7, 8, 9], 1), traj([5], [9], 1)]
    return model, tok, maker(trajs, torch.tensor([1.0, 0.0, 0.0, 1.0]), kl_coef=0.0)


def make(kind, model, tok, dp=(0, 1), rank_max=None):
    learner = Learner(model, 1e-2, total_steps=10)
    args = (model, learner, MicroBatcher(tok.pad_token_id, 1), LossSettings(max_len=4))
    kw = dict(batch_size=4, max_epochs=1, shuffle_gen=torch.Generator().manual_seed(0), autocast=None, dp=dp,
              rank_max=rank_max)
    if kind == "teacher":
        return TeacherLossUpdate(*args, teacher=copy.deepcopy(model).requires_grad_(False), teacher_coef=1.0,
                                 teacher_topk=4, **kw)
    return PolicyUpdate(*args, **kw)


@pytest.mark.parametrize("kind", ["policy", "teacher"])
def test_idle_pass_runs_a_micro_batchs_backwards_with_zero_gradients(setup, kind, monkeypatch):
    model, tok, exp = setup
    update = make(kind, model, tok)
    calls = []
    monkeypatch.setattr(update.learner, "backward", lambda loss: (calls.append(1), loss.backward()))
    layout, rows = update.batcher.layout(exp.batch), torch.tensor([0])
    counts = dict(num_tokens=2, num_seqs=1, max_len=4)
    update.micro_step(exp, rows, layout, 0.0, counts)
    in_micro_step, calls[:] = len(calls), []
    model.zero_grad(set_to_none=True)
    update.idle_pass(exp, rows, layout)
    assert len(calls) == in_micro_step == (2 if kind == "teacher" else 1)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and not g.any() for g in grads)  # every parameter took part, with zeros


def test_a_rank_with_fewer_micro_batches_pads_to_the_largest_count(setup, monkeypatch):
    model, tok, exp = setup
    update = make("policy", model, tok, dp=(0, 2), rank_max=lambda n: n + 3)  # another rank cut 3 more
    passes = []
    monkeypatch.setattr(update, "idle_pass", lambda exp, rows, layout, train_actor=True: passes.append(rows.tolist()))
    out = update(exp, kl_coef=0.0)
    assert out["idle_passes"] == 3.0 and len(passes) == 3  # one optimizer step of 4 rows: 2 here, 2 there
    assert out["train_tokens"] > 0


def test_bf16_parameters_under_fsdp_become_float32_masters_computing_in_bf16(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    cfg = resolve_fsdp_dtype(RLConfig.from_args(["--fsdp.enable", "true", "--actor.dtype", "bfloat16"]))
    assert cfg.actor.dtype == "float32" and cfg.fsdp.mixed_precision is True
    assert capsys.readouterr().out == fsdp.BF16_PARAMS + "\n"
    monkeypatch.setenv("RANK", "1")  # the other torchrun ranks say nothing
    resolve_fsdp_dtype(RLConfig.from_args(["--fsdp.enable", "true", "--actor.dtype", "bfloat16"]))
    assert capsys.readouterr().out == ""
    for argv in (["--actor.dtype", "bfloat16"], ["--fsdp.enable", "true"]):  # one process; float32
        cfg = RLConfig.from_args(argv)
        assert resolve_fsdp_dtype(cfg) is cfg


@pytest.mark.parametrize("autocast", ["float16", "none"])
def test_fp16_parameters_under_fsdp_become_float32_masters_computing_in_fp16_with_a_loss_scale(
        capsys, monkeypatch, autocast):
    """--actor.dtype float16 under FSDP: float32 shards gathered in float16 (fsdp_param_dtype) under float16
    autocast, so the actor's (and a critic's) learner scales its loss as in one process."""
    monkeypatch.delenv("RANK", raising=False)
    argv = ["--fsdp.enable", "true", "--actor.dtype", "float16", "--actor.autocast", autocast]
    cfg = resolve_fsdp_dtype(RLConfig.from_args(argv))
    assert capsys.readouterr().out == fsdp.FP16_PARAMS + "\n"
    assert (cfg.actor.dtype, cfg.actor.autocast, cfg.fsdp.mixed_precision) == ("float32", "float16", True)
    assert fsdp_param_dtype(cfg.fsdp.mixed_precision, cfg.actor.dtype, cfg.actor.autocast) == "float16"
    assert fsdp_param_dtype(True, "float32", "bfloat16") == fsdp_param_dtype(True, "float32", None) == "bfloat16"
    assert fsdp_param_dtype(False, "float32", "float16") is None  # float32 shards under float16 autocast
    plain = RLConfig.from_args(["--fsdp.enable", "true", "--actor.autocast", "float16"])  # no longer refused
    assert resolve_fsdp_dtype(plain) is plain
    assert vllm_dtype(cfg) == "float16"


def test_vllm_samples_in_the_dtype_the_trainer_computes_in(monkeypatch):
    """Under FSDP --actor.dtype bfloat16 becomes float32 shards computing in bf16: vLLM gets bf16, as in one
    process (it used to get float32, the masters' dtype: twice the engine's weight memory, another precision
    than the trainer's forward)."""
    monkeypatch.setenv("RANK", "1")  # quiet

    def engine(*argv):
        return vllm_dtype(resolve_fsdp_dtype(RLConfig.from_args(["--rollout.engine", "vllm", *argv])))

    bf16 = ("--actor.dtype", "bfloat16", "--actor.autocast", "none")
    assert engine(*bf16) == engine("--fsdp.enable", "true", *bf16) == "bfloat16"
    assert engine("--fsdp.enable", "true", "--actor.autocast", "none", "--fsdp.mixed_precision", "true") == "bfloat16"
    fp32 = ("--actor.autocast", "none")
    assert engine(*fp32) == engine("--fsdp.enable", "true", *fp32) == "float32"
    assert engine("--fsdp.enable", "true", "--actor.dtype", "bfloat16") == "bfloat16"  # autocast's default
