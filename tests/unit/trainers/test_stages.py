"""Each stage of the RL loop alone, with a tiny model and values worked out by hand."""

import math

import pytest
import torch

from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.errors import CheckpointError, DataError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.scoring import BatchFill, GroupFilter, Scored, Scorer
from rlhfkit.trainers.rl.stream import PromptBatch, PromptStream
from rlhfkit.trainers.rl.sync import sync_weights
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


def items(n):
    return [PromptItem(f"p{i}", [5 + i], label=i) for i in range(n)]


def stream(n=5, batch=2, episodes=2, seed=0):
    return PromptStream(items(n), batch, episodes, torch.Generator().manual_seed(seed + 1),
                        torch.Generator().manual_seed(seed))


def traj(prompt, response, group, logprobs=None, version=0, mask=None):
    r = torch.tensor(response)
    return Trajectory(torch.tensor(prompt), r, torch.ones(len(response), dtype=torch.bool) if mask is None
                      else torch.tensor(mask), torch.tensor(logprobs or [0.0] * len(response)), "stop", version, group)


# ------------------------------------------------------------------ data position
def test_stream_cuts_each_episode_to_whole_batches_with_one_seed_per_prompt():
    s = stream(n=5, batch=2, episodes=2)
    order0 = torch.randperm(5, generator=torch.Generator().manual_seed(1)).tolist()[:4]
    seen, episodes = [], []
    while s.episode < 2:
        ep = s.episode
        for b in s.rollout_batches():
            seen.append([p.label for p in b.prompts])
            episodes.append(ep)
            assert len(b.seeds) == len(b) == 2
    assert episodes == [0, 0, 1, 1]  # 5 prompts, batches of 2: the 5th of each shuffle is left out
    assert seen[0] + seen[1] == order0
    assert not s.take(2)  # every episode consumed


def test_peek_leaves_the_checkpointed_position_before_the_batch_drawn_ahead():
    s, ref = stream(), stream()
    s.take(2), ref.take(2)
    before = s.state_dict()
    ahead = s.peek(2)
    assert s.state_dict()["index"] == before["index"] == 2  # a checkpoint now redraws `ahead` on resume
    assert torch.equal(s.state_dict()["sample_gen"], before["sample_gen"])
    assert s.take(2) is ahead
    assert (s.state_dict()["episode"], s.state_dict()["index"]) == (1, 0)  # ahead was episode 0's last batch
    again = ref.take(2)  # the same prompts and seeds as without the look-ahead
    assert [p.label for p in again.prompts] == [p.label for p in ahead.prompts] and again.seeds == ahead.seeds


def test_resumed_stream_continues_as_the_uninterrupted_one():
    a = stream()
    a.take(2)
    state = a.state_dict()
    b = stream()
    b.load_state_dict(state)
    x, y = a.take(3), b.take(3)
    assert [p.label for p in x.prompts] == [p.label for p in y.prompts] and x.seeds == y.seeds


def labels(batch):
    return [p.label for p in batch.prompts]


def test_topup_while_a_batch_is_ahead_draws_past_it_and_a_resumed_stream_skips_it():
    # 12 prompts, batches of 3, one episode: order o; step 1 takes o[0:3], peeks o[3:6] (async
    # look-ahead), then tops up 2 prompts (dynamic filtering): o[6:8], past the batch ahead
    s = stream(n=12, batch=3, episodes=1)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(1)).tolist()
    assert labels(s.take(3)) == order[0:3]
    ahead = s.peek(3)
    top = s.take_topup(2)
    assert labels(ahead) == order[3:6] and labels(top) == order[6:8]
    state = s.state_dict()  # a checkpoint after step 1: before the batch ahead, the top-up recorded
    assert (state["index"], state["topups"]) == (3, [2])
    resumed = stream(n=12, batch=3, episodes=1)
    resumed.load_state_dict(state)
    again = resumed.take(3)  # the batch ahead drawn again, with its seeds; the top-up skipped
    assert labels(again) == labels(ahead) and again.seeds == ahead.seeds
    assert s.take(3) is ahead
    x, y = s.take(3), resumed.take(3)
    assert labels(x) == labels(y) == order[8:11] and x.seeds == y.seeds  # no prompt twice, none lost
    assert s.state_dict()["topups"] == resumed.state_dict()["topups"] == []


