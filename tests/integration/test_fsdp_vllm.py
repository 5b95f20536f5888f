"""vLLM, FSDP and (Q)LoRA together: `torchrun --nproc_per_node 2 ... train rl --fsdp.enable true --rollout.engine
vllm --ds.lora.rank 8 [--ds.load_in_4bit]` on CPU (gloo), every rank's `import vllm` the fake (tests/fakes/vllm: the
model folder in transformers behind the real weight-sync extension, so the tokens and logprobs are real). Each
rank's engine gets the full state gathered across the ranks at every sync, the 4-bit base dequantized and the
adapters merged; the test reads back what each engine holds after each sync (the fake's FAKE_VLLM_DUMP) and
computes what it should hold without rlhfkit's merge code: bitsandbytes' `dequantize_4bit` of the base plus peft's
`get_delta_weight` of the adapters of that step, read from the run's sharded checkpoint of that step. The training
is compared with the same run in one process on the same fake engine. Not checked here: real vLLM, GPUs, nccl,
bitsandbytes' CUDA kernels."""

import importlib.util
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.distributed.fsdp_checkpoint import read_full_module
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.models.lora import PEFT_PREFIX, add_lora
from rlhfkit.trainers.checkpoint import step_dir_name
from tests.integration.conftest import FAKES, fake_vllm_env, fake_vllm_events
from tests.integration.test_fsdp import REWARD, assert_same_steps, flags, metrics, torchrun_rl

bnb = pytest.importorskip("bitsandbytes")

STEPS = 2
LORA = {"ds.lora.rank": 8, "ds.lora.alpha": 16, "rollout.engine": "vllm"}
# QLoRA on q and v: the attention block's k and o and the MLP are 4-bit linears sent dequantized alone
VARIANTS = {"qlora": {**LORA, "ds.load_in_4bit": "true", "ds.lora.target_modules": "q_proj,v_proj"},
            "lora": {**LORA, "ds.lora.target_modules": "all-linear"}}


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("fsdp_vllm", [{"q": f"x{i}y:"} for i in range(16)])
    (root / "reward.py").write_text(REWARD)
    return root


def fake_vllm_here(monkeypatch, log) -> None:
    """This process's `import vllm` is the fake, logging to `log`; undone when the test ends."""
    spec = importlib.util.spec_from_file_location("vllm", FAKES / "vllm" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))


def run_both(ws, tmp_path, monkeypatch, over) -> dict[str, dict[int, list[dict]]]:
    """The run in one process (tmp_path/single) and in 2 FSDP processes (tmp_path/fsdp) writing a sharded
    checkpoint after every step; each run's fake engines' events by process id."""
    monkeypatch.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)  # as test_fsdp
    events = {}
    for run in ("single", "fsdp"):
        log, dump = tmp_path / f"{run}.jsonl", tmp_path / f"{run}_loads"
        dump.mkdir()
        monkeypatch.setenv("FAKE_VLLM_DUMP", str(dump))
        if run == "single":
            fake_vllm_here(monkeypatch, log)
            assert main(["train", "rl", *flags(ws, tmp_path / run, **over)]) == 0
        else:
            for key, value in fake_vllm_env(log).items():
                monkeypatch.setenv(key, value)
            torchrun_rl(flags(ws, tmp_path / run, **over, **{"ckpt.save_steps": 1, "ckpt.max_num": STEPS}))
        engines: dict[int, list[dict]] = {}
        for e in fake_vllm_events(log):
            engines.setdefault(e["pid"], []).append(e)
        events[run] = engines
    return events


def held_after_loads(dump, pid) -> list[dict[str, torch.Tensor]]:
    """What the fake engine of process `pid` held after each of its loads, in order."""
    return [load_file(f) for f in sorted(dump.glob(f"{pid}-*.safetensors"), key=lambda f: int(f.stem.split("-")[1]))]


def policy_at(ws, checkpoint, variant: str) -> torch.nn.Module:
    """The run's policy with the adapters of its FSDP checkpoint `checkpoint` (read in one process); None: the
    adapters as they start (B zero)."""
    over = VARIANTS[variant]
    targets = over["ds.lora.target_modules"]
    policy = add_lora(load_causal_lm(ws / "tiny", load_in_4bit="ds.load_in_4bit" in over), rank=8, alpha=16,
                      target_modules=targets if targets == "all-linear" else tuple(targets.split(",")))
    if checkpoint is not None:
        read_full_module(checkpoint, "model", policy, only=lambda key: "lora_" in key)
    return policy


