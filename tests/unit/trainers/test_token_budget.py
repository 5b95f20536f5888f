"""--train.dynamic_batch_enable: the update's micro-batches hold about --train.max_tokens_per_micro_batch
real tokens (prompt + response) each, not --train.micro_batch_size samples; by hand."""

import torch

from rlhfkit.data.batch import collate
from rlhfkit.data.types import Trajectory
from rlhfkit.trainers.rl.batching import MicroBatcher


def test_micro_batches_are_cut_by_the_token_budget():
    trajs = [Trajectory(torch.tensor([5, 6]), torch.arange(7, 7 + n), torch.ones(n, dtype=torch.bool), torch.zeros(n),
                        "stop", 0, g) for g, n in enumerate([3, 4, 5, 2])]
    batch = collate(trajs, pad_id=0)
    group_ids, rows = torch.arange(4), torch.arange(4)
    # samples of 5, 6, 7 and 4 tokens under a budget of 12: 5 + 6, then 7 + 4 (5 + 6 + 7 would be 18)
    by_tokens = MicroBatcher(0, micro_batch_size=8, max_tokens=12, shared_prefix=False).cut(batch, group_ids, rows)
    assert [c.tolist() for c in by_tokens] == [[0, 1], [2, 3]]
    by_samples = MicroBatcher(0, micro_batch_size=8, shared_prefix=False).cut(batch, group_ids, rows)
    assert [c.tolist() for c in by_samples] == [[0, 1, 2, 3]]
