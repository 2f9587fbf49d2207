import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data import blend
from nmt.data.blend import (
    BlendedEpochs,
    allocate_samples,
    build_blend_index,
    fill_blocks,
    load_or_build_blend_index,
    make_plan,
    normalize_weights,
    weights_from_temperature,
)

# --import-mode=importlib keeps test folders off sys.path; spawned workers inherit this entry.
sys.path.insert(0, os.path.dirname(__file__))
from _blend_ranks import blended_epochs_on_rank  # noqa: E402
from _dist_helpers import GlooPool  # noqa: E402


def greedy_counts(weights: list[float], num_samples: int) -> np.ndarray:
    """Slow reference, O(N k): give each next sample to the corpus furthest below its target w N.

    np.argmax takes the first maximum, i.e. ties go to the lower corpus index.
    """
    targets = normalize_weights(weights, num_corpora=len(weights)) * num_samples
    counts = np.zeros(len(weights), dtype=np.int64)
    for _ in range(num_samples):
        counts[np.argmax(targets - counts)] += 1
    return counts


def megatron_counts(weights: list[float], num_samples: int) -> np.ndarray:
    """Megatron's helpers.cpp loop: the target grows with the step, w * max(step, 1)."""
    normalized = normalize_weights(weights, num_corpora=len(weights))
    counts = np.zeros(len(weights), dtype=np.int64)
    for step in range(num_samples):
        counts[np.argmax(normalized * max(step, 1) - counts)] += 1
    return counts


# Small integers give many equal weights and remainders: the tie-breaking is exercised.
weight_lists = st.lists(
    st.one_of(st.integers(0, 5).map(float), st.floats(0, 1e3)), min_size=1, max_size=12
).filter(lambda ws: sum(ws) > 0)


@settings(max_examples=150, deadline=None)
@given(weights=weight_lists, num_samples=st.integers(0, 1500))
def test_allocation_equals_greedy_reference(weights, num_samples):
    counts = allocate_samples(normalize_weights(weights, num_corpora=len(weights)), num_samples)
    np.testing.assert_array_equal(counts, greedy_counts(weights, num_samples))
    assert counts.sum() == num_samples
    targets = normalize_weights(weights, num_corpora=len(weights)) * num_samples
    assert np.all(np.abs(counts - targets) < 1)


def test_megatron_running_target_loop_is_not_largest_remainder():
    # The running target makes Megatron's loop house-monotone, which largest remainder is not
    # (Alabama paradox): from 10 to 11 samples the third corpus goes 2 -> 1 under largest
    # remainder, so the two cannot agree on both. Ours is the one closer to w N.
    weights = [3.0, 3.0, 1.0]
    np.testing.assert_array_equal(megatron_counts(weights, 11), [5, 4, 2])
    np.testing.assert_array_equal(
        allocate_samples(normalize_weights(weights, num_corpora=3), 11), [5, 5, 1]
    )
    np.testing.assert_array_equal(
        allocate_samples(normalize_weights(weights, num_corpora=3), 10), [4, 4, 2]
    )


@settings(max_examples=60, deadline=None)
@given(weights=weight_lists, num_samples=st.integers(0, 800))
def test_allocation_is_at_least_as_close_as_megatron(weights, num_samples):
    targets = normalize_weights(weights, num_corpora=len(weights)) * num_samples
    ours = allocate_samples(normalize_weights(weights, num_corpora=len(weights)), num_samples)
    theirs = megatron_counts(weights, num_samples)
    assert np.abs(ours - targets).sum() <= np.abs(theirs - targets).sum() + 1e-9


def check_index(sizes, weights, num_samples, corpus_ids, sample_ids):
    counts = allocate_samples(normalize_weights(weights, num_corpora=len(sizes)), num_samples)
    assert corpus_ids.shape == sample_ids.shape == (num_samples,)
    np.testing.assert_array_equal(np.bincount(corpus_ids, minlength=len(sizes)), counts)
    for corpus, (size, count) in enumerate(zip(sizes, counts)):
        uses = np.bincount(sample_ids[corpus_ids == corpus], minlength=size)
        assert uses.shape == (size,)  # no sample id out of range
        repeats, extra = divmod(int(count), size) if size else (0, 0)
        # Whole passes over the corpus, then a subset without replacement.
        assert np.count_nonzero(uses == repeats + 1) == extra
        assert np.count_nonzero(uses == repeats) == size - extra


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    data=st.data(),
    num_samples=st.integers(0, 3000),
    seed=st.integers(0, 2**32),
)
def test_index_has_the_allocated_counts_and_passes(sizes, data, num_samples, seed):
    weights = data.draw(st.lists(st.floats(0.01, 10), min_size=len(sizes), max_size=len(sizes)))
    corpus_ids, sample_ids = build_blend_index(sizes, weights, num_samples, seed=seed, epoch=3)
    assert corpus_ids.dtype == np.uint16 and sample_ids.dtype == np.int32
    check_index(sizes, weights, num_samples, corpus_ids, sample_ids)