def computed_weights(policy) -> dict[str, torch.Tensor]:
    """The weights the trainer multiplies by, under the float model's names, without rlhfkit's merge: every
    adapted linear's base weight (bitsandbytes' dequantized weight of a 4-bit one) plus peft's delta weight,
    every other 4-bit linear's dequantized weight, every other weight as it is."""
    from peft.tuners.lora import LoraLayer

    def dequantized(w):
        return bnb.functional.dequantize_4bit(w.data, w.quant_state) if isinstance(w, bnb.nn.Params4bit) else w.data

    out = {}
    for name, module in policy.named_modules():
        hf = f"{name.removeprefix(PEFT_PREFIX)}.weight"
        if isinstance(module, LoraLayer):
            out[hf] = dequantized(module.base_layer.weight) + module.get_delta_weight("default")
        elif isinstance(module, bnb.nn.Linear4bit) and not name.endswith(".base_layer"):
            out[hf] = dequantized(module.weight)
    state = {k.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): v for k, v in policy.state_dict().items()
             if "lora_" not in k}
    return {**state, **out}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_vllm_under_fsdp_with_lora_syncs_the_merged_weights_and_trains_as_one_process(
        ws, tmp_path, monkeypatch, variant):
    """Both ranks' engines hold, after every sync, bit for bit the weights computed from that step's adapters, so
    the same on both ranks; the rollout's logprobs are the trainer's sharded forward's (measured gap 2.1e-6 at most,
    allowed 1e-4); and the run trains as the one-process run on the same fake engine: the same rewards (the same
    tokens), gradient norms within 1e-5 relative (measured 1.1e-7), final adapters within 5e-5 (measured 1.3e-6
    with QLoRA, 1.1e-5 with LoRA: the float-order noise of test_fsdp_qlora, which Adam magnifies in small
    gradients; lora_B moved from 0 to 0.07)."""
    four_bit = variant == "qlora"
    events = run_both(ws, tmp_path, monkeypatch, VARIANTS[variant])
    assert len(events["single"]) == 1 and len(events["fsdp"]) == 2  # an engine in every rank
    # the 4-bit base is sent before the first rollout (the engine loaded the folder's float weights); then a
    # sync after every step, the last one the final weights
    syncs = STEPS + 1 if four_bit else STEPS
    held = {pid: held_after_loads(tmp_path / "fsdp_loads", pid) for pid in events["fsdp"]}
    assert all(len(h) == syncs for h in held.values())
    sent = {"qlora": [21, 8, 8], "lora": [21, 14]}[variant]  # in full first, then the adapted blocks (test_qlora)
    assert all([e["tensors"] for e in engine if e["event"] == "load"] == sent for engine in events["fsdp"].values())
    rank0, rank1 = held.values()
    for a, b in zip(rank0, rank1, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    checkpoints = [tmp_path / "fsdp" / "checkpoints" / step_dir_name(s) for s in range(1, STEPS + 1)]
    for got, checkpoint in zip(rank0, ([None] if four_bit else []) + checkpoints, strict=True):
        want = computed_weights(policy_at(ws, checkpoint, variant))  # and the 4-bit weights' quantization state
        assert set(got) <= set(want)
        assert all(torch.equal(got[k], want[k]) for k in got), checkpoint
    init, start = load_file(ws / "tiny" / "model.safetensors"), computed_weights(policy_at(ws, None, variant))
    # the 4-bit base is not the folder's float weights (NF4's rounding), and the adapters moved the engine's weights
    assert not four_bit or max(float((start[k] - init[k]).abs().max()) for k in init) > 1e-2
    assert max(float((rank0[-1][k] - start[k]).abs().max()) for k in init) > 1e-2
    assert_same_steps(tmp_path)
    for run in ("fsdp", "fsdp/rank1"):
        assert len(metrics(tmp_path / run)) == STEPS
        assert all(m["rollout/logprob_gap_max"] < 1e-4 for m in metrics(tmp_path / run))
    one = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    two = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and max(float(one[k].abs().max()) for k in one if "lora_B" in k) > 1e-2
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 5e-5
