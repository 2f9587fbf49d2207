import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nmt.config import BatchingConfig, Curriculum, DataConfig
from nmt.data.curriculum import (
    check_difficulty,
    competence,
    competence_schedule,
    competence_update,
    difficulty_fractions,
    length_difficulty,
)
from nmt.data.sample_sort import distributed_sample_sort, lex_greater_equal, lexsort_rows

# --import-mode=importlib keeps test folders off sys.path; spawned workers inherit this entry.
sys.path.insert(0, os.path.dirname(__file__))
from _dist_helpers import GlooPool, sample_sort_task  # noqa: E402


def test_competence_starts_at_initial_and_reaches_one():
    c = competence(np.arange(0, 1201), total_updates=1000, initial=0.1)
    assert c[0] == pytest.approx(0.1)
    assert c[1000] == pytest.approx(1.0) and (c[1000:] == 1.0).all()
    assert (np.diff(c) >= 0).all()
    assert c[250] == pytest.approx(np.sqrt(0.25 * 0.99 + 0.01))


@settings(max_examples=60, deadline=None)
@given(
    fraction=st.floats(min_value=0.0, max_value=1.0),
    total=st.integers(min_value=1, max_value=10_000),
    initial=st.floats(min_value=0.001, max_value=1.0),
)
# Round-off cases the closed form alone got wrong: c0 near 1, and c(T) a hair under 1.
@example(fraction=1.0, total=9511, initial=0.9999999999998704)
@example(fraction=1.0, total=6737, initial=0.3186993704579522)
def test_competence_update_is_the_first_update_with_enough_competence(fraction, total, initial):
    t = int(competence_update(np.array([fraction]), total_updates=total, initial=initial)[0])
    assert competence(t, total_updates=total, initial=initial) >= fraction - 1e-12
    if t > 0:
        assert competence(t - 1, total_updates=total, initial=initial) < fraction


def test_difficulty_fractions_break_ties_by_index():
    fractions = difficulty_fractions(np.array([3.0, 1.0, 3.0, 1.0]))
    np.testing.assert_allclose(fractions, [0.75, 0.25, 1.0, 0.5])


def test_length_difficulty_and_score_checks():
    src, tgt = np.array([3, 5]), np.array([4, 2])
    np.testing.assert_array_equal(length_difficulty(src, tgt), [4, 5])
    with pytest.raises(ValueError, match="sample 1"):
        check_difficulty(np.array([0.5, np.nan]), num_samples=2)
    with pytest.raises(ValueError, match="one per sample"):
        check_difficulty(np.array([0.5]), num_samples=2)


def test_curriculum_option_is_parsed_once_into_a_typed_value():
    assert Curriculum.parse("length") == Curriculum("length")
    assert Curriculum.parse("file:a.txt,b.txt").paths == ("a.txt", "b.txt")
    assert Curriculum.parse("model:ck/x.pt").checkpoint == "ck/x.pt"
    for bad in ("bleu", "file:", "model:", "length:3"):
        with pytest.raises(ValueError, match="--curriculum: must be one of"):
            Curriculum.parse(bad)
    with pytest.raises(ValueError, match="one score file per --train-subsets entry"):
        DataConfig("d", train_subsets=("train", "train1"), curriculum="file:a.txt")
    with pytest.raises(ValueError, match="--competence-updates: needs a difficulty"):
        DataConfig("d", batching=BatchingConfig(competence_updates=10))


