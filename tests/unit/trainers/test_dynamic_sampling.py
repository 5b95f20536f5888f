"""DAPO dynamic sampling in the trainer: dropped groups are replaced by new prompts, accepted
groups are never lost (also when the prompts run out mid-batch), and the demo's flags keep its
old drop-only behaviour."""

import itertools

import torch

from rlhfkit.agents.executor import SingleTurnExecutor
from rlhfkit.api import builder
from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
from rlhfkit.config.plan import plan_run
from rlhfkit.data.types import PromptItem
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.trainers.rl.stream import PromptBatch


def scripted_reward(queries, prompts, labels, **kwargs):
    """label "drop": every sample scores 1 (mean 1); "keep": samples alternate 0, 1 (mean 0.5)."""
    scores = [float(i % 2) if lbl == "keep" else 1.0 for i, lbl in enumerate(labels)]
    return RewardOutput(torch.tensor(scores), torch.tensor(scores))


def make_loop(labels, *flags):
    argv = ["--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "3",
            "--train.batch_size", "4", "--train.micro_batch_size", "4", "--actor.autocast", "none",
            "--algo.dynamic_filtering_enable", *flags]
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES)
    model, tok = tiny_model_and_tokenizer(seed=0)
    prompts = [PromptItem(f"p{i}:", tok(f"p{i}:", add_special_tokens=False)["input_ids"], lbl)
               for i, lbl in enumerate(labels)]
    counts = plan_run(cfg, validate(cfg), len(prompts))
    return builder.build_loop(cfg, counts, model, tok, HFEngine(model, tok), scripted_reward,
                              builder.prompt_stream(cfg, prompts), SingleTurnExecutor())


def rollout(loop, first, rest):
    """One train_step on `first`, topped up from the iterator `rest` (fixed seeds): the kept batch
    (prompts, trajectories, rewards, as the completion log sees them) and the step's metrics."""
    def take(n):
        got = list(itertools.islice(rest, n))
        return PromptBatch(got, [7] * len(got))

    loop.data.take_topup = take
    kept = []
    loop.log_completions = lambda collected, exp: kept.append(collected)  # called when the batch kept any
    metrics = loop.train_step(PromptBatch(list(first), [7] * len(first)))
    if not kept:
        return [], [], torch.zeros(0), metrics
    return kept[0].prompts, kept[0].trajs, kept[0].scored.rewards, metrics


def test_dropped_groups_are_topped_up_from_new_prompts():
    loop = make_loop(["drop", "keep", "drop", "drop", "keep", "keep"])
    ps = loop.data.prompts
    first, more = ps[:2], iter(ps[2:])
    prompts, trajs, rewards, m = rollout(loop, first, more)
    kept = sorted({prompts[t.group_id].text for t in trajs})
    assert kept == ["p1:", "p4:"]  # round 1 keeps p1; round 2 (p2) none; round 3 (p3) none; round 4 (p4)
    assert len(trajs) == 4 and rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert m["filtered_groups"] == 3 and m["dynamic_rounds"] == 4
    assert next(more).text == "p5:"  # only the prompts needed were taken


def test_accepted_groups_survive_when_the_prompts_run_out():
    loop = make_loop(["keep", "drop", "drop"])
    ps = loop.data.prompts
    prompts, trajs, _, m = rollout(loop, ps[:2], iter(ps[2:]))
    assert [prompts[t.group_id].text for t in trajs] == ["p0:", "p0:"] and m["filtered_groups"] == 2


def test_max_rounds_bounds_the_top_up():
    loop = make_loop(["drop"] * 8, "--algo.dynamic_filtering_max_rounds", "2")
    ps = loop.data.prompts
    _, trajs, _, m = rollout(loop, ps[:2], iter(ps[2:]))
    assert trajs == [] and m["dynamic_rounds"] == 2 and m["filtered_groups"] == 4  # 2 + 2 new, all dropped


