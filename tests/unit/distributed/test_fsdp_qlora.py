"""FSDP2 over a QLoRA policy, in one process (a 1-rank gloo group): `fsdp.shard_model` leaves the 4-bit base
out of FSDP (fully_shard's `ignored_params`), so every rank holds each 4-bit weight whole with its quantization
state, as one process does; the adapters and the float weights are sharded. The vLLM weight stream then
dequantizes the base exactly as one process does, and sharded checkpoints leave the frozen base out."""

import pytest
import torch
import torch.distributed as dist

from rlhfkit.distributed import fsdp
from rlhfkit.distributed.fsdp_checkpoint import held_4bit_names, without_4bit_base
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.models.lora import DequantizedState, MergedLoraState, add_lora

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def qlora_policy(folder):
    torch.manual_seed(0)  # lora_A's initialisation
    policy = add_lora(load_causal_lm(folder, load_in_4bit=True), 4, 8, "all-linear")
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # zero at the start: give the merge something to fold in
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return policy


def test_the_4bit_base_stays_whole_and_the_adapters_are_sharded(tiny_folder):
    from torch.distributed.tensor import DTensor

    policy = fsdp.shard_model(qlora_policy(tiny_folder), 1)
    weights = [m.weight for m in policy.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(weights) == 2 * 7  # q k v o, gate up down of 2 layers
    assert all(isinstance(w, bnb.nn.Params4bit) and w.quant_state is not None for w in weights)
    adapters = [p for n, p in policy.named_parameters() if "lora_" in n]
    assert adapters and all(isinstance(p, DTensor) for p in adapters)
    assert isinstance(policy.get_base_model().model.embed_tokens.weight, DTensor)


def test_the_weight_stream_sends_the_dequantized_base_and_merged_adapters_of_one_process(tiny_folder):
    """FSDP + QLoRA + vLLM: the merged, dequantized stream of the sharded policy (`StreamedState`) equals one
    process's (`DequantizedState`), tensor for tensor."""
    plain = qlora_policy(tiny_folder)
    want = {k: v for part in MergedLoraState(plain, DequantizedState(plain)).parts(2**62) for k, v in part.items()}
    policy = fsdp.shard_model(qlora_policy(tiny_folder), 1)
    merged = MergedLoraState(policy, fsdp.StreamedState(policy))
    got = {k: v for part in merged.parts(bucket_bytes=64 * 64 * 4) for k, v in part.items()}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert got[q].dtype == torch.float32 and got[q].shape == (64, 64)  # dequantized, not the packed bytes


def test_sharded_checkpoints_leave_the_frozen_4bit_base_out(tiny_folder):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    policy = fsdp.shard_model(qlora_policy(tiny_folder), 1)
    state = get_model_state_dict(policy)
    names = held_4bit_names(policy)
    assert len(names) == 2 * 7 and all(n.endswith("base_layer.weight") for n in names)
    kept = without_4bit_base(state, policy)
    assert set(state) - set(kept) > names  # the weights and their quantization state (absmax, quant_map, ...)
    assert not any("base_layer" in k for k in kept)
    assert any("lora_A" in k for k in kept) and any("embed_tokens" in k for k in kept)


def test_a_gathered_full_state_is_dequantized_from_the_whole_4bit_weights(tiny_folder):
    """The full state gathered on one rank (`full_state_dict`, what FSDP on Ray sends its rollout workers) holds
    the packed 4-bit bytes; `DequantizedState(policy, state)` dequantizes them from the weights every rank holds
    whole: the merged result is one process's."""
    plain = qlora_policy(tiny_folder)
    want = {k: v for part in MergedLoraState(plain, DequantizedState(plain)).parts(2**62) for k, v in part.items()}
    policy = fsdp.shard_model(qlora_policy(tiny_folder), 1)
    full = fsdp.full_state_dict(policy)
    assert full["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"].dtype == torch.uint8
    merged = MergedLoraState(policy, DequantizedState(policy, full))
    got = {k: v for part in merged.parts(2**62) for k, v in part.items()}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_fsdp_on_ray_sends_vllm_workers_the_dequantized_base_with_the_adapters_merged(tiny_folder):
    """FSDP on Ray: rank 0 gathers the full state (`full_state_dict`: the 4-bit weights packed) and
    `pool.engine_state` sends vLLM workers what one process sends them: the dequantized base, adapters merged."""
    pytest.importorskip("ray")
    from rlhfkit.distributed.pool import engine_state

    plain = qlora_policy(tiny_folder)
    policy = fsdp.shard_model(qlora_policy(tiny_folder), 1)
    want, got = engine_state(plain, True), engine_state(policy, True, fsdp.full_state_dict(policy))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert got["model.layers.0.mlp.up_proj.weight"].dtype == torch.float32