def test_topup_without_a_batch_ahead_is_take():
    a, b = stream(), stream()
    x, y = a.take_topup(3), b.take(3)
    assert labels(x) == labels(y) and x.seeds == y.seeds and a.state_dict()["topups"] == []


def test_stream_refuses_too_few_prompts_and_a_foreign_checkpoint():
    with pytest.raises(DataError, match="fewer than --rollout.batch_size 4"):
        stream(n=3, batch=4)
    with pytest.raises(CheckpointError, match="4 prompts and --rollout.batch_size 2"):
        stream(n=5).load_state_dict({**stream(n=4).state_dict()})


# ------------------------------------------------------------------ score and filter
class FakeTok:
    def batch_decode(self, ids, skip_special_tokens=False):
        return [" ".join(map(str, x)) + (" </s>" if not skip_special_tokens else "") for x in ids]


def test_scorer_shapes_and_normalises_rewards_by_hand():
    calls = {}

    def reward(queries, prompts, labels, **kw):
        calls.update(queries=queries, labels=labels, **kw)
        return RewardOutput(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 1.0]))

    ps = items(2)
    trajs = [traj([5], [1, 2, 3, 4], 0), traj([5], [1], 0), traj([6], [1, 2, 3], 1)]
    scorer = Scorer(reward, FakeTok(), max_len=4, overlong=(2, 1.0), normalize=True)
    out = scorer(ps, trajs)
    # lengths 4, 1, 3 with budget 4 and buffer 2: exceed 2, -1, 1 -> penalties -1, 0, -0.5
    shaped = torch.tensor([0.0, 0.0, 0.5])
    mean, std = shaped.mean(), shaped.var(unbiased=False).sqrt()
    torch.testing.assert_close(out.rewards, (shaped - mean) / (std + 1e-8))
    assert out.scores.tolist() == [1.0, 0.0, 1.0]  # filtering looks at unshaped scores
    assert out.metrics["reward"] == pytest.approx(2 / 3) and out.metrics["overlong_penalty"] == pytest.approx(-0.5)
    assert calls["queries"][0] == "p01 2 3 4 </s>" and calls["responses"][1] == "1" and calls["labels"] == [0, 0, 1]
    assert calls["completion_ids"] == [[1, 2, 3, 4], [1], [1, 2, 3]] and calls["raw_prompts"] == ["p0", "p0", "p1"]
    assert calls["group_ids"].tolist() == [0, 0, 1] and calls["response_lengths"].tolist() == [4.0, 1.0, 3.0]


def test_scorer_applies_the_stop_properly_penalty_after_the_overlong_one_by_hand():
    def reward(queries, prompts, labels, **kw):
        return RewardOutput(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0]))

    trajs = [traj([5], [1, 2, 3, 4], 0), traj([5], [1], 0), traj([6], [1, 2, 3], 1)]
    trajs[0].finish_reason = trajs[2].finish_reason = "length"  # cut at the budget: not stopped
    # overlong (budget 4, buffer 2): penalties -1, 0, -0.5 -> 0, 1, -0.5; then x 0.5 where truncated
    out = Scorer(reward, FakeTok(), max_len=4, overlong=(2, 1.0), stop_coef=0.5)(items(2), trajs)
    assert out.rewards.tolist() == [0.0, 1.0, -0.25] and out.metrics["stop_properly_penalised"] == 2.0
    assert out.scores.tolist() == [1.0, 1.0, 0.0]  # filtering looks at unshaped scores
    fixed = Scorer(reward, FakeTok(), max_len=4, stop_coef=-0.5)(items(2), trajs)
    assert fixed.rewards.tolist() == [-0.5, 1.0, -0.5]  # below 0: the truncated samples' reward is the coef
    off = Scorer(reward, FakeTok(), max_len=4)(items(2), trajs)
    assert off.rewards.tolist() == [1.0, 1.0, 0.0] and "stop_properly_penalised" not in off.metrics


