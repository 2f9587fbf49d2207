"""Translator and checkpoints: order, empty lines, averaging, safe loading; batching and line reading."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from nmt.checkpoint_io import atomic_torch_save, last_checkpoints, load_checkpoint
from nmt.data.batching import greedy_offsets
from nmt.eval import Translator, load_averaged_checkpoint
from nmt.eval.translate import UNLIMITED, iter_line_chunks


@pytest.fixture(scope="module")
def translator(tiny) -> Translator:
    return Translator.from_checkpoint(tiny.checkpoint)


def test_output_order_equals_input_order(tiny, translator) -> None:
    lines = tiny.test_src
    expected = [translator.translate([line], beam=3)[0] for line in lines]
    assert translator.translate(lines, beam=3, batch_size=4) == expected  # sorted by length inside
    shuffled = list(range(len(lines)))
    random.Random(0).shuffle(shuffled)
    assert translator.translate([lines[i] for i in shuffled], beam=3, batch_size=4) == [
        expected[i] for i in shuffled
    ]


def test_empty_lines_give_empty_outputs_in_place(tiny, translator) -> None:
    lines = tiny.test_src[:6]
    with_empty = ["", lines[0], "", "   ", lines[1], "\t", *lines[2:], ""]
    expected = translator.translate(lines)
    out = translator.translate(with_empty, batch_size=2)
    assert len(out) == len(with_empty)
    assert out[0] == out[2] == out[3] == out[5] == out[-1] == ""
    assert [out[1], out[4], *out[6:-1]] == expected
    assert translator.translate([]) == []


def test_nmt_translator_is_the_lazy_public_name(tiny) -> None:
    import nmt

    assert nmt.Translator is Translator
    assert nmt.Translator.from_checkpoint(tiny.checkpoint, device="cpu").translate(["dog"]) == [
        "hund"
    ]


def test_averaging_identical_checkpoints_gives_the_same_model(tiny, tmp_path) -> None:
    copy = str(tmp_path / "copy.pt")
    atomic_torch_save(load_checkpoint(tiny.checkpoint), copy)
    single = load_checkpoint(tiny.checkpoint)["model"]
    averaged = load_averaged_checkpoint([tiny.checkpoint, copy])["model"]
    assert averaged.keys() == single.keys()
    for name, tensor in single.items():
        assert averaged[name].dtype == tensor.dtype and torch.equal(averaged[name], tensor), name
    both = Translator.from_checkpoint([tiny.checkpoint, copy], average=True)
    assert both.translate(tiny.test_src[:5]) == Translator.from_checkpoint(
        tiny.checkpoint
    ).translate(tiny.test_src[:5])


def test_averaging_takes_the_mean_and_checks_compatibility(tiny, tmp_path) -> None:
    state = load_checkpoint(tiny.checkpoint)
    shifted = {
        **state,
        "model": {k: v + 1.0 if v.is_floating_point() else v for k, v in state["model"].items()},
    }
    atomic_torch_save(shifted, str(tmp_path / "shifted.pt"))
    averaged = load_averaged_checkpoint([tiny.checkpoint, str(tmp_path / "shifted.pt")])["model"]
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    torch.testing.assert_close(averaged[name], state["model"][name] + 0.5)
    other = {**state, "model_config": {**state["model_config"], "decoder_layers": 1}}
    atomic_torch_save(other, str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="model config differs"):
        load_averaged_checkpoint([tiny.checkpoint, str(tmp_path / "other.pt")])


def test_not_a_checkpoint_is_a_clear_error(tiny, tmp_path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="not an nmt checkpoint"):
        Translator.from_checkpoint(str(garbage))
    foreign = str(tmp_path / "foreign.pt")
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(ValueError, match="not an nmt checkpoint"):
        Translator.from_checkpoint(foreign)
    with pytest.raises(ValueError, match="no such checkpoint"):
        Translator.from_checkpoint(str(tmp_path / "missing.pt"))
    state = load_checkpoint(tiny.checkpoint)
    del state["vocab"]
    atomic_torch_save(state, str(tmp_path / "novocab.pt"))
    with pytest.raises(ValueError, match="no 'vocab'"):
        Translator.from_checkpoint(str(tmp_path / "novocab.pt"))


def test_last_checkpoints_are_the_newest_numbered(tmp_path) -> None:
    """Newest by the epoch and update in the names, whatever the file times say (copied or touched
    files get new ones); an epoch's own checkpoint follows its update checkpoints."""
    names = [
        "checkpoint_1_50.pt",
        "checkpoint1.pt",
        "checkpoint_2_120.pt",
        "checkpoint2.pt",
        "checkpoint_10_900.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
    ]
    now = time.time()
    for age, name in enumerate(names):  # file times in the opposite order
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (now - 100 + age, now - 100 + age))
    (tmp_path / "checkpoint_1_50.pt").touch()  # the oldest, touched now
    assert [os.path.basename(p) for p in last_checkpoints(str(tmp_path), 3)] == [
        "checkpoint_10_900.pt",
        "checkpoint2.pt",
        "checkpoint_2_120.pt",
    ]
    with pytest.raises(ValueError, match="needs 6 numbered checkpoints"):
        last_checkpoints(str(tmp_path), 6)


def test_decoding_batches_respect_limits_and_cover_everything() -> None:
    """Decoding cuts its longest-first order with the training batcher; an over-long sentence goes alone."""
    lengths = np.array(sorted(np.random.default_rng(0).integers(2, 50, size=200), reverse=True))
    for batch_size, max_tokens in ((7, None), (None, 100), (16, 60), (None, 10)):
        offsets = greedy_offsets(
            lengths, lengths, max_tokens or UNLIMITED, packed=False, max_sentences=batch_size
        )
        batches = [slice(a, b) for a, b in zip(offsets[:-1], offsets[1:])]
        assert np.concatenate([np.arange(len(lengths))[b] for b in batches]).tolist() == list(
            range(len(lengths))
        )
        for batch in batches:
            size = batch.stop - batch.start
            assert batch_size is None or size <= batch_size
            assert max_tokens is None or size == 1 or size * lengths[batch.start] <= max_tokens


def test_line_chunks_split_on_newline_only() -> None:
    data = "a\u2028b\r\nc\x0cd\n\nlast".encode() + b"\n"
    chunks = list(iter_line_chunks(io.BytesIO(data), size=2, name="x"))
    assert chunks == [["a\u2028b", "c\x0cd"], ["", "last"]]
    with pytest.raises(ValueError, match="x:2: invalid UTF-8"):
        list(iter_line_chunks(io.BytesIO(b"ok\n\xff\n"), size=10, name="x"))


def test_imports_point_one_way() -> None:
    """``import nmt`` loads no torch; ``nmt.eval`` never imports ``nmt.train``."""
    code = (
        "import sys, nmt; assert 'torch' not in sys.modules; "
        "import nmt.eval; assert not [m for m in sys.modules if m.startswith('nmt.train')], 'nmt.eval imports nmt.train'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
