"""A LoRA policy on the vLLM engine: vLLM has no peft, so each weight sync sends every adapted
linear merged (W + scaling * B @ A) under the base model's parameter names, computed from the
peft model's state without touching it; the first sync in full, later ones only the modules that
hold adapted layers (the base is frozen). Checked against peft's own `merge_and_unload` on a deep
copy, tensor by tensor, through a fake `vllm.LLM` whose worker is the real `WeightSyncExtension`."""

import copy

import pytest
import torch

from rlhfkit.errors import ModelError
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.models.lora import (
    MergedLoraSource,
    MergedLoraState,
    add_lora,
    hf_name,
    merged_weight,
)
from rlhfkit.rollout import vllm as V
from tests.unit.rollout.test_vllm_colocated import FakeLLM, FakeModel

HIDDEN = 64  # the default tiny model: hidden 64, 2 layers, 4 heads of 16, 2 KV heads


def lora_policy(targets="all-linear", seed=0):
    torch.manual_seed(seed)
    model, _ = tiny_model_and_tokenizer(seed=seed)
    policy = add_lora(model, rank=4, alpha=8, target_modules=targets)
    with torch.no_grad():  # peft starts B at zero (merged = base); give the adapters a value
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return policy


def peft_merged(policy):
    return copy.deepcopy(policy).merge_and_unload().state_dict()


def engine_for(policy):
    base = peft_merged(policy)  # the names and shapes vLLM's model holds; zeroed by FakeModel
    model = FakeModel(base)
    source = MergedLoraSource(policy, policy.state_dict)
    return V.VLLMEngine("/m", [2], llm=FakeLLM(model), state_fn=source), model, source


def assert_equal_states(got, want):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def one_step(policy):
    """An optimizer step on the adapters (the only trainable weights)."""
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    loss = policy(input_ids=ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    opt.step()


def test_merged_weight_by_hand():
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = torch.tensor([[1.0, 0.0]])  # rank 1, in 2
    b = torch.tensor([[2.0], [1.0]])  # out 2, rank 1
    # B @ A = [[2, 0], [1, 0]]; scaling 0.5 -> W + [[1, 0], [0.5, 0]]
    assert torch.equal(merged_weight(w, a, b, 0.5, False), torch.tensor([[2.0, 2.0], [3.5, 4.0]]))
    assert torch.equal(merged_weight(w, a, b, 0.5, True), torch.tensor([[2.0, 2.5], [3.0, 4.0]]))
    assert torch.equal(w, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # a new tensor; W untouched
    assert merged_weight(w.bfloat16(), a.bfloat16(), b.bfloat16(), 0.5, False).dtype == torch.bfloat16


def test_peft_names_map_to_the_base_models():
    assert hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert hf_name("base_model.model.lm_head.weight") == "lm_head.weight"


def test_the_first_sync_loads_the_peft_merge_tensor_by_tensor():
    policy = lora_policy()
    engine, model, _ = engine_for(policy)
    engine.update_weights({}, 1)
    assert_equal_states(model.params, peft_merged(policy))
    assert len(model.handed) == 1 and engine.version == 1  # CPU tensors: one bytes RPC


def test_after_an_optimizer_step_the_next_sync_carries_the_new_merge():
    policy = lora_policy(targets=("q_proj", "v_proj"))
    engine, model, _ = engine_for(policy)
    engine.update_weights({}, 1)
    a_step_syncs_the_attention_blocks(engine, model, policy, peft_merged)


def a_step_syncs_the_attention_blocks(engine, model, policy, weights):
    """After an optimizer step on q/v adapters the next sync loads `weights(policy)` (the new merge) and
    sends only the attention blocks (q, v adapted; k, o with them: vLLM fuses q/k/v), no norms, MLP,
    embeddings."""
    first = weights(policy)
    one_step(policy)
    second = weights(policy)
    changed = {k for k in second if not torch.equal(first[k], second[k])}
    assert changed and all(".q_proj." in k or ".v_proj." in k for k in changed)
    engine.update_weights({}, 2)
    assert_equal_states(model.params, second)
    sent = {name for name, _ in model.handed[-1]}
    assert sent == {f"model.layers.{i}.self_attn.{m}_proj.weight" for i in range(2) for m in "qkvo"}


def test_the_bytes_of_a_full_and_an_adapted_only_sync():
    policy = lora_policy(targets=("q_proj", "v_proj"))
    engine, _, source = engine_for(policy)
    engine.update_weights({}, 1)
    engine.update_weights({}, 2)
    full = sum(p.numel() * 4 for p in peft_merged(policy).values())
    # per layer q 64x64, k 32x64, v 32x64, o 64x64 (2 KV heads of 16), float32
    attention = 2 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64) * 4
    assert source.sent_bytes == [full, attention] and attention == 98304


def test_the_sync_leaves_the_trainers_peft_model_as_it_was():
    policy = lora_policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    engine, _, _ = engine_for(policy)
    engine.update_weights({}, 1)
    engine.update_weights({}, 2)
    assert_equal_states(policy.state_dict(), before)  # adapters still separate, base not merged
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ids = collate_ids()
    with policy.disable_adapter():
        base_lp = response_logprobs(policy, ids)[0]
    assert not torch.allclose(response_logprobs(policy, ids)[0], base_lp)  # the adapters still act
    lora_a = next(p for n, p in policy.named_parameters() if "lora_A" in n)
    start = lora_a.detach().clone()
    one_step(policy)  # and still train
    assert not torch.equal(start, lora_a)


def collate_ids():
    from rlhfkit.data.batch import collate
    from rlhfkit.data.types import Trajectory

    t = Trajectory(torch.tensor([5, 6, 7]), torch.tensor([8, 9]), torch.ones(2, dtype=torch.bool),
                   torch.zeros(2), "stop", 0, 0)
    return collate([t], 0)


class Streamed:
    """A streamed state (as FSDP's StreamedState): one tensor per part, so a layer's base weight, A
    and B arrive in different parts."""

    def __init__(self, state):
        self.state = state

    def parts(self, bucket_bytes):
        for name, t in self.state.items():
            yield {name: t}


def test_a_streamed_source_merges_across_parts_and_rebuckets():
    policy = lora_policy()
    state = MergedLoraState(policy, Streamed(policy.state_dict()))
    parts = list(state.parts(bucket_bytes=40_000))
    assert len(parts) > 1 and all(sum(t.numel() * 4 for t in p.values()) <= 40_000 or len(p) == 1 for p in parts)
    assert_equal_states({k: v for p in parts for k, v in p.items()}, peft_merged(policy))


def test_a_lora_variant_is_refused_in_one_line():
    from peft import LoraConfig, get_peft_model

    model, _ = tiny_model_and_tokenizer(seed=0)
    dora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ModelError, match="q_proj: only LoRA on plain or 4-bit linear layers") as e:
        MergedLoraState(dora, dora.state_dict())
    assert "\n" not in str(e.value)


def test_lora_on_a_tied_output_head_is_refused_for_the_vllm_engine():
    from rlhfkit.models.lora import MergedLoraSource, add_lora

    model, _ = tiny_model_and_tokenizer(seed=0)
    model.config.tie_word_embeddings = True
    MergedLoraSource(add_lora(copy.deepcopy(model), 2, 4, ("q_proj",)), dict)  # the head untouched: fine
    with pytest.raises(ModelError, match="tied embeddings does not reach vLLM"):
        MergedLoraSource(add_lora(model, 2, 4, ("q_proj", "lm_head")), dict)