def test_scorer_adds_the_weighted_environment_reward_to_the_functions():
    def reward(queries, prompts, labels, **kw):
        return RewardOutput(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0]))

    trajs = [traj([5], [1], 0), traj([5], [2], 0)]
    for t, env in zip(trajs, (0.5, -1.0)):  # what an environment's episodes carry
        t.info = {"agent_reward": env, "agent_score": env, "extra_logs": {}, "turns": 2}
    out = Scorer(reward, FakeTok(), max_len=4, env_weight=0.5)(items(1), trajs)
    assert out.rewards.tolist() == [1.25, -0.5] and out.scores.tolist() == [1.25, -0.5]
    assert out.metrics["reward_extra/env_reward"] == pytest.approx(-0.25) and out.metrics["reward"] == 0.375
    alone = Scorer(reward, FakeTok(), max_len=4)(items(1), trajs)  # no weight: the function's alone
    assert alone.rewards.tolist() == [1.0, 0.0] and "reward_extra/env_reward" not in alone.metrics


def test_group_filter_keeps_groups_with_mean_score_strictly_inside():
    trajs = [traj([5], [1], g) for g in (0, 0, 1, 1)]
    scored = Scored(torch.tensor([1.0, 2, 3, 4]), torch.tensor([1.0, 1, 0, 1]), torch.arange(8.0).view(4, 2))
    kept, part, dropped = GroupFilter(True, (0.0, 1.0))(trajs, scored)
    assert [t.group_id for t in kept] == [1, 1] and dropped == 1
    assert part.rewards.tolist() == [3.0, 4.0] and part.token_rewards.tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert GroupFilter(False)(trajs, scored)[2] == 0


def test_batch_fill_numbers_groups_across_rounds_and_asks_for_the_missing_groups(tiny):
    def scored(scores):
        s = torch.tensor(scores)
        return Scored(s, s, None, {"reward": float(s.mean())})

    fill = BatchFill(GroupFilter(True, (0.0, 1.0), 3), tiny[1], want=2)
    first = [traj(p.ids, [1, 2], i) for i, p in enumerate(items(2)) for _ in range(2)]
    # round 1: group 0 all 1 (dropped), group 1 kept -> one group missing
    assert fill.add(PromptBatch(items(2), [1, 2]), first, scored([1.0, 1.0, 0.0, 1.0])) == 1
    second = [traj(items(4)[2].ids, [1, 2], 0) for _ in range(2)]
    assert fill.add(PromptBatch(items(4)[2:3], [3]), second, scored([0.0, 1.0])) == 0  # the batch is full
    got = fill.collected()
    assert [t.group_id for t in got.trajs] == [1, 1, 2, 2]  # group ids index got.prompts
    assert [p.label for p in got.prompts] == [0, 1, 2] and got.generated_tokens == 12
    m = got.scored.metrics
    assert m["filtered_groups"] == 1 and m["dynamic_rounds"] == 2 and m["reward"] == 0.75  # the first round's
    assert m["score"] == pytest.approx(4 / 6)  # the mean over both rounds, dropped groups included


