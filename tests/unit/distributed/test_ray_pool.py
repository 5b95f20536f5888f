"""Pure parts of the Ray engine pool: how prompts are cut into worker shards."""

import pytest

pytest.importorskip("ray")

from rlhfkit.distributed.pool import split_even  # noqa: E402 - after ray is found


def test_split_even_by_hand():
    assert split_even(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_even(4, 2) == [(0, 2), (2, 4)]
    assert split_even(1, 3) == [(0, 1), (1, 1), (1, 1)]  # empty shards are skipped by submit
    assert split_even(0, 2) == [(0, 0), (0, 0)]
