"""Memory levers observed, not assumed: --gradient_checkpointing makes the policy the trainer builds
recompute each decoder layer in backward (its MLP runs twice) and keep fewer tensors for
backward (torch.autograd.graph.saved_tensors_hooks); an offloaded reference model is moved to the
device for its pass and back (recorded: the CPU has no other device to move to)."""

import pytest
import torch

import rlhfkit
from rlhfkit.data.types import Trajectory
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from tests.integration.test_devices_and_levers import rl_flags


@pytest.fixture(scope="module")
def policies(tiny_ws, tmp_path_factory):
    """The policy modules of two trainers built from the flags: plain and with --gradient_checkpointing."""
    ws = tiny_ws("levers", [{"q": f"{i} plus {i}:"} for i in range(8)], sevens=True)
    out = tmp_path_factory.mktemp("levers_runs")

    def policy(name, **over):
        return rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(rl_flags(ws, out / name, **over))).loop.policy

    return policy("plain"), policy("ckpt", gradient_checkpointing="true")


def forward_backward(model) -> torch.Tensor:
    model.train()
    model.zero_grad(set_to_none=True)
    ids = torch.randint(4, 80, (2, 12), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids, labels=ids).loss


def test_gradient_checkpointing_recomputes_each_layer_in_backward(policies):
    counts = []
    for model in policies:
        calls = []
        hook = model.model.layers[0].mlp.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        try:
            forward_backward(model).backward()
        finally:
            hook.remove()
        counts.append(len(calls))
    assert counts == [1, 2]  # plain: one forward of its MLP; checkpointed: the forward and its recompute


def test_gradient_checkpointing_saves_fewer_tensors_for_backward(policies):
    saved = []
    for model in policies:
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = forward_backward(model)
        loss.backward()
        saved.append(sum(sizes))
    plain, ckpt = saved
    assert ckpt < 0.7 * plain, saved  # only the layers' inputs are kept, not their activations


def test_an_offloaded_reference_moves_to_the_device_for_its_pass_and_back(monkeypatch):
    policy, tok = tiny_model_and_tokenizer(seed=0)
    ref, _ = tiny_model_and_tokenizer(seed=0)
    moves = []
    monkeypatch.setattr(ref, "to", lambda *args, **kwargs: moves.append(torch.device(args[0]).type) or ref)
    maker = ExperienceMaker(policy, ref, None, MicroBatcher(tok.pad_token_id, 2), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=False, temperature=1.0, autocast=None, ref_device=torch.device("cuda"))
    trajs = [Trajectory(torch.tensor([5, 6]), torch.tensor(r), torch.ones(len(r), dtype=torch.bool),
                        torch.zeros(len(r)), "stop", 0, 0) for r in ([7, 8], [9])]
    maker(trajs, torch.tensor([1.0, 0.0]), kl_coef=0.1)
    assert moves == ["cuda", "cpu"]
    # no KL: no pass
    assert maker(trajs, torch.tensor([1.0, 0.0]), kl_coef=0.0) is not None and moves == ["cuda", "cpu"]
