"""topologies.stats: the one percentile every p50/p99 uses (nearest rank)."""

import pytest

from topologies.stats import percentile


def test_nearest_rank_is_one_of_the_values():
    values = [15, 20, 35, 40, 50]             # the textbook example of nearest rank
    assert percentile(values, 5) == 15
    assert percentile(values, 30) == 20
    assert percentile(values, 40) == 20
    assert percentile(values, 50) == 35
    assert percentile(values, 99) == 50
    assert percentile(reversed(values), 50) == 35     # any order, any iterable


def test_ends_and_empty():
    values = [3.0, 1.0, 2.0]
    assert percentile(values, 0) == 1.0       # the smallest
    assert percentile(values, 100) == 3.0     # the largest
    assert percentile([], 50) is None
    assert percentile([7], 0) == percentile([7], 99) == 7
    with pytest.raises(ValueError):
        percentile(values, 101)
