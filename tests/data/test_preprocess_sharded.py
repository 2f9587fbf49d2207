"""Sharded preprocessing: parts written by 2 torchrun ranks (or by hand, one shard per run) read as
one corpus that is the single-process dataset sample for sample, so batches and losses are the same."""

import json
import os

import numpy as np
import pytest

from nmt.config import BatchingConfig, PreprocessConfig
from nmt.data.batching import global_batches
from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest, verify_checksums
from nmt.data.preprocess import preprocess

from ..helpers import (
    PREPROCESS_PAIRS,
    TINY_MODEL_FLAGS,
    random_pairs,
    run_forked,
    run_torchrun,
    write_corpus,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def options(root, destdir, **overrides):
    values = dict(
        source_lang="en",
        target_lang="de",
        trainpref=[str(root / "train"), str(root / "extra")],
        validpref=[str(root / "valid")],
        destdir=str(destdir),
        spm_vocab_size=60,
        workers=1,
    )
    values.update(overrides)
    return values


def argv(values):
    args = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, list):
            args += [flag, ",".join(value)]
        else:
            args += [flag, str(value)]
    return args


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The same corpora preprocessed in one process and under torchrun with 2 ranks."""
    root = tmp_path_factory.mktemp("sharded")
    src, tgt = random_pairs(1_001, seed=20, **PREPROCESS_PAIRS)
    src[10], tgt[500], src[700] = "", "  ", "dog " * 300  # filtered: blank, blank, too long
    src[800], tgt[800] = src[3], tgt[3]  # an exact duplicate
    write_corpus(root, "train", src, tgt)
    write_corpus(root, "extra", *random_pairs(97, seed=21, **PREPROCESS_PAIRS))
    write_corpus(root, "valid", *random_pairs(30, seed=22, **PREPROCESS_PAIRS))
    preprocess(PreprocessConfig(**options(root, root / "single")))
    result = run_torchrun("nmt_cli.preprocess", *argv(options(root, root / "sharded")))
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def test_parts_read_as_the_single_process_corpus(datasets):
    single, sharded = datasets / "single", datasets / "sharded"
    assert sorted(p for p in os.listdir(sharded) if not p.startswith(".")) == [
        "manifest.json",
        "part-00000-of-00002",
        "part-00001-of-00002",
    ]
    one, parts = load_manifest(str(single)), load_manifest(str(sharded))
    assert (sharded / parts.spm.src_model).read_bytes() == (
        single / one.spm.src_model
    ).read_bytes()  # one vocabulary
    verify_checksums(parts)
    for split in ("train", "train1", "valid"):
        a, b = ParallelCorpus(str(single), split), ParallelCorpus(str(sharded), split)
        assert len(parts.splits[split].parts) == (2 if split.startswith("train") else 1)
        assert len(a) == len(b) > 0
        assert np.array_equal(a.src_lengths, b.src_lengths) and np.array_equal(
            a.tgt_lengths, b.tgt_lengths
        )
        assert np.array_equal(a.line_numbers, b.line_numbers)
        for i in range(len(a)):
            assert np.array_equal(a[i][0], b[i][0]) and np.array_equal(a[i][1], b[i][1]), (split, i)
        assert one.splits[split].filtered == parts.splits[split].filtered
        assert one.splits[split].num_lines == parts.splits[split].num_lines
    assert (
        parts.splits["train"].filtered["blank_line"] == 2
        and parts.splits["train"].filtered["too_long"] == 1
    )
    for epoch in (1, 2):
        cfg = BatchingConfig(layout="padded", max_tokens=200)
        a, b = ParallelCorpus(str(single), "train"), ParallelCorpus(str(sharded), "train")
        x = global_batches(a.src_lengths, a.tgt_lengths, cfg, seed=3, epoch=epoch)
        y = global_batches(b.src_lengths, b.tgt_lengths, cfg, seed=3, epoch=epoch)
        assert (
            np.array_equal(x.indices, y.indices)
            and np.array_equal(x.starts, y.starts)
            and np.array_equal(x.ends, y.ends)
        )


def test_training_losses_are_the_same_on_parts(datasets, tmp_path):
    losses = []
    for name in ("single", "sharded"):
        args = [
            str(datasets / name),
            "--save-dir",
            str(tmp_path / name),
            "--max-update",
            "4",
            "--max-tokens",
            "256",
            "--log-format",
            "json",
            "--log-interval",
            "1",
            "--seed",
            "3",
            "--no-epoch-checkpoints",
            *TINY_MODEL_FLAGS,
        ]
        result = run_forked("nmt_cli.train", args, env=ENV)
        assert result.returncode == 0, result.stderr[-3000:]
        records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        losses.append(
            [(r["update"], r["loss"], r["ntokens"]) for r in records if r["kind"] == "train"]
        )
    assert len(losses[0]) == 4
    assert losses[0] == losses[1]


def test_shards_run_by_hand_complete_the_dataset_when_the_last_one_finishes(datasets, tmp_path):
    values = options(datasets, tmp_path / "by-hand", num_shards=2)
    _, stats = preprocess(PreprocessConfig(**values, shard_id=1))  # in any order
    assert not (tmp_path / "by-hand" / "manifest.json").exists()  # not a dataset yet
    assert [s.name for s in stats] == ["train", "train1"]  # valid and test go with part 0
    manifest, _ = preprocess(PreprocessConfig(**values, shard_id=0))
    assert manifest.directory == str(tmp_path / "by-hand")
    a, b = (
        ParallelCorpus(str(datasets / "single"), "train"),
        ParallelCorpus(str(tmp_path / "by-hand"), "train"),
    )
    assert np.array_equal(a.src_lengths, b.src_lengths) and all(
        np.array_equal(a[i][1], b[i][1]) for i in range(len(a))
    )
    with pytest.raises(ValueError, match="in use by another run|holds a complete dataset"):
        preprocess(
            PreprocessConfig(**values, shard_id=1)
        )  # the complete dataset is not overwritten by accident


def test_merged_parts_are_the_single_process_files(datasets, tmp_path):
    values = options(datasets, tmp_path / "merged", num_shards=3, merge_parts=True)
    for shard_id in (2, 0, 1):
        manifest, _ = preprocess(PreprocessConfig(**values, shard_id=shard_id))
    assert all(len(split.parts) == 1 for split in manifest.splits.values())
    assert load_manifest(str(tmp_path / "merged")).splits == manifest.splits
    verify_checksums(manifest)
    for name in ("train.en.bin", "train.de.idx", "train1.en.bin", "train.line_numbers.npy"):
        assert (tmp_path / "merged" / name).read_bytes() == (
            datasets / "single" / name
        ).read_bytes(), name
    assert not [
        p for p in os.listdir(tmp_path / "merged" / "part-00001-of-00003") if p.startswith("train")
    ]