def test_train_step_times_each_stage():
    from rlhfkit.agents.executor import SingleTurnExecutor
    from rlhfkit.api import builder
    from rlhfkit.config import rl as rl_config
    from rlhfkit.config.plan import plan_run

    cfg = rl_config.RLConfig.from_args([
        "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "3",
        "--train.batch_size", "4", "--train.micro_batch_size", "4", "--actor.autocast", "none"])
    model, tok = tiny_model_and_tokenizer(seed=0)

    def reward(queries, prompts, labels, **kw):
        r = torch.tensor([1.0, 0.0] * (len(queries) // 2))
        return RewardOutput(r, r)

    counts = plan_run(cfg, rl_config.validate(cfg), 2)
    loop = builder.build_loop(cfg, counts, model, tok, HFEngine(model, tok), reward,
                              builder.prompt_stream(cfg, items(2)), SingleTurnExecutor())
    metrics = loop.train_step(next(iter(loop.data.rollout_batches())))
    assert {k for k in metrics if k.startswith("time/")} == {
        "time/generate", "time/reward", "time/experience", "time/update", "time/sync", "time/step"}


# ------------------------------------------------------------------ experience
def test_experience_group_norm_advantages_rollout_logprobs_and_versions_by_hand(tiny):
    model, tok = tiny
    trajs = [traj([5, 6], [7, 8], 0, [-1.0, -2.0], version=2), traj([5, 6], [7], 0, [-0.5], version=3)]
    trajs[0].versions = torch.tensor([2, 3])  # a partial rollout: token 2 after a weight update
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 2), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=True, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=False, temperature=1.0, autocast=None)
    exp = maker(trajs, torch.tensor([1.0, 0.0]), kl_coef=0.0)
    a = 1 / math.sqrt(0.5)  # (r - mean) / unbiased std of {1, 0}: +-0.5 / 0.7071
    torch.testing.assert_close(exp.advantages, torch.tensor([[0.5 * a, 0.5 * a], [-0.5 * a, 0.0]]))
    assert exp.old_logp is None and exp.ref_logp is None  # one optimizer step, no KL: nothing to precompute
    assert exp.rollout_logp.tolist() == [[-1.0, -2.0], [-0.5, 0.0]] and exp.versions.tolist() == [2, 3]
    assert exp.token_versions.tolist() == [[2, 3], [3, -1]]
    assert exp.device.type == "cpu"


def test_experience_adds_token_rewards_before_the_returns(tiny):
    model, tok = tiny
    trajs = [traj([5], [7, 8, 9], 0)]
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 1), estimator="reinforce", gamma=0.5,
                            lam=1.0, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=True, temperature=1.0, autocast=None)
    exp = maker(trajs, torch.tensor([2.0]), kl_coef=0.0, token_rewards=torch.tensor([[1.0, 0.0]]))
    # token rewards [1, 0, 2] (the scalar on the last token), gamma 0.5: G = [1 + 0.5 * 1, 0 + 0.5 * 2, 2]
    torch.testing.assert_close(exp.returns, torch.tensor([[1.5, 1.0, 2.0]]))
    assert exp.old_logp is not None and exp.old_logp.shape == (1, 3)  # several optimizer steps: computed


# ------------------------------------------------------------------ update and sync
def make_update(model, tok, batch_size=2, epochs=1):
    learner = Learner(model, 1e-2, (0.9, 0.95), 1e-8, 0.0, total_steps=10)
    return PolicyUpdate(model, learner, MicroBatcher(tok.pad_token_id, 1), LossSettings(max_len=4),
                        batch_size=batch_size, max_epochs=epochs, shuffle_gen=torch.Generator().manual_seed(0),
                        autocast=None)


