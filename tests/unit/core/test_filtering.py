import torch

from rlhfkit.core.filtering import keep_groups_in_range


def test_mean_outside_the_open_range_drops_the_group():
    gids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.2, 0.2])
    keep, dropped = keep_groups_in_range(gids, scores, 0.0, 1.0)
    assert keep.tolist() == [False, False, True, True, False, False, True, True] and dropped == 2
    keep, dropped = keep_groups_in_range(gids, scores, 0.1, 0.4)  # means 1, 0.5, 0, 0.2
    assert keep.tolist() == [False, False, False, False, False, False, True, True] and dropped == 3


def test_groups_need_not_be_contiguous():
    keep, dropped = keep_groups_in_range(torch.tensor([5, 7, 5, 7]), torch.tensor([1.0, 0.0, 0.0, 0.0]), 0, 1)
    assert keep.tolist() == [True, False, True, False] and dropped == 1


def test_with_binary_scores_range_0_1_is_the_all_equal_rule():
    g = torch.Generator().manual_seed(0)
    gids = torch.arange(200).repeat_interleave(4)
    scores = (torch.rand(800, generator=g) < 0.3).float()
    keep, _ = keep_groups_in_range(gids, scores, 0.0, 1.0)
    grouped = scores.view(200, 4)
    all_equal = (grouped == grouped[:, :1]).all(dim=1).repeat_interleave(4)
    assert torch.equal(keep, ~all_equal) and 0 < int(all_equal.sum()) < 800
