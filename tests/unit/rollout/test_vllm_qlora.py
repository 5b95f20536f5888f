"""A QLoRA policy (--ds.load_in_4bit) on the vLLM engine: vLLM holds full-precision weights, so each
weight sync sends what the trainer multiplies by, every 4-bit linear's dequantized NF4 weight with its
adapters merged (`W_deq + scaling * B @ A` in float32), the other weights as they are. Checked on a fake
`vllm.LLM` whose worker is the real `WeightSyncExtension` against an independent computation with
bitsandbytes' `dequantize_4bit` and peft's own delta weight (`get_delta_weight`, what its merge adds),
and against the trainer's forward."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.models import response_logprobs
from rlhfkit.models.loading import load_causal_lm
from rlhfkit.models.lora import PEFT_PREFIX, add_lora, engine_state_fn
from rlhfkit.rollout import vllm as V
from tests.unit.rollout.test_vllm_colocated import FakeLLM, FakeModel
from tests.unit.rollout.test_vllm_lora import (
    a_step_syncs_the_attention_blocks,
    assert_equal_states,
    collate_ids,
)

bnb = pytest.importorskip("bitsandbytes")


def qlora_policy(tiny_folder, targets="all-linear"):
    torch.manual_seed(0)
    policy = add_lora(load_causal_lm(tiny_folder, load_in_4bit=True), rank=4, alpha=8, target_modules=targets)
    with torch.no_grad():  # peft starts B at zero (merged = base); give the adapters a value
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return policy


def effective_weights(policy, names) -> dict[str, torch.Tensor]:
    """The weights the trainer computes with, under the base model's `names`, computed without rlhfkit:
    bitsandbytes' dequantized 4-bit weight plus peft's delta weight of an adapted layer; the 4-bit weight
    alone for the other linears; the rest (embeddings, norms, head, an adapted layer's bias) from the
    policy's state dict."""
    from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit

    out = {}
    for name, module in policy.named_modules():
        hf = name.removeprefix(PEFT_PREFIX)
        if isinstance(module, LoraLinear4bit):
            w = module.base_layer.weight
            out[f"{hf}.weight"] = bnb.functional.dequantize_4bit(w.data, w.quant_state) + \
                module.get_delta_weight("default")
        elif isinstance(module, bnb.nn.Linear4bit) and not name.endswith(".base_layer"):
            out[f"{hf}.weight"] = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
    state = {k.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."): v for k, v in policy.state_dict().items()}
    return {name: out[name] if name in out else state[name] for name in names}


def float_names(tiny_folder) -> list[str]:
    return list(AutoModelForCausalLM.from_pretrained(tiny_folder).state_dict())


def engine_for(tiny_folder, policy):
    model = FakeModel(AutoModelForCausalLM.from_pretrained(tiny_folder).state_dict())  # vLLM's float model, zeroed
    source = engine_state_fn(policy)
    return V.VLLMEngine(str(tiny_folder), [2], llm=FakeLLM(model), state_fn=source), model, source


def test_the_first_sync_loads_the_dequantized_base_with_the_adapters_merged(tiny_folder):
    policy = qlora_policy(tiny_folder)
    engine, model, _ = engine_for(tiny_folder, policy)
    engine.update_weights({}, 1)
    want = effective_weights(policy, float_names(tiny_folder))
    assert len(want) == 2 + 2 * 9 + 1  # embeddings, head, final norm; per layer 7 linears and 2 norms
    assert_equal_states(model.params, want)
    assert all(t.dtype == torch.float32 for t in model.params.values())  # vLLM holds full precision


def test_the_synced_float_model_computes_what_the_trainers_4bit_policy_computes(tiny_folder):
    policy = qlora_policy(tiny_folder, targets=("q_proj", "v_proj"))  # the other 4-bit linears: dequantized alone
    engine, model, _ = engine_for(tiny_folder, policy)
    engine.update_weights({}, 1)
    float_model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    float_model.load_state_dict(model.params)
    ids = collate_ids()
    with torch.no_grad():
        want = response_logprobs(policy, ids)[0]
        torch.testing.assert_close(response_logprobs(float_model, ids)[0], want, atol=1e-5, rtol=1e-5)
        plain = AutoModelForCausalLM.from_pretrained(tiny_folder)  # the tiny_folder's weights, before the sync
        assert (response_logprobs(plain, ids)[0] - want).abs().max() > 1e-3


def test_after_an_optimizer_step_the_next_sync_carries_the_new_merge_of_the_adapted_modules(tiny_folder):
    policy = qlora_policy(tiny_folder, targets=("q_proj", "v_proj"))
    engine, model, source = engine_for(tiny_folder, policy)
    engine.update_weights({}, 1)
    names = float_names(tiny_folder)
    a_step_syncs_the_attention_blocks(engine, model, policy, lambda p: effective_weights(p, names))
    assert source.sent_bytes[1] == 2 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64) * 4  # float32, as the LoRA sync


def test_the_sync_leaves_the_4bit_layers_of_the_trainer_as_they_were(tiny_folder):
    policy = qlora_policy(tiny_folder)
    packed = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    engine, _, _ = engine_for(tiny_folder, policy)
    engine.update_weights({}, 1)
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in policy.modules()) == 2 * 7
    assert all(torch.equal(p, packed[n]) for n, p in policy.named_parameters() if n in packed)


def test_a_vision_language_policys_sync_dequantizes_the_language_model_and_sends_the_tower_as_it_is(tmp_path):
    from rlhfkit.models.tiny_vision import save_tiny_vision
    from rlhfkit.models.vision import load_vision_model

    save_tiny_vision(tmp_path, "qwen2_vl")
    torch.manual_seed(0)
    policy = add_lora(load_vision_model(str(tmp_path), load_in_4bit=True), rank=4, alpha=8,
                      target_modules=("q_proj", "v_proj"))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    float_state = load_vision_model(str(tmp_path)).state_dict()
    model = FakeModel(float_state)
    engine = V.VLLMEngine(str(tmp_path), [2], llm=FakeLLM(model), state_fn=engine_state_fn(policy))
    engine.update_weights({}, 1)
    want = effective_weights(policy, list(float_state))
    assert_equal_states(model.params, want)
    tower = [k for k in want if ".visual." in k]
    assert tower and all(torch.equal(want[k], float_state[k]) for k in tower)  # the float tower, as loaded
    assert any(not torch.equal(want[k], float_state[k]) for k in want if "language_model" in k)
