"""The catalogue of docs/errors.md, case by case, through the real CLI (`rlhfkit train rl`):
each bad input ends with exit code 2 and one line `error: ...` naming the cause and the fix (no
traceback), or with a documented, logged fallback. Case ids match the catalogue's numbers."""

import errno
import json
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlhfkit.cli.main import main
from rlhfkit.models import load_tokenizer, tiny_model_and_tokenizer
from rlhfkit.models.reward import init_reward_model
from rlhfkit.trainers import checkpoint as ck
from tests.integration.conftest import refuse, rl_flags

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GOOD_REWARD = "def reward_func(queries, prompts, labels, **kw):\n    return [float(len(q) % 2) for q in queries]\n"
AGENT_RAISES = """
from rlhfkit.agents import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    async def reset(self, states, **kwargs):
        return {"observation": states["observation"]}

    async def step(self, states, **kwargs):
        raise ValueError("the environment broke")
"""

AGENT_FUNCTION_BUGGY = """
async def agent(client, prompt, label, **row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
    return undefined_score
"""

REWARDS = {
    "raises": "def reward_func(queries, prompts, labels, **kw):\n    raise KeyError('answer')\n",
    "nan": "def reward_func(queries, prompts, labels, **kw):\n    return [float('nan')] * len(queries)\n",
    "inf": "def reward_func(queries, prompts, labels, **kw):\n    return {'rewards': [float('inf')] * len(queries)}\n",
    "short": "def reward_func(queries, prompts, labels, **kw):\n    return [0.0] * (len(queries) - 1)\n",
    "string": "def reward_func(queries, prompts, labels, **kw):\n    return 'good'\n",
    "no_rewards_key": "def reward_func(queries, prompts, labels, **kw):\n    return {'score': [0.0] * len(queries)}\n",
    "hangs": "import time\ndef reward_func(queries, prompts, labels, **kw):\n    time.sleep(30)\n",
    "import_error": "import no_such_module_xyz\n",
    "undefined": "def score(queries):\n    return []\n",
    "bad_signature": "def reward_func(queries):\n    return []\n",
    # finite but so large that the unwhitened REINFORCE loss overflows from the 3rd call on
    "huge": "CALLS = [0]\ndef reward_func(queries, prompts, labels, **kw):\n    CALLS[0] += 1\n"
            "    return [3e38 if CALLS[0] > 2 else float(i % 2) for i in range(len(queries))]\n",
}


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(16)]
    root = tiny_ws("errors", rows)
    model, tok = tiny_model_and_tokenizer(seed=0)
    (root / "not_a_model").mkdir()
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")  # a diverged (or badly converted) policy
    model.save_pretrained(root / "nan_model")
    tok.save_pretrained(root / "nan_model")
    long_rows = rows[:8] + [{"q": "z" * 300, "a": "0"}] * 3
    (root / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long_rows))
    (root / "malformed.jsonl").write_text('{"q": "a", "a": "1"}\n{"q": "b", "a": \n')
    (root / "no_label.jsonl").write_text('{"q": "a", "a": "1"}\n{"q": "b"}\n')
    (root / "empty.jsonl").write_text("\n")
    (root / "latin1.jsonl").write_bytes('{"q": "caf\xe9", "a": "1"}\n'.encode("latin-1"))
    (root / "not_string.jsonl").write_text('{"q": 42, "a": "1"}\n')
    (root / "list.jsonl").write_text('[1, 2]\n')
    (root / "empty_prompt.jsonl").write_text('{"q": "a", "a": "1"}\n{"q": "", "a": "2"}\n')
    (root / "null_label.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5] + [{"q": "b", "a": None}]))
    (root / "prompts.xlsx").write_bytes(b"PK")
    (root / "bad.parquet").write_bytes(b"PAR1 not really")
    (root / "bad.json").write_text('{"q": [1,}')
    (root / "bad.yaml").write_text("train: [1, 2\n")
    (root / "unknown_key.yaml").write_text("train:\n  batchsize: 8\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "reward.py").write_text(GOOD_REWARD)
    damaged_models(root)
    (root / "a_file").write_text("not a folder")
    (root / "agent_raises.py").write_text(AGENT_RAISES)
    (root / "agent_function_buggy.py").write_text(AGENT_FUNCTION_BUGGY)
    for name, text in REWARDS.items():
        (root / f"reward_{name}.py").write_text(text)
    return root


def damaged_models(root):
    """Copies of the tiny model, each with one file damaged as downloads and disks damage them."""
    def copy(name):
        shutil.copytree(root / "tiny", root / name)
        return root / name

    weights = copy("truncated_weights") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy("garbage_weights") / "model.safetensors").write_bytes(b"<html>404 Not Found</html>" * 4)
    (copy("garbage_config") / "config.json").write_text('{"model_type": "llama", ')
    (copy("garbage_tokenizer") / "tokenizer.json").write_text("version https://git-lfs.github.com/spec/v1\n")
    other = copy("foreign_weights")  # weights of another model under this config.json
    save_file({"transformer.wte.weight": torch.zeros(4, 4)}, str(other / "model.safetensors"))
    for f in copy("no_tokenizer").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    tok = load_tokenizer(root / "tiny")
    init_reward_model(root / "tiny", tok.pad_token_id).save_pretrained(root / "truncated_rm")
    weights = root / "truncated_rm" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def flags(ws, out, **over):
    return ["train", "rl", *rl_flags(ws, out, **{
        "rollout.batch_size": 8, "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 4,
        "train.batch_size": 16, "train.micro_batch_size": 8, "train.max_steps": 1, **over})]


# (catalogue number, flag overrides, text the one-line message must contain)
BEFORE_MODELS = [
    ("01-malformed-jsonl", {"data.prompt_dataset": "{ws}/malformed.jsonl"}, "malformed.jsonl, line 2: not valid JSON"),
    ("02-missing-input-key", {"data.input_key": "question"}, "line 1: no key 'question' (input_key)"),
    ("03-missing-label-key", {"data.prompt_dataset": "{ws}/no_label.jsonl"}, "line 2: no key 'a' (label_key)"),
    ("04-empty-dataset", {"data.prompt_dataset": "{ws}/empty.jsonl"}, "the dataset is empty"),
    ("05-non-utf8", {"data.prompt_dataset": "{ws}/latin1.jsonl"}, "line 1: bytes that are not UTF-8"),
    ("06-missing-dataset", {"data.prompt_dataset": "{ws}/nope.jsonl"}, "no such file or folder"),
    ("07-prompt-not-a-string", {"data.prompt_dataset": "{ws}/not_string.jsonl"}, "expected a string, got int"),
    ("08-record-not-an-object", {"data.prompt_dataset": "{ws}/list.jsonl"}, "expected a JSON object, got list"),
    ("09-unsupported-file-type", {"data.prompt_dataset": "{ws}/prompts.xlsx"}, "unsupported file type '.xlsx'"),
    ("10-corrupt-parquet", {"data.prompt_dataset": "{ws}/bad.parquet"}, "cannot read as parquet"),
    ("11-invalid-json-file", {"data.prompt_dataset": "{ws}/bad.json"}, "bad.json, line 1: not valid JSON"),
    ("12-no-dataset-flag", {"data.prompt_dataset": None}, "--data.prompt_dataset is required"),
    ("104-empty-prompt", {"data.prompt_dataset": "{ws}/empty_prompt.jsonl"},
     "empty_prompt.jsonl, line 2, key 'q': an empty prompt, which gives the policy no token to start from"),
    ("105-null-label-for-builtin-math", {"data.prompt_dataset": "{ws}/null_label.jsonl",
                                         "reward.remote_url": "builtin:math"},
     "null_label.jsonl, line 6, key 'a' (--data.label_key): null, and --reward.remote_url builtin:math needs each "
     "prompt's reference answer"),
    ("106-no-label-key-for-builtin-math", {"data.label_key": None, "reward.remote_url": "builtin:math"},
     "--reward.remote_url builtin:math scores each response against its prompt's reference answer: set "
     "--data.label_key"),
    ("13-wrong-type", {"train.seed": "abc"}, "--train.seed: expected int, got 'abc'"),
    ("14-wrong-bool", {"reward.normalize": "maybe"}, "--reward.normalize: expected bool"),
    ("15-unknown-flag", {"rollout.n_sample_per_prompt": 2}, "did you mean --rollout.n_samples_per_prompt"),
    ("16-micro-batch-not-dividing", {"train.micro_batch_size": 6}, "must be a multiple of --train.micro_batch_size"),
    ("17-train-batch-not-dividing", {"train.batch_size": 24, "train.micro_batch_size": 8},
     "which --train.batch_size (24) must divide"),
    ("18-unknown-estimator", {"algo.advantage.estimator": "grpo"}, "valid: gae, reinforce"),
    ("19-group-estimator-one-sample", {"rollout.n_samples_per_prompt": 1, "train.batch_size": 8},
     "set --rollout.n_samples_per_prompt to 2 or more"),
    ("20-out-of-range", {"algo.kl.init_coef": -0.1}, "--algo.kl.init_coef must be >= 0"),
    ("21-bad-ckpt-max-num", {"ckpt.max_num": 0}, "--ckpt.max_num must be >= 1"),
    ("22-config-file-missing", {"config": "{ws}/nope.yaml"}, "--config {ws}/nope.yaml: no such file"),
    ("23-config-not-yaml", {"config": "{ws}/bad.yaml"}, "not valid YAML"),
    ("24-config-unknown-key", {"config": "{ws}/unknown_key.yaml"}, "did you mean --train.batch_size"),
    ("25-config-not-a-mapping", {"config": "{ws}/list.yaml"}, "the top level must be a mapping"),
    ("26-reward-file-missing", {"reward.remote_url": "{ws}/nope.py"}, "nope.py does not exist"),
    ("27-reward-file-import-error", {"reward.remote_url": "{ws}/reward_import_error.py"},
     "failed to import: ModuleNotFoundError"),
    ("28-reward-func-undefined", {"reward.remote_url": "{ws}/reward_undefined.py"}, "reward_func is not defined"),
    ("29-reward-func-signature", {"reward.remote_url": "{ws}/reward_bad_signature.py"},
     "cannot be called with (queries, prompts, labels)"),
    ("30-no-reward", {"reward.remote_url": None}, "no reward: pass --reward.remote_url"),
    ("60-async-without-ray", {"train.async_enable": "true", "train.max_staleness": 1},
     "--train.async_enable overlaps generation on Ray rollout workers with training: add --distributed.backend ray"),
    ("61-async-staleness-0", {"train.async_enable": "true", "distributed.backend": "ray"},
     "set --train.max_staleness 1 or more (got 0)"),
    ("62-staleness-without-async", {"train.max_staleness": 2},
     "--train.max_staleness 2 without --train.async_enable"),
    ("63-workers-without-ray", {"rollout.num_workers": 2}, "need --distributed.backend ray"),
    ("64-unknown-backend", {"distributed.backend": "mpi"},
     "--distributed.backend: unknown value 'mpi'; valid: local, ray"),
    ("65-no-workers", {"rollout.num_workers": 0, "distributed.backend": "ray"}, "--rollout.num_workers must be >= 1"),
    ("67-ray-address-unreachable", {"distributed.backend": "ray", "distributed.address": "127.0.0.1:1"},
     "--distributed.address 127.0.0.1:1: no Ray cluster answers there (ConnectionRefusedError"),
    ("92-prompt-probs-do-not-fit", {"data.prompt_dataset": "{ws}/prompts.jsonl,{ws}/long.jsonl",
                                    "data.prompt_probs": "0.5"},
     "--data.prompt_probs '0.5' has 1 probabilities for 2 dataset(s); give one per comma-separated dataset"),
    ("94-warm-up-without-a-critic", {"actor.freezing_steps": 2},
     "--actor.freezing_steps 2 warms up the critic, and --algo.advantage.estimator group_norm trains none: drop it, "
     "or use --algo.advantage.estimator gae"),
    ("97-fsdp-ranks-without-ray", {"fsdp.num_ranks": 2, "fsdp.enable": "true"},
     "--fsdp.num_ranks 2 sets the trainer actors of --fsdp.enable with --distributed.backend ray; under torchrun"),
    ("98-batch-not-a-multiple-of-the-ranks", {"fsdp.num_ranks": 3, "fsdp.enable": "true", "distributed.backend": "ray",
                                              "train.batch_size": 8},
     "--train.batch_size 8 must be a multiple of --fsdp.num_ranks 3: each trainer actor takes an equal share"),
    ("101-gpus-above-one-not-whole", {"distributed.backend": "ray", "distributed.num_gpus_per_worker": 1.5},
     "--distributed.num_gpus_per_worker 1.5: Ray gives an actor more than one GPU only in whole GPUs; ask for 1 or 2"),
    ("103-fewer-cpus-than-ray-actors", {"distributed.backend": "ray", "rollout.num_workers": 2,
                                        "distributed.num_cpus": 1},
     "--distributed.num_cpus 1 is fewer than the 3 actors of a local Ray cluster (2 rollout worker(s) and the "
     "trainer's, one CPU each): Ray would leave the rest waiting forever"),
    ("90-unknown-is-correction-type", {"algo.advantage.is_correction_type": "mis"},
     "--algo.advantage.is_correction_type: unknown value 'mis'; valid: tis, icepop, seq-mask-tis, seq_mask_tis"),
]


@pytest.mark.parametrize("case,over,needle", BEFORE_MODELS, ids=[c[0] for c in BEFORE_MODELS])
def test_refused_before_any_model_loads(ws, tmp_path, capsys, case, over, needle):
    over = {k: (v.format(ws=ws) if isinstance(v, str) else v) for k, v in over.items()}
    refuse(flags(ws, tmp_path / "run", **over), capsys, needle.format(ws=ws))


@pytest.mark.parametrize("low,high,needle", [
    ("5", "0.5", "--algo.advantage.is_correction_threshold must be two finite numbers LOW HIGH with LOW < HIGH"),
    ("-1", "2", "--algo.advantage.is_correction_threshold: LOW must be >= 0"),
])
def test_91_is_correction_threshold_out_of_range(ws, tmp_path, capsys, low, high, needle):
    argv = flags(ws, tmp_path / "run", **{"algo.advantage.is_correction_enable": "true"})
    refuse([*argv, "--algo.advantage.is_correction_threshold", low, high], capsys, needle)


AFTER_MODELS = [
    ("31-missing-model-folder", {"actor.model_name_or_path": "{ws}/no_model"}, "model folder not found"),
    ("32-folder-is-not-a-model", {"actor.model_name_or_path": "{ws}/not_a_model"}, "is not an HF model folder"),
    ("33-every-prompt-too-long", {"data.prompt_dataset": "{ws}/long.jsonl", "data.prompt_max_len": 2},
     "every prompt is longer than --data.prompt_max_len 2"),
    ("108-long-prompt-with-truncation-error", {"data.prompt_dataset": "{ws}/long.jsonl", "data.prompt_max_len": 20,
                                              "data.truncation": "error"},
     "its prompt is 300 tokens, over --data.prompt_max_len 20 (--data.truncation error); raise the limit"),
    ("34-fewer-prompts-than-batch", {"rollout.batch_size": 32, "train.batch_size": 16},
     "fewer than --rollout.batch_size 32"),
    ("35-reward-raises", {"reward.remote_url": "{ws}/reward_raises.py"}, "raised KeyError: 'answer'"),
    ("36-reward-nan", {"reward.remote_url": "{ws}/reward_nan.py"}, "non-finite value in rewards at index 0 (nan)"),
    ("37-reward-inf", {"reward.remote_url": "{ws}/reward_inf.py"}, "non-finite value in rewards at index 0 (inf)"),
    ("38-reward-wrong-length", {"reward.remote_url": "{ws}/reward_short.py"}, "returned 15 rewards for a batch of 16"),
    ("39-reward-wrong-type", {"reward.remote_url": "{ws}/reward_string.py"}, "returned str"),
    ("40-reward-dict-without-rewards", {"reward.remote_url": "{ws}/reward_no_rewards_key.py"},
     "returned a dict without 'rewards'"),
    ("41-reward-hangs", {"reward.remote_url": "{ws}/reward_hangs.py", "reward.timeout": 0.5},
     "did not return within 0.5 s"),
    ("42-policy-weights-nan", {"actor.model_name_or_path": "{ws}/nan_model"}, "next-token probabilities are NaN/inf"),
    ("51-reward-server-refuses", {"reward.remote_url": "http://127.0.0.1:{port}/get_reward", "reward.max_retries": 1},
     "reward server http://127.0.0.1:{port}/get_reward failed after 2 attempts (ConnectError"),
    ("52-agent-environment-raises", {"reward.remote_url": None, "agent.func_path": "{ws}/agent_raises.py"},
     "step() raised ValueError: the environment broke"),
    ("107-agent-function-drops-every-episode", {"reward.remote_url": None,
                                                "agent.func_path": "{ws}/agent_function_buggy.py"},
     "all 16 episodes of the rollout batch were dropped, so nothing would train; the first: episode 0 (prompt 0 of "
     "the batch, "),
]


@pytest.mark.parametrize("case,over,needle", AFTER_MODELS, ids=[c[0] for c in AFTER_MODELS])
def test_refused_during_the_run(ws, tmp_path, capsys, case, over, needle):
    port = free_port()  # nothing listens there: a reward server that refuses connections
    over = {k: (v.format(ws=ws, port=port) if isinstance(v, str) else v) for k, v in over.items()}
    refuse(flags(ws, tmp_path / "run", **over), capsys, needle.format(port=port))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_43_nan_loss_skips_steps_then_stops_leaving_the_last_good_checkpoint(ws, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    argv = flags(ws, out, **{"reward.remote_url": ws / "reward_huge.py", "algo.advantage.estimator": "reinforce",
                             "algo.advantage.whiten": "false", "train.max_steps": 6, "train.num_episodes": 3,
                             "rollout.max_new_tokens": 8, "train.max_skipped_steps": 3, "ckpt.save_steps": 1})
    refuse(argv, capsys, "3 optimizer steps in a row had a non-finite (NaN/inf) loss or gradient")
    assert "skipped optimizer step 5: non-finite gradient norm" in caplog.text
    assert "not checkpointing a state reached through skipped" in caplog.text
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/skipped_steps"] for r in rows] == [0.0, 0.0, 1.0, 2.0]  # the 3rd skip stops step 5
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    assert ck.verify(out / "checkpoints" / "step_00000002") is None


def test_44_long_prompts_are_skipped_with_a_count(ws, tmp_path, capsys):
    argv = flags(ws, tmp_path / "run", **{"data.prompt_dataset": ws / "long.jsonl", "data.prompt_max_len": 20})
    assert main([str(a) for a in argv]) == 0
    assert "skipped 3 prompts longer than --data.prompt_max_len 20 tokens" in capsys.readouterr().out


def test_44_long_prompts_are_cut_with_truncation_left(ws, tmp_path, capsys):
    argv = flags(ws, tmp_path / "run", **{"data.prompt_dataset": ws / "long.jsonl", "data.prompt_max_len": 20,
                                          "data.truncation": "left"})
    assert main([str(a) for a in argv]) == 0
    assert "skipped" not in capsys.readouterr().out


def _train(ws, out, capsys, **over):
    rc = main([str(a) for a in flags(ws, out, **{"ckpt.save_steps": 1, **over})])
    capsys.readouterr()
    return rc


def test_45_checkpoints_of_an_earlier_run_are_not_mixed(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    refuse(flags(ws, out, **{"ckpt.save_steps": 1}), capsys, "already holds checkpoints of an earlier run")


def test_46_every_checkpoint_corrupt(ws, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    (out / "checkpoints" / "step_00000001" / "state.json").write_text("{")
    refuse(flags(ws, out, **{"ckpt.load_enable": "true"}), capsys, "no intact checkpoint in")
    assert "state.json does not match its checksum" in caplog.text


def test_47_resume_with_other_data(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    argv = flags(ws, out, **{"ckpt.load_enable": "true", "data.prompt_dataset": ws / "long.jsonl",
                             "train.max_steps": 2})
    refuse(argv, capsys, "the checkpoint was written with 16 prompts and --rollout.batch_size 8, this run has 11")


def test_93_resume_with_other_prompts_of_as_many(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    rows = [json.loads(line) for line in (ws / "prompts.jsonl").read_text().splitlines()]
    edited = tmp_path / "edited.jsonl"  # 16 prompts again, one of them changed
    edited.write_text("".join(json.dumps({**r, "q": "edited:"} if i == 0 else r) + "\n" for i, r in enumerate(rows)))
    argv = flags(ws, out, **{"ckpt.load_enable": "true", "data.prompt_dataset": edited, "train.max_steps": 2})
    refuse(argv, capsys, "the checkpoint was written with other prompts (as many, in another order or with other")


def test_48_resume_with_another_model(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    other = tmp_path / "other"
    model, tok = tiny_model_and_tokenizer(seed=0, layers=1)
    model.save_pretrained(other)
    tok.save_pretrained(other)
    argv = flags(ws, out, **{"ckpt.load_enable": "true", "actor.model_name_or_path": other, "train.max_steps": 2})
    refuse(argv, capsys, "does not fit the model")


def test_69_resume_with_another_parameter_dtype(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    argv = flags(ws, out, **{"ckpt.load_enable": "true", "actor.dtype": "bfloat16", "train.max_steps": 2})
    refuse(argv, capsys, "actor: the checkpoint was written with float32 parameters, this run has bfloat16; resume "
                         "with the dtype it was written with (--actor.dtype / --model.dtype float32)")


def test_96_resume_with_another_optimizer(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(ws, out, capsys) == 0
    argv = flags(ws, out, **{"ckpt.load_enable": "true", "actor.optim": "muon", "train.max_steps": 2})
    refuse(argv, capsys, "actor: the checkpoint was written with the adam optimizer, this run uses muon; resume "
                         "with the optimizer it was written with (--actor.optim / --critic.optim / --train.optim adam)")


def test_49_full_disk_while_saving_keeps_the_last_checkpoint(ws, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    real, calls = ck.save_file, [0]

    def fills_up(*args, **kwargs):  # the 2nd checkpoint's state file finds the disk full
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(ck, "save_file", fills_up)
    argv = flags(ws, out, **{"ckpt.save_steps": 1, "train.max_steps": 2})
    line = refuse(argv, capsys, "cannot write checkpoint")
    assert "No space left on device" in line and "last good checkpoint:" in line and "step_00000001" in line
    assert [p.name for p in ck.list_checkpoints(out / "checkpoints")] == ["step_00000001"]
    assert not list((out / "checkpoints").glob(".tmp*"))
    monkeypatch.setattr(ck, "save_file", real)
    assert main([str(a) for a in flags(ws, out, **{"ckpt.save_steps": 1, "train.max_steps": 2,
                                                     "ckpt.load_enable": "true"})]) == 0
    assert "resumed from" in capsys.readouterr().out


def test_50_debug_shows_the_traceback(ws, tmp_path, capsys):
    argv = flags(ws, tmp_path / "run", **{"reward.remote_url": ws / "reward_raises.py"})
    with pytest.raises(Exception, match="raised KeyError"):
        main([str(a) for a in argv] + ["--debug"])


# ------------------------------------------------------------------ numeric ranges, before any model loads
# (case, extra flags appended to a good command line, text of the one-line message). Every numeric flag of
# every command has a range (tests/unit/config/test_ranges.py); these go through the real CLI.
RANGES = [
    ("71-negative-lr", ["--actor.adam.lr", "-1e-6"], "--actor.adam.lr must be > 0 (got -1e-06)"),
    ("71-nan-lr", ["--actor.adam.lr", "nan"], "--actor.adam.lr must be a finite number > 0 (got nan)"),
    ("71-critic-lr-zero", ["--critic.adam.lr", "0"], "--critic.adam.lr must be > 0 (got 0.0)"),
    ("72-beta-is-one", ["--actor.adam.betas", "0.9", "1.0"], "--actor.adam.betas: each value must be in [0, 1) "
                                                               "(got 0.9 1.0)"),
    ("72-eps-zero", ["--actor.adam.eps", "0"], "--actor.adam.eps must be > 0 (got 0.0)"),
    ("72-negative-weight-decay", ["--actor.adam.weight_decay", "-0.01"], "--actor.adam.weight_decay must be >= 0"),
    ("73-warmup-ratio", ["--actor.lr_warmup_ratio", "1.5"], "--actor.lr_warmup_ratio must be in [0, 1] (got 1.5)"),
    ("73-min-lr-ratio", ["--actor.min_lr_ratio", "-0.1"], "--actor.min_lr_ratio must be in [0, 1]"),
    ("73-max-norm", ["--actor.max_norm", "-1"], "--actor.max_norm must be >= 0"),
    ("73-top-k-zero", ["--rollout.top_k", "0"], "--rollout.top_k must be -1 or >= 1 (got 0)"),
    ("73-top-p", ["--rollout.top_p", "0"], "--rollout.top_p must be in (0, 1] (got 0.0)"),
    ("73-negative-temperature", ["--rollout.temperature", "-0.5"], "--rollout.temperature must be >= 0"),
    ("73-gamma", ["--algo.advantage.gamma", "1.5"], "--algo.advantage.gamma must be in [0, 1]"),
    ("73-lambd", ["--algo.advantage.lambd", "-0.1"], "--algo.advantage.lambd must be in [0, 1]"),
    ("73-clip-range-reversed", ["--reward.clip_range", "1", "-1"], "--reward.clip_range must be two finite numbers "
                                                                    "LOW HIGH with LOW < HIGH (got 1.0 -1.0)"),
    ("73-eps-clip-low", ["--actor.eps_clip_low_high", "1.2", "0.2"], "--actor.eps_clip_low_high: value 1 must be in "
                                                                      "[0, 1]"),
    ("73-value-clip-zero", ["--critic.value_clip", "0"], "--critic.value_clip must be > 0 or none (got 0.0)"),
    ("73-entropy-coef", ["--actor.entropy_coef", "-0.01"], "--actor.entropy_coef must be >= 0"),
    ("73-num-threads", ["--train.num_threads", "0"], "--train.num_threads must be >= 1 or none (got 0)"),
    ("73-request-timeout", ["--reward.request_timeout", "0"], "--reward.request_timeout must be > 0"),
    ("73-seed", ["--train.seed", "-1"], "--train.seed must be in [0, 4294967295] (got -1)"),
    ("73-save-steps-zero", ["--ckpt.save_steps", "0"], "--ckpt.save_steps must be -1 or >= 1 (got 0)"),
    ("82-input-template-names-a-field", ["--data.input_template", "Q: {question}"],
     "--data.input_template 'Q: {question}' is not a format string with one '{}' for the prompt (KeyError: "),
    ("82-input-template-without-braces", ["--data.input_template", "Question: "],
     "--data.input_template 'Question: ' has no '{}' where the prompt goes"),
]


@pytest.mark.parametrize("case,extra,needle", RANGES, ids=[c[0] for c in RANGES])
def test_numeric_flags_out_of_range(ws, tmp_path, capsys, case, extra, needle):
    refuse(flags(ws, tmp_path / "run") + extra, capsys, needle)
    assert not (tmp_path / "run").exists()  # refused before the run folder (or any model)


SUPERVISED_RANGES = [
    ("74-sft-eps-zero", ["train", "sft", "--adam.eps", "0"], "--adam.eps must be > 0 (got 0.0)"),
    ("74-sft-beta", ["train", "sft", "--adam.betas", "1.0", "0.95"], "--adam.betas: each value must be in [0, 1)"),
    ("74-rm-weight-decay", ["train", "rm", "--adam.weight_decay", "-1"], "--adam.weight_decay must be >= 0"),
    ("74-sft-lora-alpha", ["train", "sft", "--ds.lora.alpha", "0"], "--ds.lora.alpha must be > 0 (got 0)"),
    ("74-dpo-beta", ["train", "dpo", "--model.beta", "0"], "--model.beta must be > 0 (got 0.0)"),
    ("74-kto-weight", ["train", "kto", "--model.undesirable_weight", "-1"], "--model.undesirable_weight must be > 0"),
    ("82-sft-input-template", ["train", "sft", "--data.input_template", "{x}: {}"],
     "--data.input_template '{x}: {}' is not a format string with one '{}'"),
    ("74-serve-port", ["serve-reward", "--reward.remote_url", "r.py", "--port", "0"], "--port must be in [1, 65535]"),
]


@pytest.mark.parametrize("case,argv,needle", SUPERVISED_RANGES, ids=[c[0] for c in SUPERVISED_RANGES])
def test_numeric_flags_of_the_other_commands(ws, tmp_path, capsys, case, argv, needle):
    if argv[0] == "train":
        argv = argv + ["--model.model_name_or_path", ws / "tiny", "--data.dataset", ws / "prompts.jsonl",
                       "--ckpt.output_dir", tmp_path / "run"]
    refuse(argv, capsys, needle)


# ------------------------------------------------------------------ damaged models and output paths
MODELS = [
    ("75-truncated-weights", {"actor.model_name_or_path": "{ws}/truncated_weights"},
     "cannot load a causal LM from {ws}/truncated_weights: model.safetensors is truncated or corrupt"),
    ("75-garbage-weights", {"actor.model_name_or_path": "{ws}/garbage_weights"},
     "model.safetensors is truncated or corrupt (SafetensorError: "),
    ("76-garbage-config", {"actor.model_name_or_path": "{ws}/garbage_config"},
     "garbage_config/config.json is not valid JSON (Expecting property name enclosed in double quotes at line 1"),
    ("76-garbage-tokenizer", {"actor.model_name_or_path": "{ws}/garbage_tokenizer"},
     "cannot load a tokenizer from {ws}/garbage_tokenizer: tokenizer.json is not valid JSON"),
    ("77-foreign-weights", {"actor.model_name_or_path": "{ws}/foreign_weights"},
     "the weights files hold no tensors for"),
    ("78-no-tokenizer-files", {"actor.model_name_or_path": "{ws}/no_tokenizer"},
     "no_tokenizer has no tokenizer.json or tokenizer_config.json"),
    ("75-corrupt-reference", {"ref.model_name_or_path": "{ws}/truncated_weights", "algo.kl.init_coef": 0.01},
     "truncated_weights: model.safetensors is truncated or corrupt"),
    ("75-corrupt-critic", {"critic.model_name_or_path": "{ws}/truncated_weights", "algo.advantage.estimator": "gae"},
     "truncated_weights: model.safetensors is truncated or corrupt"),
    ("75-corrupt-reward-model", {"reward.remote_url": None, "reward.model_name_or_path": "{ws}/truncated_rm"},
     "cannot load a reward model from {ws}/truncated_rm: model.safetensors is truncated or corrupt"),
    ("79-output-dir-is-a-file", {"ckpt.output_dir": "{ws}/a_file"},
     "--ckpt.output_dir {ws}/a_file is a file, not a folder; choose a folder path"),
    ("79-output-dir-inside-a-file", {"ckpt.output_dir": "{ws}/a_file/run"},
     "cannot create the folder or write in it (Not a directory); a part of the path is a file"),
    ("79-tensorboard-dir-is-a-file", {"logger.tensorboard_dir": "{ws}/a_file"},
     "--logger.tensorboard_dir {ws}/a_file is a file, not a folder"),
]


@pytest.mark.parametrize("case,over,needle", MODELS, ids=[c[0] for c in MODELS])
def test_damaged_models_and_bad_output_paths(ws, tmp_path, capsys, case, over, needle):
    over = {k: (v.format(ws=ws) if isinstance(v, str) else v) for k, v in over.items()}
    refuse(flags(ws, tmp_path / "run", **over), capsys, needle.format(ws=ws))


def test_79_read_only_output_dir(ws, tmp_path, capsys, monkeypatch):
    real = Path.mkdir

    def read_only(self, *args, **kwargs):  # a read-only mount (root ignores permission bits, so simulate it)
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    refuse(flags(ws, tmp_path / "ro" / "run"), capsys, "cannot create the folder or write in it (Read-only file "
                                                        "system); choose a place on a writable file system")
    argv = ["train", "sft", "--model.model_name_or_path", ws / "tiny", "--data.dataset", ws / "prompts.jsonl",
            "--ckpt.output_dir", tmp_path / "ro" / "sft"]
    refuse(argv, capsys, "--ckpt.output_dir")


def test_79_final_model_cannot_be_written(ws, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "final").write_text("a file where the final model goes")
    refuse(flags(ws, out), capsys, f"cannot write the model folder {out / 'final'}: File exists; a file is in the way")


def test_80_supervised_damaged_model_and_output_file(ws, tmp_path, capsys):
    rows = [{"input": f"{i}+1=", "output": str(i + 1)} for i in range(8)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["train", "sft", "--data.dataset", tmp_path / "sft.jsonl", "--train.batch_size", "4",
            "--train.micro_batch_size", "4", "--logger.progress_bar", "false"]
    refuse(base + ["--model.model_name_or_path", ws / "garbage_config", "--ckpt.output_dir", tmp_path / "a"], capsys,
           "config.json is not valid JSON")
    refuse(base + ["--model.model_name_or_path", ws / "tiny", "--ckpt.output_dir", ws / "a_file"], capsys,
           f"--ckpt.output_dir {ws / 'a_file'} is a file, not a folder")
    refuse(["train", "rm"] + base[2:] + ["--model.model_name_or_path", ws / "truncated_weights",
                                         "--ckpt.output_dir", tmp_path / "b"], capsys,
           "cannot load a reward model backbone from")


def test_83_fewer_supervised_samples_than_a_batch(ws, tmp_path, capsys):
    (tmp_path / "two.jsonl").write_text('{"input": "1+1=", "output": "2"}\n{"input": "2+1=", "output": "3"}\n')
    refuse(["train", "sft", "--model.model_name_or_path", ws / "tiny", "--data.dataset", tmp_path / "two.jsonl",
            "--train.batch_size", "4", "--train.micro_batch_size", "4", "--ckpt.output_dir", tmp_path / "run"], capsys,
           "the training set has 2 usable items, fewer than --train.batch_size 4; lower the batch size or add data")


def test_80_plan_with_a_garbage_config(ws, capsys):
    refuse(["plan", "--actor.model_name_or_path", ws / "garbage_config", "--data.prompt_dataset",
            ws / "prompts.jsonl", "--data.input_key", "q"], capsys, "config.json is not valid JSON")


def test_81_unreadable_dataset(ws, tmp_path, capsys, monkeypatch):
    real = Path.open

    def denied(self, *args, **kwargs):  # chmod 000 (root reads it anyway, so simulate it)
        if self.name == "prompts.jsonl":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    refuse(flags(ws, tmp_path / "run"), capsys, "prompts.jsonl: cannot read it (Permission denied); check that the "
                                                "file is readable")


def test_79_eval_output_dir_is_a_file(ws, capsys):
    refuse(["eval", "--actor.model_name_or_path", ws / "tiny", "--eval.dataset", ws / "prompts.jsonl",
            "--data.input_key", "q", "--data.label_key", "a", "--eval.verifier", "builtin:math",
            "--ckpt.output_dir", ws / "a_file"], capsys, f"--ckpt.output_dir {ws / 'a_file'} is a file, not a folder")


def test_84_view_a_damaged_samples_file(tmp_path, capsys):
    (tmp_path / "samples.jsonl").write_text('{"step": 1, "prompt": "a"}\n{"step": 1, \n{"step": 2, "prompt": "b"}\n')
    refuse(["view", tmp_path], capsys, f"{tmp_path / 'samples.jsonl'}, line 2: not valid JSON (Expecting property "
                                       "name enclosed in double quotes); fix or delete that line")
    (tmp_path / "samples.jsonl").write_bytes(b'{"step": 1, "prompt": "caf\xe9"}\n')
    refuse(["view", tmp_path], capsys, "samples.jsonl: bytes that are not UTF-8 (invalid continuation byte at byte 26)")