def test_update_with_zero_advantages_leaves_the_weights_and_counts_steps(tiny):
    model, tok = tiny
    model = type(model)(model.config)
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 4), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=True, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=True, temperature=1.0, autocast=None)
    trajs = [traj([5, 6], [7, 8], 0), traj([5, 6], [9], 0), traj([5], [7, 8, 9], 1), traj([5], [9], 1)]
    exp = maker(trajs, torch.tensor([1.0, 1.0, 0.0, 0.0]), kl_coef=0.0)  # all-equal groups: advantages 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = make_update(model, tok, batch_size=2, epochs=2)(exp, kl_coef=0.0)
    assert out["optimizer_steps"] == 4.0  # 4 samples / 2 per step x 2 epochs
    assert out["response_tokens"] == 7 * 2 and out["policy_loss"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # zero gradients, no move


def test_update_moves_the_weights_towards_the_positive_advantage(tiny):
    model, tok = tiny
    model = type(model)(model.config)
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 4), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=True, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=True, temperature=1.0, autocast=None)
    good, bad = traj([5, 6], [7], 0), traj([5, 6], [9], 0)
    exp = maker([good, bad], torch.tensor([1.0, 0.0]), kl_coef=0.0)
    update = make_update(model, tok, batch_size=2)
    for _ in range(3):
        update(exp, kl_coef=0.0)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6]])).logits[0, -1].log_softmax(-1)
    gain = (logits[7] - logits[9]) - (exp.old_logp[0, 0] - exp.old_logp[1, 0])
    assert gain > 1e-3, float(gain)  # a margin above float noise: without an optimizer step the gain is ~0


def test_sync_weights_bumps_the_engine_version(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok)
    v = engine.version
    assert sync_weights(engine) == v + 1 == engine.version


# ------------------------------------------------------------------ variants are table entries
def test_a_new_estimator_trains_through_the_loop_with_only_its_table_entries(monkeypatch, tiny):
    """docs/algorithms.md "How to add an advantage estimator": the core table entry and the config
    tuples are all the trainer needs (it reads the spec, never the name)."""
    from rlhfkit.agents.executor import SingleTurnExecutor
    from rlhfkit.api import builder
    from rlhfkit.config import rl as rl_config
    from rlhfkit.config import rl_checks
    from rlhfkit.config.plan import plan_run
    from rlhfkit.core.advantages import ESTIMATORS, EstimatorSpec

    monkeypatch.setitem(ESTIMATORS, "mean_discounted",
                        EstimatorSpec(baseline="mean", force_gamma_one=False, whiten=False, needs_critic=False))
    monkeypatch.setattr(rl_checks, "ADVANTAGE_ESTIMATORS", (*rl_checks.ADVANTAGE_ESTIMATORS, "mean_discounted"))
    monkeypatch.setattr(rl_checks, "GROUP_ESTIMATORS", (*rl_checks.GROUP_ESTIMATORS, "mean_discounted"))
    cfg = rl_config.RLConfig.from_args([
        "--algo.advantage.estimator", "mean_discounted", "--algo.advantage.gamma", "0.5",
        "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "3",
        "--train.batch_size", "4", "--train.micro_batch_size", "4", "--actor.autocast", "none"])
    model, tok = tiny_model_and_tokenizer(seed=0)

    def reward(queries, prompts, labels, **kw):
        r = torch.tensor([1.0, 0.0] * (len(queries) // 2))
        return RewardOutput(r, r)

    counts = plan_run(cfg, rl_config.validate(cfg), 2)
    loop = builder.build_loop(cfg, counts, model, tok, HFEngine(model, tok), reward,
                              builder.prompt_stream(cfg, items(2)), SingleTurnExecutor())
    made = []
    make = ExperienceMaker.__call__
    monkeypatch.setattr(ExperienceMaker, "__call__",
                        lambda self, *a, **kw: made.append(make(self, *a, **kw)) or made[-1])
    history = loop.train()
    assert len(history) == 1 and history[0]["optimizer_steps"] == 1.0 and loop.update.critic is None
    # mean baseline: rewards 1, 0 in each group of 2 -> +-0.5 on the last token, times 0.5 per token before it
    (exp,) = made
    lengths = exp.batch.loss_mask.sum(-1).tolist()
    want = torch.zeros_like(exp.advantages)
    for row, n in enumerate(lengths):
        sign = 1.0 if row % 2 == 0 else -1.0
        want[row, :n] = torch.tensor([sign * 0.5 * 0.5 ** (n - 1 - t) for t in range(n)])
    assert max(lengths) > 1  # a row long enough for the discount to show
    torch.testing.assert_close(exp.advantages, want, atol=1e-6, rtol=0)