def test_large_case_blocks_are_stratified_and_permuted():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 50_000, 300)
    weights = rng.random(300)
    num_samples = 2_000_000
    corpus_ids, sample_ids = build_blend_index(sizes, weights, num_samples, seed=7, epoch=0)
    check_index(sizes, weights, num_samples, corpus_ids, sample_ids)
    plan = make_plan(sizes, weights, num_samples, seed=7, epoch=0)
    assert plan.num_blocks > 10
    block_sizes = np.diff(plan.block_starts)
    expected = block_sizes[:, None] * (plan.counts / num_samples)[None, :]
    assert np.all(np.abs(plan.block_counts - expected) < 2)
    # Within a block the corpora are interleaved, not in runs: neighbours rarely share a corpus.
    same_as_next = np.mean(corpus_ids[1:] == corpus_ids[:-1])
    assert same_as_next < 2 * np.sum((plan.counts / num_samples) ** 2) + 0.01


def test_each_pass_over_a_repeated_corpus_has_a_fresh_order():
    # Corpus 0 fills half of the epoch: 4 passes of 2M samples, each spread over 4M slots.
    size, num_samples = 2_000_000, 16_000_000
    corpus_ids, sample_ids = build_blend_index([size, 10**8], [1, 1], num_samples, seed=5, epoch=0)
    window = slice(0, 1_000_000)  # the first quarter of pass 0: a quarter of the corpus
    next_pass = slice(2 * size, 2 * size + 1_000_000)  # the same quarter of pass 1
    first = sample_ids[window][corpus_ids[window] == 0]
    second = sample_ids[next_pass][corpus_ids[next_pass] == 0]
    assert 0.2 < first.size / size < 0.3 and 0.2 < second.size / size < 0.3
    # The same permutation every pass would give (almost) the same samples in both windows;
    # independent ones share a quarter of them.
    shared = np.intersect1d(first, second).size / first.size
    assert 0.2 < shared < 0.3, shared


def test_deterministic_per_seed_and_epoch():
    sizes, weights = [100, 2000, 7], [0.2, 0.5, 0.3]
    first = build_blend_index(sizes, weights, 5000, seed=1, epoch=2)
    again = build_blend_index(sizes, weights, 5000, seed=1, epoch=2, num_threads=3)
    other_epoch = build_blend_index(sizes, weights, 5000, seed=1, epoch=3)
    other_seed = build_blend_index(sizes, weights, 5000, seed=2, epoch=2)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[1], other_epoch[1])
    assert not np.array_equal(first[1], other_seed[1])


def test_result_does_not_depend_on_how_blocks_are_split():
    sizes, weights, num_samples = [50_000, 300, 90_000], [1, 2, 3], 600_000
    whole = build_blend_index(sizes, weights, num_samples, seed=0, epoch=0)
    plan = make_plan(sizes, weights, num_samples, seed=0, epoch=0)
    for world_size in (2, 3):
        parts = []
        for rank in range(world_size):
            first, last = blend._rank_blocks(plan.num_blocks, rank=rank, world_size=world_size)
            lo, hi = plan.block_starts[first], plan.block_starts[last]
            part = (np.zeros(hi - lo, np.uint16), np.zeros(hi - lo, plan.sample_dtype))
            fill_blocks(plan, *part, first_block=first, last_block=last)
            parts.append(part)
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), whole[0])
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), whole[1])


@pytest.mark.parametrize("num_slots", [1, 2, 3, 1000, 2**17 - 5, 2**17])
def test_block_permutation_is_a_bijection(num_slots):
    bits = max(1, (num_slots - 1).bit_length())
    base = blend._base_permutation(np.random.default_rng(num_slots), bits)
    np.testing.assert_array_equal(np.sort(base), np.arange(1 << bits))
    order = blend._walk(base, (1 << bits) - 1, num_slots)
    np.testing.assert_array_equal(np.sort(order), np.arange(num_slots))


def test_sample_dtype_widens_for_huge_corpora():
    plan = make_plan([2**31 + 10, 5], [1, 1], 1000, seed=0, epoch=0)
    assert plan.sample_dtype == np.int64
    assert make_plan([2**31, 5], [1, 1], 10, seed=0, epoch=0).sample_dtype == np.int32


def test_cache_hit_returns_identical_arrays(tmp_path, monkeypatch):
    args = ([300, 40, 5000], [0.3, 0.3, 0.4], 20_000)
    built = load_or_build_blend_index(*args, seed=3, epoch=1, cache_dir=tmp_path)
    assert sorted(p.name.split(".", 1)[1] for p in tmp_path.iterdir()) == [
        "corpus.npy",
        "sample.npy",
    ]

    def no_build(*_args, **_kwargs):
        raise AssertionError("cache miss")

    monkeypatch.setattr(blend, "build_blend_index", no_build)
    cached = load_or_build_blend_index(*args, seed=3, epoch=1, cache_dir=tmp_path)
    assert isinstance(cached[0], np.memmap)
    for a, b in zip(built, cached):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    with pytest.raises(AssertionError, match="cache miss"):
        load_or_build_blend_index(*args, seed=3, epoch=2, cache_dir=tmp_path)


