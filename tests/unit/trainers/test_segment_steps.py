"""An optimizer step takes `batch_size` samples; an agent episode split into segments (the endpoint's
rewritten histories, re-rendered tool episodes) is one sample, so a rollout runs the planned
optimizer steps however many segments it holds, and each episode's segments train in one step."""

from types import SimpleNamespace

import torch

from rlhfkit.trainers.rl.update import PolicyUpdate


class Rows:
    """The part of an Experience the step split reads: its length and its rows' episodes."""

    def __init__(self, episodes, n):
        self.episodes, self.n = episodes, n

    def __len__(self):
        return self.n


def steps(episodes, batch_size, seed=0):
    update = SimpleNamespace(batch_size=batch_size, shuffle_gen=torch.Generator().manual_seed(seed))
    exp = Rows(None, 8) if episodes is None else Rows(torch.tensor(episodes), len(episodes))
    return [s.tolist() for s in PolicyUpdate.step_rows(update, exp)]


def test_segments_of_one_episode_share_an_optimizer_step_and_the_step_count_is_the_episodes():
    # 4 episodes (planned: 2 steps of 2), split into 1, 3, 1 and 2 segments: 7 rows
    got = steps([0, 1, 1, 1, 2, 3, 3], batch_size=2)
    assert len(got) == 2  # per row it would be 4 steps
    assert sorted(r for s in got for r in s) == list(range(7))  # every row once
    episode_of = [0, 1, 1, 1, 2, 3, 3]
    for s in got:
        assert len({episode_of[r] for r in s}) == 2  # two whole episodes a step
    for e in range(4):
        assert sum(any(episode_of[r] == e for r in s) for s in got) == 1


def test_one_row_per_episode_gives_the_per_row_steps():
    assert steps(list(range(8)), batch_size=4, seed=3) == steps(None, batch_size=4, seed=3)


def test_the_reward_metric_counts_an_episode_in_segments_once():
    from rlhfkit.data.types import Trajectory
    from rlhfkit.trainers.rl.scoring import Scorer

    def traj(episode, reward):
        info = {"agent_reward": reward, "agent_score": reward, "extra_logs": {"hit": reward}, "turns": 1,
                "episode": episode}
        return Trajectory(torch.tensor([1]), torch.tensor([2]), torch.tensor([True]), torch.tensor([0.0]), "stop",
                          0, info=info)

    # episode a: reward 1 in three segments; episode b: reward 0 in one. Per episode: 0.5 (per row: 0.75)
    scored = Scorer(None, tokenizer=None, max_len=8)([], [traj("a", 1.0)] * 3 + [traj("b", 0.0)])
    assert scored.metrics["reward"] == 0.5 and scored.metrics["reward_extra/hit"] == 0.5
    assert scored.rewards.tolist() == [1.0, 1.0, 1.0, 0.0]  # every segment trains with its episode's reward
