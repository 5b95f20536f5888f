"""Real RL loops on a tiny model: every estimator raises the reward of a toy task within seconds,
parameters move, the saved folder reloads, and micro-batch 1 x accumulation equals one batch."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.api.rl import RLTrainer
from rlhfkit.cli import train_rl
from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig


@pytest.fixture(scope="module")
def workspace(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(64)]
    root = tiny_ws("rl", rows, sevens=True)
    return root


def base_flags(ws, out, **over):
    flags = {
        "actor.model_name_or_path": str(ws / "tiny"),
        "data.prompt_dataset": str(ws / "prompts.jsonl"),
        "data.input_key": "q",
        "data.label_key": "a",
        "reward.remote_url": str(ws / "reward.py"),
        "rollout.batch_size": "8",
        "rollout.n_samples_per_prompt": "4",
        "rollout.max_new_tokens": "8",
        "rollout.temperature": "1.0",
        "train.batch_size": "32",
        "train.micro_batch_size": "16",
        "train.max_steps": "14",
        "train.num_episodes": "3",
        "actor.adam.lr": "1e-2",
        "actor.lr_scheduler": "constant",
        "actor.autocast": "none",
        "logger.progress_bar": "false",
        "ckpt.output_dir": str(out),
    }
    flags.update(over)
    argv = []
    for k, v in flags.items():
        argv += [f"--{k}", v]
    return argv


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


ESTIMATORS = [
    ("group_norm", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_baseline", {"algo.kl.init_coef": "0.01", "algo.kl.use_loss": "true", "algo.kl.estimator": "k3"}),
    ("reinforce", {"algo.kl.init_coef": "0.01", "algo.kl.estimator": "k1"}),
    ("gae", {"algo.advantage.gamma": "1.0", "algo.advantage.lambd": "0.95", "critic.adam.lr": "1e-2"}),
]


@pytest.mark.parametrize("estimator,extra", ESTIMATORS, ids=[e for e, _ in ESTIMATORS])
def test_reward_rises_for_every_estimator(workspace, tmp_path, estimator, extra):
    out = tmp_path / estimator
    argv = base_flags(workspace, out, **{"algo.advantage.estimator": estimator, **extra})
    assert train_rl.run(argv) == 0
    rewards = [m["reward"] for m in read_metrics(out) if "reward" in m]
    assert len(rewards) == 14
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.15, f"{estimator}: reward {first:.3f} -> {last:.3f}"
    # parameters moved, and the saved folder is a loadable HF model
    before = load_file(str(workspace / "tiny" / "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out / "final")
    assert reloaded.config.vocab_size == before["model.embed_tokens.weight"].shape[0]
    assert (out / "tensorboard").is_dir() and any((out / "tensorboard").iterdir())
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _one_step_grads(ws, out, micro, **extra):
    """Gradients accumulated for the first optimizer step (compared before Adam, whose first
    step is sign-like and would amplify float noise in near-zero gradients)."""
    argv = base_flags(ws, out, **{"train.micro_batch_size": micro, "train.max_steps": "1",
                                  "algo.advantage.estimator": "group_norm", **extra})
    trainer = RLTrainer.from_config(RLConfig.from_args(argv), train_dataset=lambda tok: _examples(ws))
    learner = trainer.loop.update.learner
    grads, step = {}, learner.step

    def capture():
        grads.update({k: p.grad.clone() for k, p in trainer.policy.named_parameters() if p.grad is not None})
        return step()

    learner.step = capture
    trainer.loop.train()
    trainer.tracker.close()
    return grads


def _examples(ws):
    from rlhfkit.data.prompts import load_prompts

    return load_prompts(str(ws / "prompts.jsonl"), input_key="q", label_key="a", shuffle_seed=42)


def test_micro_batch_accumulation_equals_full_batch(workspace, tmp_path):
    full = _one_step_grads(workspace, tmp_path / "full", "32")
    accum = _one_step_grads(workspace, tmp_path / "accum", "1")
    assert full.keys() == accum.keys() and len(full) > 0
    assert any(g.abs().max() > 1e-4 for g in full.values())
    for k in full:
        torch.testing.assert_close(accum[k], full[k], rtol=1e-4, atol=1e-6, msg=k)


GAE_KL = {"algo.advantage.estimator": "gae", "algo.kl.init_coef": "0.05", "critic.adam.lr": "1e-3",
          "train.batch_size": "16", "train.micro_batch_size": "4"}  # old, reference and value passes all run


@pytest.mark.parametrize("extra", [
    {},
    {"train.dynamic_batch_enable": "true", "train.max_tokens_per_micro_batch": "40"},
    GAE_KL,
], ids=["group_norm", "dynamic_batch", "gae_kl"])
def test_shared_prefix_and_token_budget_give_the_padded_gradients(workspace, tmp_path, extra):
    """The shared-prefix layout (each prompt computed once per row) and micro-batches cut by a token
    budget change only the float summation order: the first step's gradients equal the padded
    layout's in sample-count micro-batches."""
    micro = extra.get("train.micro_batch_size", "16")
    padded = _one_step_grads(workspace, tmp_path / "padded", micro, **{**extra, "train.shared_prefix_enable": "false",
                                                                        "train.dynamic_batch_enable": "false"})
    shared = _one_step_grads(workspace, tmp_path / "shared", micro, **extra)
    assert padded.keys() == shared.keys() and any(g.abs().max() > 1e-4 for g in padded.values())
    for k in padded:
        torch.testing.assert_close(shared[k], padded[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("flags,needle", [
    (["--train.batch_size", "24", "--train.micro_batch_size", "16"], "must be a multiple of --train.micro_batch_size"),
    (["--train.batch_size", "12", "--train.micro_batch_size", "4"], "which --train.batch_size (12) must divide"),
    (["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "1",
      "--train.batch_size", "8"], "set --rollout.n_samples_per_prompt to 2 or more"),
    (["--algo.advantage.estimator", "grpo"], "valid: gae, reinforce"),
    (["--rollout.n_sample_per_prompt", "4"], "did you mean --rollout.n_samples_per_prompt"),
    (["--algo.kl.init_coef", "-0.1"], "must be >= 0"),
    (["--train.seed", "abc"], "expected int"),
])
def test_cli_refuses_bad_configurations_before_loading(workspace, tmp_path, capsys, flags, needle):
    argv = ["train", "rl", "--actor.model_name_or_path", str(tmp_path / "does_not_exist"),
            "--data.prompt_dataset", str(workspace / "prompts.jsonl"), "--rollout.batch_size", "8",
            "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "32", "--train.micro_batch_size", "8", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("beta", ["0.0", "1.0"])
def test_ema_folder_is_saved_beside_the_final_model(workspace, tmp_path, beta):
    """beta 0: the EMA is the last weights (ema/ equals final/); beta 1: it never moves from the
    initial weights (ema/ equals the starting model), while final/ has moved."""
    out = tmp_path / "run"
    assert main(["train", "rl", *base_flags(workspace, out, **{"actor.ema_beta": beta, "train.max_steps": "2"})]) == 0
    final = load_file(out / "final" / "model.safetensors")
    ema = load_file(out / "ema" / "model.safetensors")
    init = load_file(workspace / "tiny" / "model.safetensors")
    want = final if beta == "0.0" else init
    assert ema.keys() == final.keys()
    for k in final:
        assert torch.equal(ema[k], want[k]), k
    assert any(not torch.equal(final[k], init[k]) for k in final)


@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_bf16_parameters_train_through_float32_masters(workspace, tmp_path, autocast):
    """--actor.dtype bfloat16: the run trains and the reward still rises; the saved model is bf16, but
    under bf16 autocast its norm weights are float32 (models.precision.vectors_to_float32)."""
    out = tmp_path / "run"
    flags = base_flags(workspace, out, **{"actor.dtype": "bfloat16", "actor.autocast": autocast})
    assert main(["train", "rl", *flags]) == 0
    final = load_file(out / "final" / "model.safetensors")
    init = load_file(workspace / "tiny" / "model.safetensors")
    vector = torch.float32 if autocast == "bfloat16" else torch.bfloat16
    assert all(v.dtype == (torch.bfloat16 if v.dim() > 1 else vector) for v in final.values())
    assert any(v.dim() == 1 for v in final.values())
    assert any(not torch.equal(final[k].float(), init[k].float()) for k in final)
    rewards = [m["reward"] for m in read_metrics(out)]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards


@pytest.mark.slow  # about 80 s, most of it torch.compile; run with -m slow
def test_compiled_layers_give_the_eager_gradients_and_leave_the_rollout_eager(workspace, tmp_path):
    """--train.compile_enable: the first optimizer step's gradients equal the eager run's (inductor
    reorders float sums only); outside the update the layers are plain modules again."""
    eager = _one_step_grads(workspace, tmp_path / "eager", "16")
    compiled = _one_step_grads(workspace, tmp_path / "compiled", "16", **{"train.compile_enable": "true"})
    assert eager.keys() == compiled.keys() and any(g.abs().max() > 1e-4 for g in eager.values())
    for k in eager:
        torch.testing.assert_close(compiled[k], eager[k], rtol=1e-4, atol=1e-6, msg=k)


def test_compile_without_a_cpp_compiler_is_refused_in_one_line(monkeypatch):
    from rlhfkit.errors import ConfigError
    from rlhfkit.models import tiny_model_and_tokenizer
    from rlhfkit.models.compile import CompiledLayers

    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ConfigError, match="needs a C\\+\\+ compiler"):
        CompiledLayers(tiny_model_and_tokenizer(seed=0)[0])


def test_compiled_layers_swap_in_only_inside_active():
    from rlhfkit.models import tiny_model_and_tokenizer
    from rlhfkit.models.compile import CompiledLayers

    model, _ = tiny_model_and_tokenizer(seed=0)
    layers = model.model.layers
    compiled = CompiledLayers(model)
    assert all("forward" not in vars(layer) for layer in layers)
    with compiled.active():
        assert [vars(layer)["forward"] for layer in layers] == compiled.forwards
    assert all("forward" not in vars(layer) for layer in layers)
