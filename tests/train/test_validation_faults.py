"""Validation and divergence through the real CLI: an empty validation split is refused, a missing
one is said, and a diverging run stops on its non-finite path with one line (issue 28: 6, 7)."""

import math
import os

import pytest

from nmt.train.validate import perplexity

from ..helpers import (
    REVERSAL_PAIRS,
    run_subprocess,
    tiny_corpus,
    tiny_dataset,
    train_command,
    write_corpus,
)


@pytest.fixture(scope="module")
def empty_valid_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("emptyvalid")
    tiny_corpus(root, {"train": (200, 5)}, **REVERSAL_PAIRS)
    write_corpus(root, "valid", [], [])
    return tiny_dataset(root)


@pytest.fixture(scope="module")
def no_valid_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("novalid")
    tiny_corpus(root, {"train": (200, 6)}, **REVERSAL_PAIRS)
    return tiny_dataset(root, valid=())


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("nmt-train: error:")]


def test_an_empty_validation_split_is_refused(empty_valid_data, tmp_path):
    for extra in ([], ["--eval-bleu"]):
        result = run_subprocess(
            [
                empty_valid_data,
                *train_command(empty_valid_data, tmp_path / "ck", "--max-update", "2", *extra),
            ]
        )
        assert result.returncode == 1, result.stderr[-2000:]
        (line,) = error_lines(result.stderr)
        assert "the validation split 'valid' has no pairs" in line
        assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_best.pt")


def test_without_a_validation_split_training_says_so_and_what_needs_one_is_refused(
    no_valid_data, tmp_path
):
    result = run_subprocess(
        [no_valid_data, *train_command(no_valid_data, tmp_path / "ck", "--max-update", "3")]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "has no validation split 'valid'" in result.stderr
    assert "training without validation" in result.stderr
    assert os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_best.pt")
    for flag in (["--patience", "3"], ["--eval-bleu"], ["--validate-interval-updates", "2"]):
        result = run_subprocess(
            [
                no_valid_data,
                *train_command(no_valid_data, tmp_path / "ck2", "--max-update", "3", *flag),
            ]
        )
        assert result.returncode == 1, result.stderr[-2000:]
        (line,) = error_lines(result.stderr)
        assert (
            line.startswith(f"nmt-train: error: {flag[0]}: ") and "no validation split" in line
        ), line


def test_a_diverging_run_stops_on_its_non_finite_path_with_one_line(no_valid_data, tmp_path):
    """An absurd --lr blows the weights up: the skipped non-finite updates end the run with one
    line (a diverging run used to die of an OverflowError computing the perplexity)."""
    result = run_subprocess(
        [
            no_valid_data,
            *train_command(
                no_valid_data,
                tmp_path / "ck",
                "--lr",
                "1e30",
                "--warmup-updates",
                "1",
                "--max-update",
                "200",
                "--log-interval",
                "5",
            ),
        ]
    )
    assert result.returncode == 1, result.stderr[-2000:]
    (line,) = error_lines(result.stderr)
    assert "consecutive updates with a non-finite loss or gradient" in line
    assert "Traceback" not in result.stderr and "OverflowError" not in result.stderr


def test_a_loss_too_large_for_a_perplexity_is_logged_as_inf():
    """nll in bits past 1023: 2 ** nll does not fit a float (OverflowError before)."""
    assert perplexity(1100.0) == math.inf and perplexity(3.0) == 8.0
    assert math.isnan(perplexity(math.nan))
