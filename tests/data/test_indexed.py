import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data.indexed import IndexedDataset, IndexedWriter, scan_token_ids
from nmt.data.spm import token_dtype


@settings(max_examples=40, deadline=None)
@given(
    sequences=st.lists(
        st.lists(st.integers(min_value=0, max_value=70_000), max_size=30), max_size=40
    ),
    chunk=st.integers(min_value=1, max_value=7),
)
def test_round_trip_random_ids_and_lengths(tmp_path_factory, sequences, chunk):
    dtype = token_dtype(max((max(s) for s in sequences if s), default=0) + 1)
    prefix = str(tmp_path_factory.mktemp("idx") / "split.xx")
    writer = IndexedWriter(prefix, dtype=dtype)
    for start in range(0, len(sequences), chunk):
        part = sequences[start : start + chunk]
        lengths = np.array([len(s) for s in part], dtype=np.int64)
        tokens = np.array([t for s in part for t in s], dtype=np.int64)
        writer.add_many(tokens, lengths)
    assert writer.finish() == sum(len(s) for s in sequences)

    dataset = IndexedDataset(prefix)
    assert len(dataset) == len(sequences)
    assert dataset.dtype == dtype
    assert dataset.lengths.tolist() == [len(s) for s in sequences]
    for i, expected in enumerate(sequences):
        assert dataset[i].tolist() == expected


def test_uint32_when_vocabulary_exceeds_uint16():
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def _write(prefix, sequences):
    writer = IndexedWriter(prefix, dtype=np.dtype(np.uint16))
    writer.add_many(
        np.array([t for s in sequences for t in s]), np.array([len(s) for s in sequences])
    )
    writer.finish()


def test_truncated_token_file_is_detected(tmp_path):
    prefix = str(tmp_path / "a")
    _write(prefix, [[1, 2, 3], [4]])
    with open(prefix + ".bin", "r+b") as handle:
        handle.truncate(os.path.getsize(prefix + ".bin") - 2)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        IndexedDataset(prefix)


def test_wrong_magic_is_detected(tmp_path):
    prefix = str(tmp_path / "a")
    _write(prefix, [[1, 2]])
    os.replace(prefix + ".bin", prefix + ".real")
    os.replace(prefix + ".idx", prefix + ".bin")
    with pytest.raises(ValueError, match="bad magic"):
        IndexedDataset(prefix)


def test_scan_token_ids_across_blocks(tmp_path):
    prefix = str(tmp_path / "a")
    _write(prefix, [[1, 2, 3], [4, 9], [7, 12, 5]])
    dataset = IndexedDataset(prefix)
    for block in (1, 2, 3, 100):
        assert scan_token_ids(dataset, limit=100, block_tokens=block) == (12, -1)
        assert scan_token_ids(dataset, limit=8, block_tokens=block) == (12, 4)  # the 9, in sample 1
