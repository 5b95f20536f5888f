"""The Learner's Muon option (--actor.optim muon, --train.optim muon): Muon for the hidden weight
matrices, AdamW for embeddings, LM head, norms and biases; values worked out by hand or against
torch.optim.Muon + torch.optim.AdamW applied by hand."""

import io
import math

import pytest
import torch

from rlhfkit.config.rl import MuonConfig
from rlhfkit.errors import CheckpointError, ConfigError
from rlhfkit.trainers.learner import Learner, muon_mask, muon_settings

MUON = dict(lr=0.02, momentum=0.95, ns_steps=5, nesterov=True)
ADAM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


class Toy(torch.nn.Module):
    """Embedding -> hidden Linear -> LayerNorm -> LM head: only `fc.weight` is a hidden matrix."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = torch.nn.Embedding(5, 4)
        self.fc = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3)
        self.lm_head = torch.nn.Linear(3, 5, bias=False)

    def forward(self, ids):
        return self.lm_head(self.norm(torch.tanh(self.fc(self.embed_tokens(ids)))))


def loss_of(model, step: int) -> torch.Tensor:
    ids = torch.tensor([[step % 5, (step + 2) % 5, 4]])
    return torch.nn.functional.cross_entropy(model(ids)[0], torch.tensor([1, 3, 0]))


def train(learner, model, steps, start=0):
    for s in range(start, start + steps):
        learner.backward(loss_of(model, s))
        learner.step()


def test_only_hidden_matrices_go_to_muon():
    named = list(Toy().named_parameters())
    assert [n for (n, _), m in zip(named, muon_mask(named)) if m] == ["fc.weight"]
    assert muon_settings("adam", MuonConfig()) is None
    assert muon_settings("muon", MuonConfig(lr=0.1)) == {"lr": 0.1, "momentum": 0.95, "ns_steps": 5, "nesterov": True}
    with pytest.raises(ConfigError, match="the optimizer is muon but no Muon settings were given"):
        muon_settings("muon", None)


def test_a_muon_step_is_torch_muon_on_the_matrices_plus_adamw_on_the_rest():
    model, ref = Toy(), Toy()
    learner = Learner(model, **ADAM, max_norm=0.0, muon=MUON)
    assert learner.muon.param_groups[0]["params"] == [model.fc.weight]
    hidden = [ref.fc.weight]
    rest = [p for n, p in ref.named_parameters() if n != "fc.weight"]
    muon = torch.optim.Muon(hidden, weight_decay=ADAM["weight_decay"], **MUON)
    adam = torch.optim.AdamW(rest, **ADAM, fused=True)
    for s in range(3):  # three steps: the momentum buffer and Adam's moments carry over
        loss_of(ref, s).backward()
        muon.step(), adam.step()
        muon.zero_grad(), adam.zero_grad()
    train(learner, model, 3)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("ns_steps", [1, 2])
def test_the_update_of_a_rank_one_gradient_by_hand(ns_steps):
    """W (4 x 2) = 0, loss = sum(W x) with x = e1: gradient G = 1 e1^T (rank one, Frobenius norm 2).
    Muon orthogonalises G / |G| = u v^T (u = 1/2 (1, 1, 1, 1), v = e1; singular value 1): each
    Newton-Schulz step maps a singular value s to 3.4445 s - 4.7750 s^3 + 2.0315 s^5, and the step
    is scaled by sqrt(max(1, 4 / 2)). Nesterov's first update is a multiple of G, which the
    normalisation cancels. So W[:, 0] = -lr * s_k * sqrt(2) * 1/2 and W[:, 1] = 0."""
    lin = torch.nn.Linear(2, 4, bias=False)
    with torch.no_grad():
        lin.weight.zero_()
    learner = Learner(lin, lr=1e-3, max_norm=0.0, muon=dict(MUON, lr=0.1, ns_steps=ns_steps))
    learner.backward(lin(torch.tensor([[1.0, 0.0]])).sum())
    learner.step()
    s = 1.0
    for _ in range(ns_steps):
        s = 3.4445 * s - 4.7750 * s ** 3 + 2.0315 * s ** 5  # 0.7010, then 1.1137
    expected = torch.zeros(4, 2)
    expected[:, 0] = -0.1 * s * math.sqrt(2) * 0.5
    torch.testing.assert_close(lin.weight.detach(), expected, atol=2e-3, rtol=0)  # Muon iterates in bfloat16
    assert learner.optimizer is None  # no other parameter: no AdamW


def test_switched_off_adam_and_muon_give_different_matrices_and_the_same_rest():
    """After one step the parameters AdamW owns in both runs match bit for bit; the matrix does not."""
    muon_model, adam_model = Toy(), Toy()
    train(Learner(muon_model, **ADAM, max_norm=0.0, muon=MUON), muon_model, 1)
    train(Learner(adam_model, **ADAM, max_norm=0.0), adam_model, 1)
    for (name, a), b in zip(muon_model.named_parameters(), adam_model.parameters()):
        assert torch.equal(a, b) == (name != "fc.weight"), name


def test_the_schedule_scales_both_learning_rates():
    learner = Learner(Toy(), **ADAM, total_steps=4, warmup_steps=2, scheduler="cosine", muon=MUON)
    learner.step()  # no gradients: a step that only advances the schedule (its lr: 0 / 2 of the warmup)
    m = learner.step()
    assert m["lr"] == pytest.approx(ADAM["lr"] / 2) and m["muon_lr"] == pytest.approx(MUON["lr"] / 2)


def _round_trip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_resume_with_muon_is_bit_exact_and_refuses_another_optimizer():
    kw = dict(**ADAM, total_steps=6, warmup_steps=2, scheduler="cosine_with_min_lr", min_lr_ratio=0.1,
              ema_beta=0.9, muon=MUON)
    straight = Toy()
    straight_learner = Learner(straight, **kw)
    train(straight_learner, straight, 6)
    first = Toy()
    learner = Learner(first, **kw)
    train(learner, first, 3)
    weights, state = _round_trip(first.state_dict()), _round_trip(learner.state_dict())
    assert state["muon"]["optimizer"]["state"]  # the momentum buffer is saved
    resumed = Toy(seed=1)
    resumed.load_state_dict(weights)
    again = Learner(resumed, **kw)
    again.load_state_dict(state)
    train(again, resumed, 3, start=3)
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(straight_learner.ema, again.ema, strict=True))
    assert again.scheduler.get_last_lr() == straight_learner.scheduler.get_last_lr()
    with pytest.raises(CheckpointError, match="written with the muon optimizer, this run uses adam"):
        Learner(Toy(), **ADAM).load_state_dict(state)
    with pytest.raises(CheckpointError, match="written with the adam optimizer, this run uses muon"):
        Learner(Toy(), **kw).load_state_dict(Learner(Toy(), **ADAM).state_dict())


def test_bf16_parameters_step_their_float32_masters_with_muon():
    model = Toy().to(torch.bfloat16)
    learner = Learner(model, **ADAM, max_norm=1.0, muon=MUON)
    assert learner.muon.param_groups[0]["params"][0].dtype == torch.float32
    before = model.fc.weight.detach().clone()
    learner.backward(loss_of(model, 0).float())
    learner.step()
    assert model.fc.weight.dtype == torch.bfloat16 and not torch.equal(model.fc.weight, before)
    i = next(i for i, p in enumerate(learner.params) if p is model.fc.weight)
    assert learner.muon.param_groups[0]["params"] == [learner.master[i]]
    assert torch.equal(model.fc.weight, learner.master[i].to(torch.bfloat16))


def test_settings_muon_refuses_are_a_config_error():
    with pytest.raises(ConfigError, match=r"^critic: Muon refuses its settings \(ValueError: momentum should be >= 0"):
        Learner(Toy(), lr=1e-3, name="critic", muon=dict(MUON, momentum=-1.0))


def test_a_non_finite_gradient_skips_both_optimizers():
    model = Toy()
    learner = Learner(model, **ADAM, muon=MUON)
    train(learner, model, 1)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    buffer = learner.muon.state[model.fc.weight]["momentum_buffer"].clone()
    learner.backward(loss_of(model, 1) * float("nan"))
    assert learner.step()["skipped_steps"] == 1.0
    assert all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())
    assert torch.equal(learner.muon.state[model.fc.weight]["momentum_buffer"], buffer)
    assert learner.schedulers[0].last_epoch == learner.schedulers[1].last_epoch == 1
