"""A TRL GRPOConfig's loss, mapped by config/trl_names.py, is rlhfkit's same loss: the value and the
gradient of TRL's own GRPOTrainer._compute_loss (when trl is importable) against the loss rlhfkit's
update stage builds from the mapped flags (api.builder.loss_settings -> LossSettings.policy_loss_call)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.api.builder import loss_settings
from rlhfkit.config import RLConfig
from rlhfkit.config.trl_names import TRL_LOSS_TYPES, grpo_config_flags, trl_loss_flags
from rlhfkit.errors import ConfigError

B, T, MAX_LEN = 4, 6, 8


def batch():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.5, -0.7, 0.4, -1.2], dtype=torch.float64)
    lengths = torch.tensor([6, 3, 5, 1])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return logp, old, adv, mask


def ours(flags, logp, old, adv, mask):
    cfg = RLConfig.from_args(flags)
    settings = loss_settings(cfg, cfg.rollout.max_new_tokens)
    fn, kw = settings.policy_loss_call(torch.Generator().manual_seed(0))
    lp = logp.clone().requires_grad_(True)
    counts = dict(num_tokens=int(mask.sum()), num_seqs=int(mask.any(-1).sum()), max_len=settings.max_len)
    loss, _ = fn(lp, old, adv.unsqueeze(-1).expand(B, T), mask, **kw, **counts)
    loss.backward()
    return loss.detach(), lp.grad


def trl_loss(config, logp, old, adv, mask):
    """TRL's GRPOTrainer._compute_loss on these logprobs: a stand-in trainer with TRL's own attributes."""
    from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: PLC0415

    lp = logp.clone().requires_grad_(True)
    ident = SimpleNamespace(num_processes=1, sync_gradients=False, gather=lambda x: x, reduce=lambda x, **_: x,
                            gather_for_metrics=lambda x: x)
    trainer = SimpleNamespace(
        loss_type=config.loss_type, importance_sampling_level=config.importance_sampling_level, beta=0.0,
        epsilon_low=config.epsilon, epsilon_high=config.epsilon_high if config.epsilon_high is not None
        else config.epsilon, args=config, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        use_vllm=False, vllm_importance_sampling_correction=False, aux_loss_enabled=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=config.max_completion_length, accelerator=ident, _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)), get_gamma_weights=GRPOTrainer.get_gamma_weights,
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, torch.zeros_like(lp), None))
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), lp.grad


TRL_CASES = [
    dict(loss_type="grpo"), dict(loss_type="grpo", importance_sampling_level="sequence"),
    dict(loss_type="dapo"), dict(loss_type="dapo", epsilon_high=0.28, delta=1.5),
    dict(loss_type="dapo", importance_sampling_level="sequence"), dict(loss_type="bnpo"),
    dict(loss_type="dr_grpo"), dict(loss_type="luspo", importance_sampling_level="sequence"),
    dict(loss_type="cispo", epsilon_high=1.3), dict(loss_type="sapo"),
    dict(loss_type="sapo", sapo_temperature_pos=0.8, sapo_temperature_neg=1.3), dict(loss_type="vespo"),
]


@pytest.mark.parametrize("case", TRL_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_trl_grpo_config_maps_to_the_same_loss(case):
    trl = pytest.importorskip("trl")
    config = trl.GRPOConfig(output_dir="unused", max_completion_length=MAX_LEN, report_to=[], bf16=False,
                             use_cpu=True, **case)
    logp, old, adv, mask = batch()
    theirs, their_grad = trl_loss(config, logp, old, adv, mask)
    loss, grad = ours(grpo_config_flags(config), logp, old, adv, mask)
    tol = 1e-6 if case["loss_type"] == "sapo" else 1e-10  # TRL makes sapo's temperatures float32 tensors
    assert loss.item() == pytest.approx(theirs.item(), abs=tol)
    torch.testing.assert_close(grad, their_grad, atol=tol, rtol=0)
    assert loss.abs().item() > 1e-3 and grad.abs().sum().item() > 1e-3


def test_every_trl_loss_type_has_a_row():
    trl = pytest.importorskip("trl")
    doc = trl.GRPOConfig.__doc__
    named = {t for t in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo") if f'`"{t}"`' in doc}
    assert named == set(TRL_LOSS_TYPES)


def test_flags_by_hand_without_trl():
    assert trl_loss_flags("grpo") == ["--actor.policy_loss_type", "ppo", "--actor.loss_agg_mode",
                                      "seq_mean_token_mean", "--actor.eps_clip_low_high", "0.2", "0.2"]
    assert trl_loss_flags("cispo", epsilon_high=5.0)[4:] == ["--actor.eps_clip_low_high", "1.0", "4.0"]
    assert trl_loss_flags("dr_grpo", max_completion_length=64)[-2:] == ["--rollout.max_new_tokens", "64"]
    assert trl_loss_flags("luspo", "sequence")[:4] == ["--actor.policy_loss_type", "gspo", "--actor.loss_agg_mode",
                                                        "seq_mean_token_sum"]
    # the mapped cispo loss by hand: the weight clamp(r, 0, 5) with no lower bound
    cfg = RLConfig.from_args(trl_loss_flags("cispo", epsilon_high=5.0))
    fn, kw = loss_settings(cfg, 4).policy_loss_call(None)
    lp = torch.tensor([[math.log(7.0), math.log(0.1)]], requires_grad=True)
    loss, _ = fn(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), **kw)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-5.0 / 2, -0.1 / 2]]))


@pytest.mark.parametrize("kw,needle", [
    (dict(loss_type="ppo"), "unknown; valid: grpo"),
    (dict(loss_type="cispo", importance_sampling_level="sequence"), "token-level ratios only"),
    (dict(loss_type="dapo", delta=1.1), "delta > 1 \\+ epsilon_high"),
    (dict(loss_type="sapo", delta=3.0), "clipped losses"),
])
def test_what_rlhfkit_cannot_reproduce_is_refused(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        trl_loss_flags(**kw)