@settings(max_examples=60, deadline=None)
@given(
    eligible=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=60),
    start=st.integers(min_value=0, max_value=30),
    per_update=st.integers(min_value=1, max_value=5),
)
def test_competence_schedule_never_uses_a_batch_early_and_uses_every_batch(
    eligible, start, per_update
):
    eligible = np.array(eligible)
    sequence = competence_schedule(
        eligible, start_update=start, batches_per_update=per_update, rng=np.random.default_rng(0)
    )
    assert set(sequence.tolist()) == set(range(eligible.shape[0]))
    updates = start + np.arange(sequence.shape[0]) // per_update
    first = int(np.argmin(eligible))  # the stream may admit the easiest batch before its time
    late = (eligible[sequence] > updates) & (sequence != first)
    assert not late.any()
    # First appearances come by eligibility (clipped to the start), base order among equals.
    ready = np.maximum(eligible - start, 0)
    first_seen = sequence[np.sort(np.unique(sequence, return_index=True)[1])]
    np.testing.assert_array_equal(first_seen, np.argsort(ready, kind="stable"))


def test_competence_schedule_after_full_competence_keeps_the_base_order():
    eligible = np.array([3, 0, 2, 1, 0])
    sequence = competence_schedule(
        eligible, start_update=5, batches_per_update=2, rng=np.random.default_rng(0)
    )
    np.testing.assert_array_equal(sequence, np.arange(5))


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=40),
    query=st.tuples(st.integers(0, 4), st.integers(-3, 3)),
)
def test_lexsort_rows_and_lex_greater_equal_agree_with_python(rows, query):
    array = np.array(rows, dtype=np.int64).reshape(-1, 2)
    ordered = array[lexsort_rows(array)] if rows else array
    assert [tuple(r) for r in ordered.tolist()] == sorted(rows)
    assert lex_greater_equal(array, np.array(query)).tolist() == [r >= query for r in rows]


def test_sample_sort_on_one_process_is_a_plain_sort():
    keys = torch.tensor([[2.0, 0], [1.0, 3], [2.0, 1], [1.0, 2]])
    out = distributed_sample_sort(keys)
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == [[1.0, 2], [1.0, 3], [2.0, 0], [2.0, 1]]
    np.testing.assert_array_equal(distributed_sample_sort(np.array([3, 1, 2])), [1, 2, 3])
    with pytest.raises(ValueError, match="NaN"):
        distributed_sample_sort(np.array([1.0, np.nan]))


@pytest.fixture(scope="module", params=[2, 3], ids=["2procs", "3procs"])
def pool(request):
    gloo = GlooPool(request.param)
    yield gloo
    gloo.close()


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_distributed_sample_sort_equals_single_process_sort(pool, data):
    num_rows = data.draw(st.integers(min_value=0, max_value=120))
    # Few distinct difficulties: heavy duplicates, split only by the index column.
    levels = st.sampled_from([0.0, 0.5, 2.0, -1.0])
    difficulty = np.array(data.draw(st.lists(levels, min_size=num_rows, max_size=num_rows)))
    index = np.array(data.draw(st.permutations(range(num_rows))), dtype=np.float64)
    rows = np.stack([difficulty, index], axis=1) if num_rows else np.zeros((0, 2))
    # Random cut points give uneven, possibly empty shards.
    num_cuts = pool.world_size - 1
    cuts = sorted(
        data.draw(st.lists(st.integers(0, num_rows), min_size=num_cuts, max_size=num_cuts))
    )
    shards = np.split(rows, cuts)
    samples = data.draw(st.sampled_from([1, 3, 64]))
    slices = pool.run(sample_sort_task, [(shard, samples) for shard in shards])
    expected = rows[np.lexsort((rows[:, 1], rows[:, 0]))] if num_rows else rows
    np.testing.assert_array_equal(np.concatenate(slices), expected)


@pytest.mark.slow
def test_distributed_sample_sort_balances_duplicated_keys(pool):
    rng = np.random.default_rng(0)
    num_rows = 3000
    rows = np.stack(
        [
            rng.integers(0, 3, num_rows).astype(np.float64),
            rng.permutation(num_rows).astype(np.float64),
        ],
        1,
    )
    slices = pool.run(
        sample_sort_task, [(shard, 64) for shard in np.array_split(rows, pool.world_size)]
    )
    sizes = [s.shape[0] for s in slices]
    assert sum(sizes) == num_rows
    assert max(sizes) < 1.5 * num_rows / pool.world_size
