"""QLoRA under FSDP2 on CPU (gloo): `torchrun --nproc_per_node 2 ... train rl --fsdp.enable true --ds.load_in_4bit
--ds.lora.rank 4`. Every rank holds the 4-bit base whole (distributed.fsdp.whole_4bit_weights), the adapters are
sharded with their layers and their gradients summed by FSDP's reduce-scatter: two ranks train the adapters of one
process on the same global batch, the reference is the 4-bit base with the adapters off, final/ is peft's adapter
folder, and a resume from a sharded checkpoint repeats the run to the bit. Skipped where bitsandbytes is not
installed."""

import json

import pytest
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.distributed.launch import ray_temp_dir
from rlhfkit.trainers.checkpoint import step_dir_name
from tests.integration.conftest import colour_workspace, vision_rl_flags
from tests.integration.test_fsdp import REWARD, assert_same_steps, flags, metrics, single_and_fsdp, torchrun_rl
from tests.integration.test_fsdp_resume import STEPS, lora_run_resumes_bit_exact
from tests.integration.test_fsdp_resume import ws as resume_ws  # noqa: F401 - the resume run's workspace

pytest.importorskip("bitsandbytes")

QLORA = {"ds.lora.rank": 4, "ds.lora.alpha": 8, "ds.load_in_4bit": "true"}


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("fsdp_qlora", [{"q": f"x{i}y:"} for i in range(16)])
    (root / "reward.py").write_text(REWARD)
    return root


def test_qlora_under_fsdp_equals_qlora_in_one_process(ws, tmp_path, monkeypatch):
    """Every step's global gradient norm within 1e-5 relative and the ranks' shares of the policy and KL losses
    adding up to one process's; the final adapters within 5e-5 of one process's (measured 2.2e-6: the ranks sum
    their gradient parts in another order than one process's micro-batches, and Adam's division by sqrt(v)
    magnifies that float-order noise in small gradients; lora_B moved from 0 to 7.8e-2). `rlhfkit lora merge`
    folds either folder into the float base."""
    single_and_fsdp(ws, tmp_path, monkeypatch, QLORA)
    for a, b, c in assert_same_steps(tmp_path)[1:]:  # after the first step the adapters move off the 4-bit base
        assert a["kl_loss"] > 0 and b["kl_loss"] + c["kl_loss"] == pytest.approx(a["kl_loss"], rel=1e-4)
        assert b["rollout/logprob_gap_mean"] < 1e-4  # the rollout ran the trainer's 4-bit layers
    one = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    two = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and all("lora_" in k for k in one)
    assert max(float(one[k].abs().max()) for k in one if "lora_B" in k) > 1e-2  # zero at the start
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 5e-5
    config = json.loads((tmp_path / "fsdp" / "final" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(ws / "tiny")
    merged = {}
    for run in ("single", "fsdp"):
        out = tmp_path / f"merged_{run}"
        assert main(["lora", "merge", "--lora.adapter", str(tmp_path / run / "final"), "--ckpt.output_dir",
                     str(out)]) == 0
        merged[run] = load_file(out / "model.safetensors")
    init = load_file(ws / "tiny" / "model.safetensors")
    assert merged["fsdp"].keys() == init.keys()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert float((merged["fsdp"][q] - init[q]).abs().max()) > 1e-3  # the adapters were folded in
    assert max(float((merged["single"][k] - merged["fsdp"][k]).abs().max()) for k in init) < 5e-5


def test_qlora_under_fsdp_resumes_bit_exact(resume_ws, tmp_path):  # noqa: F811
    """test_fsdp_resume's run (a critic, the policy's EMA, adaptive KL, a checkpoint every step) with QLoRA: a
    resume from the step before the last repeats the last step to the bit, in the adapters, their EMA and every
    logged value; the checkpoints hold the adapters and the float weights, not the frozen 4-bit base, and
    `rlhfkit export` of one folds its adapters into the float base as `rlhfkit lora merge` does with final/."""
    ref = lora_run_resumes_bit_exact(resume_ws, tmp_path, QLORA)
    shards = [load_file(f) for f in (ref / "checkpoints" / step_dir_name(STEPS) / "shards").glob("*.safetensors")]
    names = {k for s in shards for k in s}
    assert any("lora_A" in k for k in names) and any("embed_tokens" in k for k in names)
    assert not any("base_layer" in k for k in names)  # the 4-bit weights are loaded from the model again


def test_a_vision_language_qlora_policy_under_fsdp_equals_one_process(tmp_path, monkeypatch):
    """The tiny Qwen2-VL with a frozen tower and its language model in 4 bits: its adapters under 2 FSDP ranks
    within 5e-5 of one process's (measured 5.6e-7), the rollout's logprobs the trainer's over the images."""
    ws = colour_workspace(tmp_path / "ws")

    def flags(name):
        return vision_rl_flags(ws, tmp_path / name, **{
            "train.micro_batch_size": 2, "train.max_steps": 2, "algo.kl.init_coef": 0.01, "algo.kl.use_loss": "true",
            "actor.freeze_visual_encoder": "true", **QLORA})

    monkeypatch.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)  # as test_fsdp
    assert main(["train", "rl", *flags("single")]) == 0
    torchrun_rl(flags("fsdp"))
    assert_same_steps(tmp_path)
    assert metrics(tmp_path / "fsdp")[-1]["actor/grad_norm"] > 0
    assert all(m["rollout/logprob_gap_max"] < 1e-4 for m in metrics(tmp_path / "fsdp"))
    one = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    two = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and not any("visual" in k for k in one)  # none in the frozen tower
    assert max(float(one[k].abs().max()) for k in one if "lora_B" in k) > 1e-3
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 5e-5


def test_qlora_on_fsdp_ray_trainer_actors_equals_one_process(ws, tmp_path, tmp_path_factory, monkeypatch):
    """FSDP on Ray (`--fsdp.num_ranks 2` trainer actors, 2 rollout workers that load the same 4-bit base and get
    the adapters after each step) trains the adapters of one process, within 5e-5 (measured 2.2e-6)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    from tests.integration.test_fsdp_ray import RAY_FSDP

    ray.init(num_cpus=4, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("ray")), include_dashboard=False)
    try:
        monkeypatch.setattr("rlhfkit.models.logprobs._plain_linear", lambda head: False)  # as test_fsdp
        assert main(["train", "rl", *flags(ws, tmp_path / "single", **QLORA)]) == 0
        assert main(["train", "rl", *flags(ws, tmp_path / "fsdp", **QLORA, **RAY_FSDP)]) == 0
    finally:
        ray.shutdown()
    assert_same_steps(tmp_path)
    one = load_file(tmp_path / "single" / "final" / "adapter_model.safetensors")
    two = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and max(float(one[k].abs().max()) for k in one if "lora_B" in k) > 1e-2
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 5e-5
