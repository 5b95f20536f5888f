"""Where the KL to the reference goes, by hand: in the reward (PPO style, --algo.kl.use_loss false:
each token's reward -coef * KL, summed into the returns) or in the loss (GRPO style, --algo.kl.use_loss
true: coef * the aggregated KL added to the policy loss, its gradient included)."""

import copy

import torch

from rlhfkit.core.losses import policy_loss
from rlhfkit.data.types import Trajectory
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate

COEF = 0.5


def trajs():
    return [Trajectory(torch.tensor([5, 6]), torch.tensor(r), torch.ones(len(r), dtype=torch.bool),
                       torch.zeros(len(r)), "stop", 0, g) for r, g in (([7, 8], 0), ([9], 1))]


def models():
    (policy, tok), (ref, _) = tiny_model_and_tokenizer(seed=0), tiny_model_and_tokenizer(seed=1)
    return policy, ref, tok


def maker(policy, ref, tok, kl_in_reward):
    return ExperienceMaker(policy, ref, None, MicroBatcher(tok.pad_token_id, 2), estimator="reinforce", gamma=1.0,
                           lam=1.0, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=kl_in_reward,
                           multi_step=False, temperature=1.0, autocast=None)


def test_kl_in_the_reward_is_a_per_token_penalty_summed_into_the_returns():
    policy, ref, tok = models()
    exp = maker(policy, ref, tok, kl_in_reward=True)(trajs(), torch.tensor([1.0, 0.0]), kl_coef=COEF)
    with torch.no_grad():
        kl = (response_logprobs(policy, exp.batch)[0] - response_logprobs(ref, exp.batch)[0]) * exp.batch.loss_mask
    assert float(kl.abs().max()) > 0.1  # two different models: the penalty shows
    # returns-to-go of the token rewards -COEF * kl, plus the sequence reward on its last token
    want = torch.stack([
        torch.stack([1.0 - COEF * (kl[0, 0] + kl[0, 1]), 1.0 - COEF * kl[0, 1]]),
        torch.stack([0.0 - COEF * kl[1, 0], torch.tensor(0.0)]),
    ])
    torch.testing.assert_close(exp.returns, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(exp.advantages, want, atol=1e-5, rtol=0)


def test_kl_in_the_loss_adds_its_gradient_and_leaves_the_returns_alone():
    policy, ref, tok = models()
    exp = maker(policy, ref, tok, kl_in_reward=False)(trajs(), torch.tensor([1.0, 0.0]), kl_coef=COEF)
    torch.testing.assert_close(exp.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # the rewards alone
    learner = Learner(policy, 1e-2, (0.9, 0.95), 1e-8, 0.0, total_steps=10)
    update = PolicyUpdate(policy, learner, MicroBatcher(tok.pad_token_id, 2),
                          LossSettings(max_len=2, kl_loss=True, kl_estimator="k1"), batch_size=2, max_epochs=1,
                          shuffle_gen=torch.Generator().manual_seed(0), autocast=None)
    policy.zero_grad(set_to_none=True)
    counts = {"num_tokens": 3, "num_seqs": 2, "max_len": 2}
    out = update.micro_step(exp, torch.arange(2), update.batcher.layout(exp.batch), COEF, counts)
    got = [p.grad.clone() for p in policy.parameters()]
    # by hand: PPO's loss at ratio 1 plus COEF * the token mean of k1 = logp - ref_logp
    twin = copy.deepcopy(policy)
    twin.zero_grad(set_to_none=True)
    mask = exp.batch.loss_mask
    logp = response_logprobs(twin, exp.batch)[0]
    loss, _ = policy_loss(logp, logp.detach(), exp.advantages, mask, agg="token_mean", **counts)
    kl = (logp - exp.ref_logp) * mask
    (loss + COEF * kl.sum() / 3).backward()
    assert abs(out["kl_loss"] - float(kl.sum())) < 1e-5 and float(kl.abs().sum()) > 0.1
    for a, (name, p) in zip(got, twin.named_parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-6, rtol=1e-5, msg=name)
