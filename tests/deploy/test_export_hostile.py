"""nmt-export and an export as a clumsy or hostile user meets them (issue 28, cases 2 and 3):
--force over the save dir that holds the checkpoint, over a directory nmt-export did not make,
an output inside an export; a --min-len no output can meet, on both backends."""

from __future__ import annotations

import os
import shutil

import pytest

from nmt.eval import Translator
from nmt_cli.eval import main as eval_main
from nmt_cli.export import main as export_main


def _one_error_line(err: str, prog: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def test_force_never_replaces_the_inputs_nor_a_directory_it_did_not_make(
    tiny, tmp_path, capsys
) -> None:
    save_dir = tmp_path / "save"
    save_dir.mkdir()
    checkpoint = save_dir / "checkpoint_best.pt"
    shutil.copyfile(tiny.checkpoint, checkpoint)
    (save_dir / "checkpoint_last.pt").write_bytes(b"another run's checkpoint")
    (tmp_path / "save-link").symlink_to(save_dir)
    for output_dir, relation in (
        (save_dir, "holds"),  # the save dir of the checkpoint
        (tmp_path, "holds"),  # a directory above it
        (tmp_path / "save-link", "holds"),  # the save dir under another name
        (checkpoint, "is"),  # the checkpoint itself
    ):
        assert export_main([str(checkpoint), "--output-dir", str(output_dir), "--force"]) == 1
        _one_error_line(capsys.readouterr().err, "nmt-export", f"{relation} CKPT {checkpoint}")
    assert sorted(os.listdir(save_dir)) == ["checkpoint_best.pt", "checkpoint_last.pt"]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("someone's")
    assert export_main([str(checkpoint), "--output-dir", str(theirs), "--force"]) == 1
    _one_error_line(capsys.readouterr().err, "nmt-export", "not a directory nmt-export made")
    assert sorted(os.listdir(theirs)) == ["notes.txt"]

    ours = tmp_path / "ours"
    assert export_main([str(checkpoint), "--output-dir", str(ours)]) == 0
    (ours / "extra.txt").write_text("left by the user in our export")
    assert export_main([str(checkpoint), "--output-dir", str(ours), "--force"]) == 0
    assert not (ours / "extra.txt").exists()  # an export of ours is replaced whole, as before
    capsys.readouterr()


def test_nmt_eval_output_inside_an_export_is_refused(tiny, exported, tmp_path, capsys) -> None:
    source = tmp_path / "in.en"
    source.write_text(tiny.test_src[0] + "\n", encoding="utf-8")
    before = sorted(os.listdir(exported))
    output = os.path.join(exported, "model.bin")
    assert eval_main(["--path", exported, "--input", str(source), "--output", output]) == 1
    _one_error_line(capsys.readouterr().err, "nmt-eval", f"lies inside --path {exported}")
    assert sorted(os.listdir(exported)) == before


def test_min_len_errors_are_value_errors_on_both_backends(tiny, exported) -> None:
    for path in (tiny.checkpoint, exported):
        translator = Translator.from_checkpoint(path)
        with pytest.raises(ValueError, match="sentence 2: --min-len 14 is more than the 12 tokens"):
            translator.translate(["the big red dog sits on the mat", "dog"], min_len=14)
        with pytest.raises(ValueError, match="--min-len 100: no translation may be that long"):
            translator.translate(["dog"], min_len=100)
