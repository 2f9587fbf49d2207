"""nmt-filter: dual conditional cross-entropy under a forward and a reverse model ranks misaligned
pairs last, keeps the best as a dataset, writes scores --curriculum file: reads; 2 ranks under
torchrun score as 1."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nmt.data.corpus import ParallelCorpus
from nmt.data.difficulty import read_scores
from nmt.data.manifest import load_manifest
from nmt.train.filtering import dual_conditional_cross_entropy, kept_indices
from nmt_cli.filter import main as filter_main
from nmt_cli.preprocess import main as preprocess_main

from ..helpers import (
    TINY_MODEL_PAIRS,
    one_thread,
    random_pairs,
    run_torchrun,
    tiny_checkpoint,
    train_tiny_model,
    write_corpus,
)

NUM_PAIRS, NUM_BAD = 160, 40


def test_dual_conditional_cross_entropy_and_what_is_kept():
    forward = np.array([1.0, 1.0, 3.0, 0.5, 2.0])
    reverse = np.array([1.0, 3.0, 1.0, 0.5, 2.0])
    scores = dual_conditional_cross_entropy(forward, reverse)
    # disagreement costs as much as likelihood: (1, 3) scores 2 + 2 = 4, worse than (2, 2)
    assert np.allclose(scores, [1.0, 4.0, 4.0, 0.5, 2.0])
    assert kept_indices(scores, keep_fraction=0.4, threshold=None).tolist() == [0, 3]
    assert kept_indices(scores, keep_fraction=0.5, threshold=None).tolist() == [0, 3, 4]
    assert kept_indices(scores, keep_fraction=None, threshold=2.0).tolist() == [0, 3, 4]
    ties = np.array([1.0, 1.0, 1.0, 1.0])
    assert kept_indices(ties, keep_fraction=0.5, threshold=None).tolist() == [0, 1]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads; on a loaded 2-core machine two threads oversubscribe."""
    with one_thread():
        yield


class _Swapped:
    def __init__(self, corpus):
        self.corpus = corpus

    def __len__(self):
        return len(self.corpus)

    def __getitem__(self, index):
        src, tgt = self.corpus[index]
        return tgt, src


@pytest.fixture(scope="module")
def setup(tiny, tmp_path_factory):
    """The tiny en->de model, a de->en one trained the same way, and a dataset whose last
    NUM_BAD pairs have each other's targets (misaligned)."""
    root = tmp_path_factory.mktemp("filter")
    spm_path = os.path.join(tiny.data_dir, "spm.model")
    spm_proto = open(spm_path, "rb").read()
    corpus = ParallelCorpus(tiny.data_dir, "train")
    vocab_size = corpus.manifest.spm.src_vocab_size
    with one_thread():  # a module fixture: set up before the autouse one above applies
        reverse_model = train_tiny_model(
            _Swapped(corpus), vocab_size=vocab_size, num_updates=150, seed=1
        )
    reverse = tiny_checkpoint(
        reverse_model, root / "reverse.pt", spm_proto=spm_proto, source_lang="de", target_lang="en"
    )
    src, tgt = random_pairs(NUM_PAIRS, seed=11, **TINY_MODEL_PAIRS)
    tgt[-NUM_BAD:] = tgt[-NUM_BAD + 1 :] + tgt[-NUM_BAD:][:1]  # rotated: each gets another's target
    write_corpus(root, "noisy", src, tgt)
    args = ["-s", "en", "-t", "de", "--trainpref", str(root / "noisy"), "--spm-model", spm_path]
    args += ["--max-len-ratio", "20"]
    assert preprocess_main([*args, "--destdir", str(root / "data"), "--workers", "1"]) == 0
    return root, tiny.checkpoint, reverse


def _filter_args(root, forward, reverse, *extra):
    return [
        str(root / "data"),
        "--forward",
        forward,
        "--reverse",
        reverse,
        "--device",
        "cpu",
        *extra,
    ]


