"""nmt-train on a multilingual dataset: validation per direction and their mean (what
checkpoint_best.pt follows), the tag placement recorded in the checkpoint."""

import math

import pytest
import torch

from ..helpers import MULTI_PAIRS, parse_log, train_multilingual


@pytest.mark.parametrize("placement", ["encoder", "decoder"])
def test_validation_per_direction_and_mean(multi_data, tmp_path, placement):
    result = train_multilingual(
        multi_data,
        tmp_path / "ck",
        "--lang-tok",
        placement,
        "--eval-bleu",
        "--best-checkpoint-metric",
        "bleu",
        "--maximize-best-checkpoint-metric",
        "--sampling-temperature",
        "2",
        updates=20,
    )
    valid = parse_log(result.stdout, "valid")[-1]
    pairs = MULTI_PAIRS.split(",")
    for metric in ("loss", "bleu"):
        per_direction = [valid[f"{pair}_{metric}"] for pair in pairs]
        assert valid[f"valid_{metric}"] == pytest.approx(sum(per_direction) / len(pairs))
    assert len({valid[f"{pair}_loss"] for pair in pairs}) > 1  # measured apart, not one number
    assert math.isfinite(valid["valid_loss"])
    blend = parse_log(result.stdout, "blend")[0]
    assert {f"train.{pair}_samples" for pair in pairs} <= set(blend)
    state = torch.load(tmp_path / "ck" / "checkpoint_best.pt", weights_only=True)
    assert state["vocab"]["lang_tok"] == placement
    assert state["vocab"]["lang_pairs"] == pairs


def test_no_validation_split_trains_every_direction(multi_data, tmp_path):
    result = train_multilingual(multi_data, tmp_path / "ck", "--valid-subset", "nosuch", updates=2)
    assert "training without validation" in result.stderr


def test_resume_keeps_the_upsampled_directions_or_refuses(multi_data, tmp_path):
    train_multilingual(multi_data, tmp_path / "plain", updates=2)
    # Recorded at its default, parsed: a checkpoint from before the option (without it) compares
    # equal to that default (nmt.provenance; tests/test_provenance.py).
    state = torch.load(tmp_path / "plain" / "checkpoint_last.pt", weights_only=True)
    assert state["run_identity"]["batch sequence"]["--upsample-directions"] == {}

    upsampled = ("--upsample-directions", "en-de:2")
    first = train_multilingual(multi_data, tmp_path / "ck", *upsampled, updates=2)
    blend = parse_log(first.stdout, "blend")[0]
    assert blend["train.en-de_samples"] == 2 * blend["train.de-en_samples"]
    other = train_multilingual(
        multi_data, tmp_path / "ck", "--upsample-directions", "en-de:3", updates=4, check=False
    )
    assert other.returncode == 1
    assert (
        "batch sequence: --upsample-directions: {'en-de': 2.0} in the checkpoint, {'en-de': 3.0} "
        "now (pass --reset-dataloader" in other.stderr
    )
    train_multilingual(multi_data, tmp_path / "ck", "--upsample-directions", "en-de:2.0", updates=4)
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", weights_only=True)
    assert state["num_updates"] == 4
