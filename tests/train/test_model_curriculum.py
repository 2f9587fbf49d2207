"""--curriculum model:CKPT: pairs scored by a model on each rank's shard, sorted globally, cached."""

import glob
import os
import shutil

import numpy as np
import pytest
import torch

from nmt.data import ParallelCorpus, load_manifest
from nmt.data.difficulty import SCORE_CHUNK
from nmt.train.difficulty import checkpoint_scorer

from ..helpers import parse_log, run_subprocess, train_command


def expected_difficulty(data_dir, checkpoint):
    """Rank of each pair's score (ties by index), computed here in one process, chunk by chunk."""
    corpus = ParallelCorpus(data_dir, "train")
    torch.set_num_threads(1)  # as the training processes run (OMP_NUM_THREADS=1)
    score = checkpoint_scorer(
        checkpoint, manifest=load_manifest(data_dir), device=torch.device("cpu")
    )
    scores = np.concatenate(
        [
            score([corpus[i] for i in range(start, min(start + SCORE_CHUNK, len(corpus)))])
            for start in range(0, len(corpus), SCORE_CHUNK)
        ]
    )
    order = np.lexsort((np.arange(len(corpus)), scores))
    difficulty = np.empty(len(corpus))
    difficulty[order] = np.arange(len(corpus))
    return difficulty


@pytest.mark.slow
def test_model_curriculum_is_the_same_on_one_and_two_ranks(tiny_data, tmp_path):
    scorer_run = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "scorer", "--max-update", "6")]
    )
    assert scorer_run.returncode == 0, scorer_run.stderr[-3000:]
    checkpoint = str(tmp_path / "scorer" / "checkpoint_last.pt")
    assert len(ParallelCorpus(tiny_data, "train")) > SCORE_CHUNK  # rank 1 really scores a shard
    copies = [str(tmp_path / name) for name in ("d1", "d2")]
    for copy in copies:
        shutil.copytree(tiny_data, copy)
    args = [
        "--curriculum",
        f"model:{checkpoint}",
        "--curriculum-epochs",
        "1",
        "--max-update",
        "6",
        "--dropout",
        "0.1",
    ]
    one = run_subprocess(
        [copies[0], *train_command(copies[0], tmp_path / "one", *args, "--update-freq", "2")]
    )
    two = run_subprocess(
        [copies[1], *train_command(copies[1], tmp_path / "two", *args, "--update-freq", "1")],
        torchrun_procs=2,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]

    (cache_one,) = glob.glob(os.path.join(copies[0], "difficulty", "model-*.npy"))
    (cache_two,) = glob.glob(os.path.join(copies[1], "difficulty", "model-*.npy"))
    np.testing.assert_array_equal(np.load(cache_one), np.load(cache_two))
    np.testing.assert_array_equal(np.load(cache_one), expected_difficulty(tiny_data, checkpoint))
    a, b = parse_log(one.stdout), parse_log(two.stdout)
    assert [r["ntokens"] for r in a] == [r["ntokens"] for r in b]
    np.testing.assert_allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=1e-5)

    again = run_subprocess(
        [copies[0], *train_command(copies[0], tmp_path / "again", *args, "--update-freq", "2")]
    )
    assert (
        again.returncode == 0 and "read from" in again.stderr
    )  # the cache is reused, not recomputed
    assert [r["loss"] for r in parse_log(again.stdout)] == [r["loss"] for r in a]


def test_model_curriculum_refuses_a_checkpoint_of_another_vocabulary(
    tiny_data, two_corpus_data, tmp_path
):
    other = run_subprocess(
        [two_corpus_data, *train_command(two_corpus_data, tmp_path / "other", "--max-update", "1")]
    )
    assert other.returncode == 0, other.stderr[-3000:]
    checkpoint = tmp_path / "other" / "checkpoint_last.pt"
    result = run_subprocess(
        [
            tiny_data,
            *train_command(tiny_data, tmp_path / "ck", "--curriculum", f"model:{checkpoint}"),
        ]
    )
    assert result.returncode == 1 and "vocabulary" in result.stderr.strip().splitlines()[-1]
