import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data.packing import (
    cu_seqlens_from_lengths,
    first_fit_decreasing,
    karmarkar_karp,
    partition_microbatches,
    positions_from_lengths,
    repair_capacity,
    restore_order,
)

# --import-mode=importlib keeps test folders off sys.path; spawned workers inherit this entry.
sys.path.insert(0, os.path.dirname(__file__))
from _dist_helpers import GlooPool, partition_task  # noqa: E402

lengths_strategy = st.lists(st.integers(min_value=0, max_value=9), max_size=12)


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_strategy)
def test_offsets_and_positions_from_lengths(lengths):
    sizes = np.array(lengths, dtype=np.int64)
    cu_seqlens = cu_seqlens_from_lengths(sizes)
    assert cu_seqlens.dtype == np.int32
    assert cu_seqlens.tolist() == np.concatenate([[0], np.cumsum(lengths, dtype=int)]).tolist()
    assert positions_from_lengths(sizes).tolist() == [p for n in lengths for p in range(n)]
    assert positions_from_lengths(sizes, total=sum(lengths) + 2).tolist()[-2:] == [0, 0]


partition_lengths = st.lists(st.integers(min_value=0, max_value=100), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    lengths=partition_lengths,
    max_tokens=st.integers(100, 250),
    min_partitions=st.sampled_from([None, 1, 5]),
)
def test_partition_respects_the_cap_and_keeps_every_sample(lengths, max_tokens, min_partitions):
    lengths = np.array(lengths, dtype=np.int64)
    parts = partition_microbatches(lengths, max_tokens, min_partitions=min_partitions)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    np.testing.assert_array_equal(np.sort(flat), np.arange(lengths.shape[0]))
    assert all(lengths[p].sum() <= max_tokens for p in parts)
    assert all((np.diff(p) > 0).all() for p in parts)  # original order inside each micro-batch
    fewest = max(
        len(first_fit_decreasing(lengths, max_tokens)), -(-int(lengths.sum()) // max_tokens), 1
    )
    assert len(parts) == max(fewest, min_partitions or 1)
    np.testing.assert_array_equal(flat[restore_order(parts)], np.arange(lengths.shape[0]))


def test_karmarkar_karp_balances():
    lengths = np.array([8, 7, 6, 5, 4])
    # Largest differencing: 8-7 -> 1, 6-5 -> 1, then 4 - 1 - 1 = 2 (the optimum is 15/15).
    assert sorted(int(lengths[p].sum()) for p in karmarkar_karp(lengths, 2)) == [14, 16]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, 200)
    sums = [int(lengths[p].sum()) for p in karmarkar_karp(lengths, 6)]
    assert max(sums) - min(sums) <= 2


def test_repair_moves_items_out_of_an_overfull_part():
    lengths = np.array([6, 5, 4, 3])
    parts = [[0, 1, 2], [3]]  # 15 and 3 under a cap of 10
    assert repair_capacity(parts, lengths, 10)
    assert all(lengths[p].sum() <= 10 for p in parts)
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]
    swapped = [[0, 1], [2, 3]]  # 11 and 7 under a cap of 10: no single move fits, a swap does
    assert repair_capacity(swapped, np.array([6, 5, 4, 1]), 10)
    assert not repair_capacity([[0, 1], [2]], np.array([6, 5, 9]), 10)


def test_partition_names_a_sample_over_the_budget():
    with pytest.raises(ValueError, match="sample 2"):
        partition_microbatches([3, 4, 50], 10)


@pytest.mark.slow
def test_ranks_agree_on_the_number_of_micro_batches():
    pool = GlooPool(2)
    try:
        parts = pool.run(partition_task, [(np.full(12, 9), 20), (np.array([3, 4]), 20)])
    finally:
        pool.close()
    assert len(parts[0]) == len(parts[1]) == 6
    assert sum(p.shape[0] == 0 for p in parts[1]) == 4  # empty micro-batches pad the short rank