def test_the_last_round_draws_no_prompts_it_will_not_use():
    loop = make_loop(["drop", "drop", "keep", "keep"], "--algo.dynamic_filtering_max_rounds", "1")
    ps = loop.data.prompts
    more = iter(ps[2:])
    _, trajs, _, m = rollout(loop, ps[:2], more)
    assert trajs == [] and m["dynamic_rounds"] == 1
    assert next(more).text == "p2:"  # still in the stream for the next step, not silently lost


def test_train_trains_full_batches_across_episodes_and_stops_when_prompts_run_out(capsys):
    loop = make_loop(["keep", "drop", "keep", "drop"], "--train.num_episodes", "2", "--rollout.temperature", "1.0")
    history = loop.train()
    # 2 episodes x 4 prompts, 2 keep per episode; each step needs 2 kept groups
    assert [m["filtered_groups"] for m in history] == [2.0, 2.0] and loop.step == 2
    assert all(m["optimizer_steps"] == 1.0 for m in history)
    # the run planned 2 rollouts per episode x 2 episodes and says in one line why it stopped at 2
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "training stopped" in ln]
    assert lines == ["training stopped after 2 of 4 planned steps: the prompts of --train.num_episodes 2 episode(s) "
                     "ran out (dynamic filtering drew extra prompts to top batches up, up to "
                     "--algo.dynamic_filtering_max_rounds 8 rounds per step); raise --train.num_episodes or add "
                     "prompts to reach them"]


def test_demo_flags_keep_the_drop_all_equal_behaviour():
    from rlhfkit.cli.demo import DEMO_FLAGS

    cfg = parse_config(RLConfig, DEMO_FLAGS, aliases=RL_ALIASES)
    a = cfg.algo
    assert a.dynamic_filtering_enable and a.dynamic_filtering_range == (0.0, 1.0)
    assert a.dynamic_filtering_max_rounds == 1  # no top-up: the run the demo's numbers came from
    old = parse_config(RLConfig, ["--rollout.dynamic_filtering", "--algo.overlong_buffer_len", "4"], aliases=RL_ALIASES)
    assert old.algo.dynamic_filtering_enable and old.reward.overlong_buffer_len == 4


def test_single_turn_generate_is_the_engines_generate():
    loop = make_loop(["keep", "keep"], "--train.seed", "7", "--rollout.temperature", "1.0")
    prompts = loop.data.prompts
    via_trainer = loop.source.generate(loop.data.take(2))
    engine = HFEngine(loop.policy, loop.tokenizer)
    from rlhfkit.rollout.base import SamplingParams

    params = SamplingParams(max_new_tokens=3, temperature=1.0, n=2)
    # the stream draws one seed per prompt from its sample_gen (seeded with --train.seed), in its shuffled order
    seeds = torch.randint(0, 2**62, (len(prompts),), generator=torch.Generator().manual_seed(7)).tolist()
    order = torch.randperm(2, generator=torch.Generator().manual_seed(8)).tolist()
    direct = engine.generate([prompts[i].ids for i in order], params, seeds=seeds)
    assert [t.response_ids.tolist() for t in via_trainer] == [t.response_ids.tolist() for t in direct]
    assert all(torch.equal(a.logprobs, b.logprobs) and a.group_id == b.group_id for a, b in zip(via_trainer, direct))


def test_overlong_penalty_under_its_reward_flag():
    from rlhfkit.data.types import Trajectory

    loop = make_loop(["drop", "drop"], "--reward.overlong_buffer_len", "2", "--reward.overlong_penalty_factor", "0.5")
    trajs = [Trajectory(torch.tensor([5]), torch.tensor([6] * n), torch.ones(n, dtype=torch.bool), torch.zeros(n),
                        "stop", 0, group_id=0) for n in (1, 2, 3)]
    scored = loop.scorer(loop.data.prompts, trajs)
    rewards, scores = scored.rewards, scored.scores
    # max_new_tokens 3, buffer 2: lengths 1, 2, 3 -> penalties 0, -0.25, -0.5 on reward 1
    assert rewards.tolist() == [1.0, 0.75, 0.5] and scores.tolist() == [1.0, 1.0, 1.0]
