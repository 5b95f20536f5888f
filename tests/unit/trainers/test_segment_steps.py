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