def test_prefetch_serves_the_next_epoch(tmp_path):
    sizes, weights = [1000, 30, 4000], [1, 1, 2]
    with BlendedEpochs(sizes, weights, 50_000, seed=5, cache_dir=tmp_path) as epochs:
        first = epochs.get(0)
        assert epochs.num_prefetch_hits == 0
        second = epochs.get(1)
        assert epochs.num_prefetch_hits == 1
        epochs.get(5)  # a jump (resume) builds directly
        assert epochs.num_prefetch_hits == 1
    for got, epoch in ((first, 0), (second, 1)):
        direct = build_blend_index(sizes, weights, 50_000, seed=5, epoch=epoch)
        for a, b in zip(got, direct):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("weights", "message"),
    [([1, 2], "one weight per corpus"), ([1, -1, 1], ">= 0"), ([0, 0, 0], "all be zero")],
)
def test_bad_weights_name_the_option(weights, message):
    with pytest.raises(ValueError, match=f"--subset-weights.*{message}"):
        build_blend_index([10, 10, 10], weights, 5, seed=0, epoch=0)


def test_other_user_errors_name_the_option():
    with pytest.raises(ValueError, match="--sampling-temperature"):
        weights_from_temperature([10, 20], 0)
    with pytest.raises(ValueError, match="--train-subsets"):
        build_blend_index([1] * 65537, [1] * 65537, 5, seed=0, epoch=0)
    with pytest.raises(ValueError, match="--epoch-samples"):
        build_blend_index([10], [1], -1, seed=0, epoch=0)
    with pytest.raises(ValueError, match="empty but have a positive --subset-weights"):
        build_blend_index([10, 0], [1, 1], 5, seed=0, epoch=0)
    # An empty corpus with weight 0 is fine.
    corpus_ids, _ = build_blend_index([10, 0], [1, 0], 5, seed=0, epoch=0)
    assert set(corpus_ids.tolist()) == {0}


def test_weights_from_temperature():
    sizes = [100, 400, 0, 1600]
    np.testing.assert_allclose(weights_from_temperature(sizes, 1.0), [1 / 21, 4 / 21, 0, 16 / 21])
    np.testing.assert_allclose(weights_from_temperature(sizes, 2.0), [1 / 7, 2 / 7, 0, 4 / 7])
    assert np.ptp(weights_from_temperature(sizes, 1e6)[[0, 1, 3]]) < 1e-5
    assert np.isfinite(weights_from_temperature([10**9, 1], 0.01)).all()


def test_ranks_prefetch_only_their_part_of_each_epoch(tmp_path):
    case = ([70_000, 120, 30_000, 9], [0.4, 0.1, 0.3, 0.2], 400_000)
    assert make_plan(*case, seed=3, epoch=0).num_blocks >= 3  # each rank has real work
    pool = GlooPool(2)
    try:
        results = pool.run(blended_epochs_on_rank, [(*case, tmp_path, [0, 1])] * 2)
        # A second run (a resume) finds every part in the cache and builds nothing.
        again = pool.run(blended_epochs_on_rank, [(*case, tmp_path, [1])] * 2)
    finally:
        pool.close()
    for rank, (indices, parts_built, prefetch_hits) in enumerate(results):
        for epoch, (corpus_ids, sample_ids) in enumerate(indices):
            expected = build_blend_index(*case, seed=3, epoch=epoch)
            np.testing.assert_array_equal(corpus_ids, expected[0])
            np.testing.assert_array_equal(sample_ids, expected[1])
        # Epoch 0 on demand, 1 in the background (2 too unless closing cancelled it): this rank's
        # part only.
        assert {(0, rank), (1, rank)} <= set(parts_built) <= {(0, rank), (1, rank), (2, rank)}
        assert prefetch_hits == 1
    for rank, (indices, parts_built, _) in enumerate(again):
        np.testing.assert_array_equal(indices[0][1], results[rank][0][1][1])
        assert (1, rank) not in parts_built


def test_a_part_this_rank_cannot_see_is_built_here(tmp_path):
    sizes, weights, num_samples = [5000, 300], [1, 1], 300_000
    with BlendedEpochs(
        sizes,
        weights,
        num_samples,
        seed=3,
        cache_dir=tmp_path,
        rank=1,
        world_size=2,
        barrier=lambda: None,
    ) as blend:
        corpus_ids, sample_ids = blend.get(0)
    assert sorted(blend.parts_built)[:2] == [(0, 0), (0, 1)]
    expected = build_blend_index(sizes, weights, num_samples, seed=3, epoch=0)
    np.testing.assert_array_equal(corpus_ids, expected[0])
    np.testing.assert_array_equal(sample_ids, expected[1])
