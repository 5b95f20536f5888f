import pytest
import torch

from rlhfkit.core import AGGREGATIONS, aggregate_loss

PT = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
M = torch.tensor([[True, True, False, False], [True, True, True, True], [False] * 4])


def test_values_by_hand():
    assert aggregate_loss(PT, M, "token_mean").item() == pytest.approx((3 + 26) / 6)
    # row means 1.5 and 6.5; empty row 3 skipped
    assert aggregate_loss(PT, M, "seq_mean_token_mean").item() == pytest.approx(4.0)
    assert aggregate_loss(PT, M, "seq_mean_token_sum").item() == pytest.approx(14.5)
    assert aggregate_loss(PT, M, "seq_mean_token_sum_norm").item() == pytest.approx((3 / 4 + 26 / 4) / 2)
    assert aggregate_loss(PT, M, "seq_mean_token_sum_norm", max_len=10).item() == pytest.approx(1.45)
    assert aggregate_loss(PT, M, "token_mean", num_tokens=29).item() == pytest.approx(1.0)
    assert aggregate_loss(PT, M, "seq_mean_token_sum", num_seqs=29).item() == pytest.approx(1.0)


def test_nothing_counted_is_zero():
    none = torch.zeros_like(M)
    for mode in AGGREGATIONS:
        assert aggregate_loss(PT, none, mode).item() == 0.0


def test_unknown_mode_lists_valid():
    with pytest.raises(ValueError, match="token_mean.*") as err:
        aggregate_loss(PT, M, "sum")
    for mode in AGGREGATIONS:
        assert mode in str(err.value)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batches_with_global_counts_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    B, T = 9, 11
    per_token = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[3] = 0  # one sequence without counted tokens
    mask = torch.arange(T) < lengths[:, None]
    mask[1, 2] = False  # a hole
    max_len = T if mode == "seq_mean_token_sum_norm" else None
    full = aggregate_loss(per_token, mask, mode, max_len=max_len)

    num_tokens = mask.sum()
    num_seqs = mask.any(-1).sum()
    perm = torch.randperm(B, generator=g)
    total = torch.zeros((), dtype=torch.float64)
    for idx in (perm[:2], perm[2:6], perm[6:]):
        width = max(int(lengths[idx].max()), 1)  # each micro-batch padded to its own width
        sub_mask = mask[idx, :width]
        total = total + aggregate_loss(
            per_token[idx, :width], sub_mask, mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
        )
    torch.testing.assert_close(total, full, atol=1e-12, rtol=0)


def test_data_parallel_counts_divided_by_world_size():
    # two ranks, each gets half the sequences; count passed = global / world size;
    # averaging the rank losses (what DDP does to gradients) gives the full loss.
    g = torch.Generator().manual_seed(1)
    per_token = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 5, generator=g) > 0.3
    mask[:, 0] = True
    for mode in AGGREGATIONS:
        full = aggregate_loss(per_token, mask, mode, max_len=5)
        n_tok, n_seq = mask.sum() / 2, mask.any(-1).sum() / 2
        ranks = [
            aggregate_loss(per_token[s], mask[s], mode, num_tokens=n_tok, num_seqs=n_seq, max_len=5)
            for s in (slice(0, 2), slice(2, 4))
        ]
        torch.testing.assert_close((ranks[0] + ranks[1]) / 2, full, atol=1e-12, rtol=0)


def test_gradient_flows_only_through_counted_tokens():
    x = PT.clone().requires_grad_(True)
    aggregate_loss(x, M, "token_mean").backward()
    assert torch.equal(x.grad, M.float() / 6)