def test_misaligned_pairs_score_worst_and_the_best_are_kept(setup, tmp_path, capsys):
    root, forward, reverse = setup
    out, scores_file = tmp_path / "kept", tmp_path / "scores.txt"
    args = _filter_args(root, forward, reverse, "--keep-fraction", "0.75", "--destdir", str(out))
    assert filter_main([*args, "--scores", str(scores_file)]) == 0
    printed = capsys.readouterr().out
    assert "median" in printed or "50%" in printed
    assert f"kept {NUM_PAIRS - NUM_BAD} of {NUM_PAIRS}" in printed
    corpus = ParallelCorpus(str(root / "data"), "train")
    scores = read_scores(str(scores_file), corpus)  # what --curriculum file: reads
    bad = np.arange(NUM_PAIRS - NUM_BAD, NUM_PAIRS)
    good = np.arange(NUM_PAIRS - NUM_BAD)
    assert np.median(scores[bad]) > np.percentile(scores[good], 90)
    manifest = load_manifest(str(out))
    entry = manifest.split("train")
    assert entry.num_samples == NUM_PAIRS - NUM_BAD
    assert entry.filtered["dual_conditional_cross_entropy"] == NUM_BAD
    kept = ParallelCorpus(str(out), "train")
    lines = np.asarray(kept.line_numbers)
    assert np.isin(lines, bad).sum() <= NUM_BAD // 4  # most misaligned pairs are gone
    for i, line in enumerate(lines):  # the pairs themselves, untouched
        assert np.array_equal(kept[i][0], corpus[int(line)][0])
        assert np.array_equal(kept[i][1], corpus[int(line)][1])


def test_models_of_the_wrong_direction_and_bad_options_are_one_line(setup, tmp_path, capsys):
    root, forward, reverse = setup
    for args, fragment in (
        (
            _filter_args(root, reverse, forward, "--scores", str(tmp_path / "s")),
            "translates de->en",
        ),
        (_filter_args(root, forward, reverse, "--keep-fraction", "0.5"), "--destdir: goes with"),
        (
            _filter_args(root, forward, reverse, "--keep-fraction", "1.5", "--destdir", "x"),
            "--keep-fraction: must be in",
        ),
        (_filter_args(root, forward, reverse), "--scores: nothing to do"),
    ):
        assert filter_main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err and err[-1].startswith("nmt-filter: error: ") and fragment in err[-1], err
        assert "Traceback" not in "\n".join(err)


@pytest.mark.slow  # two torchrun ranks start torch each: ~10-25 s
def test_two_ranks_under_torchrun_score_as_one(setup, tmp_path):
    root, forward, reverse = setup
    one = tmp_path / "one.txt"
    assert filter_main(_filter_args(root, forward, reverse, "--scores", str(one))) == 0
    two = tmp_path / "two.txt"
    result = run_torchrun(
        "nmt_cli.filter", *_filter_args(root, forward, reverse, "--scores", str(two)), timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert np.allclose(np.loadtxt(one), np.loadtxt(two), atol=1e-5)


def test_an_existing_destdir_is_replaced_only_with_overwrite_and_only_if_nmt_filter_made_it(
    setup, tmp_path, capsys
):
    root, forward, reverse = setup
    out = tmp_path / "kept"
    keep = ("--keep-fraction", "0.5", "--destdir", str(out))
    assert filter_main(_filter_args(root, forward, reverse, *keep)) == 0
    first = load_manifest(str(out)).split("train").num_samples
    capsys.readouterr()
    again = ("--keep-fraction", "0.75", "--destdir", str(out))
    assert filter_main(_filter_args(root, forward, reverse, *again)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nmt-filter: error: ") and "pass --overwrite" in err[-1], err
    assert load_manifest(str(out)).split("train").num_samples == first  # untouched
    # The flag the message names exists, and replaces the dataset nmt-filter made.
    assert filter_main(_filter_args(root, forward, reverse, *again, "--overwrite")) == 0
    assert load_manifest(str(out)).split("train").num_samples == round(0.75 * NUM_PAIRS)
    # A directory nmt-filter did not make is never replaced.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    other = ("--keep-fraction", "0.5", "--destdir", str(mine), "--overwrite")
    assert filter_main(_filter_args(root, forward, reverse, *other)) == 1
    assert "not a directory nmt-filter made" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"
