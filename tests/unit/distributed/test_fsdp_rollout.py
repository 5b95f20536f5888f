"""FSDP2 and the rollout, in one process (a 1-rank gloo group): the HF engine decodes through the
sharded policy with its parameters gathered once per generation (`fsdp.unsharded`; with FSDP's
default reshard after forward every unit was gathered again at every decoded token), and the vLLM
weight source gathers the full state part by part on the model's device (`fsdp.StreamedState`), not
the whole state dict on every rank's GPU."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

from rlhfkit.distributed import fsdp
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def sharded():
    model, tok = tiny_model_and_tokenizer(seed=0)
    plain = tiny_model_and_tokenizer(seed=0)[0]
    return fsdp.shard_model(model, 1), plain, tok


def _gathers(monkeypatch) -> list:
    """Records each FSDP unit's real unshard (its parameters were sharded when asked)."""
    gathers = []
    real = FSDPParamGroup.unshard

    def counting(self, async_op=False):
        if not self.is_unsharded and self._all_gather_result is None:
            gathers.append(self)
        return real(self, async_op)

    monkeypatch.setattr(FSDPParamGroup, "unshard", counting)
    return gathers


def _generate(model, tok, gather):
    engine = HFEngine(model, tok, inference_mode=False, gather=gather)
    prompts = [tok(t)["input_ids"] for t in ("What is 2+3?", "1+1=")]
    return engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, n=2), seeds=[1, 2])


def test_the_rollout_gathers_each_unit_once_and_reshards_after(sharded, monkeypatch):
    model, plain, tok = sharded
    units = len({id(g) for g in _param_groups(model)})
    gathers = _gathers(monkeypatch)
    trajs = _generate(model, tok, fsdp.unsharded)
    assert len(gathers) == units  # once per unit for the whole generation
    assert all(g.is_sharded for g in _param_groups(model))  # resharded after
    want = _generate(plain, tok, None)  # the unsharded model's samples
    assert [t.response_ids.tolist() for t in trajs] == [t.response_ids.tolist() for t in want]


def test_without_it_every_decoded_token_gathers_again(sharded, monkeypatch):
    model, _, tok = sharded
    units = len(_param_groups(model))
    gathers = _gathers(monkeypatch)
    _generate(model, tok, None)
    assert len(gathers) > 3 * units  # the prefill and every step


def test_training_after_the_rollout_reshards_after_forward_again(sharded, monkeypatch):
    model, _, tok = sharded
    _generate(model, tok, fsdp.unsharded)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert all(g.is_sharded for g in _param_groups(model))


def _param_groups(model):
    from torch.distributed.fsdp import FSDPModule

    return [g for m in model.modules() if isinstance(m, FSDPModule)
            for g in m._get_fsdp_state()._fsdp_param_groups]


def test_streamed_state_gathers_part_by_part_on_the_models_device(sharded, monkeypatch):
    from torch.distributed.tensor import DTensor

    model, plain, _ = sharded
    gathered = []
    real = DTensor.full_tensor
    monkeypatch.setattr(DTensor, "full_tensor", lambda self, **kw: gathered.append(1) or real(self, **kw))
    state = fsdp.StreamedState(model)
    assert not gathered  # nothing gathered until a part is read
    parts = state.parts(bucket_bytes=64 * 64 * 4)  # about one [64, 64] float32 matrix per part
    first = next(parts)
    assert len(gathered) <= len(first) + 1  # only the first part (and the next tensor) so far
    rest = list(parts)
    full = {k: v for part in [first, *rest] for k, v in part.items()}
    want = plain.state_dict()
    assert full.keys() == want.keys() and all(torch.equal(full[k], want[k]) for k in want)
    device = next(model.parameters()).device
    assert all(v.device == device for v in full.values())  # not copied to the CPU
    assert len(rest) >= 3


def test_the_fsdp_weight_source_is_streamed():
    from rlhfkit.api.builder import shard_for_fsdp
    from rlhfkit.config import RLConfig

    model, _ = tiny_model_and_tokenizer(seed=0)
    source = shard_for_fsdp(RLConfig.from_args(["--fsdp.enable", "true"]),
                            model, None, None, 1)
    assert isinstance(source(), fsdp.StreamedState)


def test_a_sharded_lora_policy_streams_its_merged_weights():
    """FSDP + LoRA + vLLM: the streamed state of the sharded peft model, merged part by part (a
    layer's base weight, A and B gathered in different parts), equals peft's merge of an unsharded
    copy; the sharded model keeps its adapters."""
    import copy

    from rlhfkit.models.lora import MergedLoraState, add_lora

    model, _ = tiny_model_and_tokenizer(seed=0)
    policy = add_lora(model, 4, 8, "all-linear")
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    want = copy.deepcopy(policy).merge_and_unload().state_dict()
    fsdp.shard_model(policy, 1)
    merged = MergedLoraState(policy, fsdp.StreamedState(policy))
    parts = list(merged.parts(bucket_bytes=64 * 64 * 4))
    got = {k: v for part in parts for k, v in part.items()}
    assert len(parts) >= 3 and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert any("lora_A" in n for n, _ in policy.named_parameters())


@pytest.mark.parametrize("arch", ["modernbert_decoder", "llama4_text"])
def test_a_model_whose_get_decoder_is_not_its_backbone_is_sharded_on_its_backbone(arch):
    """ModernBERT-decoder's get_decoder() is its LM head, Llama 4's the LM itself (a unit around the head's
    unit): the backbone unit is the decoder the logprobs call (models.logprobs.decoder_backbone), and the
    sharded model's logprobs are the plain model's."""
    from rlhfkit.data.batch import collate
    from rlhfkit.data.supervised import TokenSample
    from rlhfkit.models import response_logprobs

    model, _ = tiny_model_and_tokenizer(seed=0, arch=arch)
    plain = tiny_model_and_tokenizer(seed=0, arch=arch)[0]
    batch = collate([TokenSample(torch.tensor([5, 6, 7]), torch.tensor([8, 9]), torch.ones(2, dtype=torch.bool))], 0)
    with torch.no_grad():
        want = response_logprobs(plain, batch)
        got = response_logprobs(fsdp.shard_model(model, 1), batch)
    torch.testing.assert_close(got, want)
