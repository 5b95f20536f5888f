"""Recorded calls -> trajectories (agents/endpoint/segments.py), worked by hand, and the group
baseline that counts an episode's segments once (core.advantages.episode_baseline)."""

import torch

from rlhfkit.agents.endpoint.segments import Call, stitch
from rlhfkit.core.advantages import compute_advantages, episode_baseline, group_baseline
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP
from rlhfkit.trainers.rl.experience import episode_ids


def test_a_conversation_that_keeps_its_history_is_one_trajectory():
    calls = [Call([1, 2], [3, 4], [-0.1, -0.2], 5, FINISH_STOP),
             Call([1, 2, 3, 4, 9, 9], [5], [-0.3], 6, FINISH_LENGTH)]
    out = stitch(calls, group_id=3, version=6, info={"agent_reward": 1.0})
    assert out.splits == 0 and len(out.trajectories) == 1
    t = out.trajectories[0]
    assert t.prompt_ids.tolist() == [1, 2]
    assert t.response_ids.tolist() == [3, 4, 9, 9, 5]
    assert t.loss_mask.tolist() == [True, True, False, False, True]  # the agent's feedback is masked
    torch.testing.assert_close(t.logprobs, torch.tensor([-0.1, -0.2, 0.0, 0.0, -0.3]))
    assert t.versions.tolist() == [5, 5, 5, 5, 6] and t.version == 5
    assert t.group_id == 3 and t.truncated and t.info == {"agent_reward": 1.0}


def test_a_rewritten_history_gives_segments_that_train_only_what_each_call_sampled():
    calls = [Call([1, 2], [3, 4], [-0.1, -0.2], 0, FINISH_STOP),
             Call([1, 7, 4], [8, 8], [-0.5, -0.6], 0, FINISH_STOP)]  # turn 1 summarised: no prefix
    out = stitch(calls, group_id=0, version=0, info={"episode": "e"})
    assert out.splits == 1
    first, second = out.trajectories
    assert (first.prompt_ids.tolist(), first.response_ids.tolist(), first.loss_mask.tolist()) == ([1, 2], [3, 4],
                                                                                                 [True, True])
    assert (second.prompt_ids.tolist(), second.response_ids.tolist(), second.loss_mask.tolist()) == (
        [1, 7, 4], [8, 8], [True, True])
    assert all(t.info == {"episode": "e"} for t in out.trajectories)


def test_two_calls_from_one_history_fork_and_the_later_extends_the_longer_segment():
    calls = [Call([1], [2], [-1.0], 0, FINISH_STOP),
             Call([1, 2, 5], [6], [-2.0], 0, FINISH_STOP),     # extends call 0
             Call([1, 2, 7], [8], [-3.0], 0, FINISH_STOP),     # the same history, another branch
             Call([1, 2, 5, 6, 0], [4], [-4.0], 0, FINISH_STOP)]  # extends the first branch
    out = stitch(calls, 0, 0, {})
    assert out.splits == 1
    main, branch = out.trajectories
    assert main.response_ids.tolist() == [2, 5, 6, 0, 4]
    assert main.loss_mask.tolist() == [True, False, True, False, True]
    assert branch.prompt_ids.tolist() == [1, 2, 7] and branch.response_ids.tolist() == [8]


def test_episode_baseline_counts_each_episode_once():
    # prompt 0: episode A (two segments, reward 1) and episode B (reward 0); prompt 1: C (3), D (1)
    rewards = torch.tensor([1.0, 1.0, 0.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    episodes = torch.tensor([10, 10, 11, 12, 13])
    # by hand, episodes once: group 0 mean 0.5 -> A +0.5, B -0.5; group 1 mean 2 -> C +1, D -1
    assert episode_baseline(rewards, groups, episodes, "mean").tolist() == [0.5, 0.5, -0.5, 1.0, -1.0]
    # counting the segments would weigh A twice: mean 2/3
    assert abs(group_baseline(rewards, groups, "mean")[2].item() + 2 / 3) < 1e-6
    mask = torch.ones(5, 2, dtype=torch.bool)
    adv, _ = compute_advantages("dr_grpo", rewards, mask, groups, episode_ids=episodes)
    assert adv[:, 0].tolist() == [0.5, 0.5, -0.5, 1.0, -1.0] and torch.equal(adv[:, 0], adv[:, 1])


def test_episode_ids_come_from_the_trajectories_info():
    calls = [Call([1], [2], [-1.0], 0, FINISH_STOP), Call([9], [3], [-1.0], 0, FINISH_STOP)]
    a = stitch(calls, 0, 0, {"episode": "x"}).trajectories
    b = stitch(calls[:1], 0, 0, {"episode": "y"}).trajectories
    assert episode_ids(a + b).tolist() == [0, 0, 1]
    assert episode_ids(stitch(calls, 0, 0, {}).trajectories) is None


def test_a_call_extends_a_segment_only_when_its_images_start_with_the_segments():
    """Images by key: ("a",) then ("a", "b") extends, and the trajectory carries the last call's
    images; ("b",) with the same ids does not (Qwen2-VL's image tokens are one id for any image)."""
    one, two, other = object(), object(), object()  # stand-ins for the calls' VisionInputs
    calls = [Call([1, 9], [3], [-0.1], 0, FINISH_STOP, ("a",), one),
             Call([1, 9, 3, 9], [4], [-0.2], 0, FINISH_STOP, ("a", "b"), two),
             Call([1, 9, 3, 9, 4], [5], [-0.3], 0, FINISH_STOP, ("b",), other)]
    out = stitch(calls, group_id=0, version=0, info={"episode": "e"})
    assert out.splits == 1
    first, second = out.trajectories
    assert first.response_ids.tolist() == [3, 9, 4] and first.loss_mask.tolist() == [True, False, True]
    assert first.info == {"episode": "e", "vision": two}
    assert second.prompt_ids.tolist() == [1, 9, 3, 9, 4] and second.info == {"episode": "e", "vision": other}
    text = stitch([Call([1], [2], [-1.0], 0, FINISH_STOP)], 0, 0, {})
    assert "vision" not in text.trajectories[0].info  # no images: nothing added
