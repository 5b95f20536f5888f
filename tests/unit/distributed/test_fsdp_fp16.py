"""float16 under FSDP2, in one process (a 1-rank gloo group): `fsdp.shard_model(..., "float16")` keeps float32
shards (the masters), gathers them in fp16 for forward and backward and reduces the gradients in float32
(what --actor.dtype float16 becomes with --fsdp.enable); the Learner's loss-scaled step over them tests the
norm of the whole sharded model (a DTensor, reduced over the ranks). Two ranks: tests/integration/test_fsdp_fp16.py."""

import pytest
import torch
import torch.distributed as dist

from rlhfkit.distributed import fsdp
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.precision import autocast_ctx
from rlhfkit.trainers.learner import Learner, unscale_and_clip
from rlhfkit.trainers.loss_scale import DynamicLossScale


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_float32_shards_are_gathered_in_fp16_and_the_scaled_norm_is_the_whole_models():
    from torch.distributed.tensor import DTensor

    model, _ = tiny_model_and_tokenizer(seed=0, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    fsdp.shard_model(model, 1, "float16")
    seen = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda m, args: seen.append(m.up_proj.weight.dtype))
    # unlike one process (models.precision: float32 norm weights and residual), the norms and residual are fp16
    norms = []
    model.model.layers[0].input_layernorm.register_forward_pre_hook(
        lambda m, args: norms.append((m.weight.dtype, args[0].dtype)))
    learner = Learner(model, 1e-2, max_norm=0.0, loss_scale=DynamicLossScale(initial_scale_power=4))
    ids = torch.arange(4, 12).view(1, 8)
    with autocast_ctx("float16"):
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
    learner.backward(loss)
    assert seen == [torch.float16] and norms == [(torch.float16, torch.float16)]
    params = learner.train_params
    assert {p.dtype for p in params} == {torch.float32} and learner.master is None  # the shards are the masters
    assert all(isinstance(p.grad, DTensor) and p.grad.dtype == torch.float32 for p in params)
    scaled = torch.stack([p.grad.full_tensor().norm() for p in params]).norm()
    norm = unscale_and_clip([p for p in params], 0.0, 16.0)
    assert isinstance(norm, DTensor) and float(norm) == pytest.approx(float(scaled) / 16, rel=1e-6)
