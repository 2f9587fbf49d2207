"""Where a run starts (nmt.train.start), decided once: nothing, the run's own checkpoint_last.pt
before --restore-file, and a weights-only --restore-file whose model only the dropouts and the
attention kernel may change."""

from __future__ import annotations

import dataclasses

import pytest

from nmt.checkpoint_io import FORMAT, LAST, VERSION, atomic_torch_save
from nmt.config import CheckpointConfig, ModelConfig, to_dict
from nmt.train.start import RunStart, run_start

SAVED = ModelConfig(encoder_layers=1, decoder_layers=1)
REQUESTED = ModelConfig(encoder_layers=3, decoder_layers=3)


def _checkpoint(path, *, run: bool) -> str:
    state = {"format": FORMAT, "version": VERSION, "model": {}, "vocab": {}}
    state["model_config"] = to_dict(SAVED)
    if run:
        state["optimizer"] = {}
    atomic_torch_save(state, str(path))
    return str(path)


def test_a_new_run_starts_from_nothing_with_the_model_asked_for(tmp_path):
    start = run_start(CheckpointConfig(save_dir=str(tmp_path)))
    assert start == RunStart() and not start.resumes
    assert start.model_config(REQUESTED, {"encoder_layers": 3}) == REQUESTED


def test_the_runs_own_last_checkpoint_comes_before_restore_file(tmp_path):
    restore = _checkpoint(tmp_path / "weights.pt", run=False)
    cfg = CheckpointConfig(save_dir=str(tmp_path / "run"), restore_file=restore)
    assert run_start(cfg).path == restore and not run_start(cfg).resumes
    (tmp_path / "run").mkdir()
    last = _checkpoint(tmp_path / "run" / LAST, run=True)
    start = run_start(cfg)
    assert start.path == last and start.resumes
    # a resumed run's model is the one asked for: the identity check compares it with the saved one
    assert start.model_config(REQUESTED, {"encoder_layers": 3}) == REQUESTED


def test_a_weights_only_checkpoint_brings_its_model(tmp_path):
    restore = _checkpoint(tmp_path / "weights.pt", run=False)
    start = run_start(CheckpointConfig(save_dir=str(tmp_path / "run"), restore_file=restore))
    assert start.model_config(REQUESTED, {}) == SAVED
    changed = start.model_config(REQUESTED, {"dropout": 0.3, "attention": "sdpa"})
    assert changed == dataclasses.replace(SAVED, dropout=0.3, attention="sdpa")
    with pytest.raises(ValueError) as error:
        start.model_config(REQUESTED, {"encoder_layers": 3, "dropout": 0.3})
    assert str(error.value) == (
        f"--encoder-layers: the model is {restore}'s (weights only, so its shape is fixed); "
        "only the dropouts and --attention may be given"
    )
