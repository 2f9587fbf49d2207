"""nmt-eval end to end on the tiny dataset: split mode, files, stdin, averaging, errors."""

from __future__ import annotations

import functools
import os
import shutil

import pytest

from nmt_cli.eval import main

from ..helpers import run_cli

run = functools.partial(run_cli, main)


def test_split_mode_writes_hypotheses_in_order_and_scores(tiny, tmp_path, capsys) -> None:
    output = str(tmp_path / "hyp.txt")
    code, out, err = run(
        [
            tiny.data_dir,
            "--path",
            tiny.checkpoint,
            "--split",
            "test",
            "--beam",
            "3",
            "--output",
            output,
            "--score-tokenized-lowercase",
        ],
        capsys=capsys,
    )
    assert code == 0, err
    with open(output, encoding="utf-8") as handle:
        hypotheses = handle.read().split("\n")[:-1]
    assert len(hypotheses) == len(tiny.test_src)
    from nmt.eval import Translator

    assert hypotheses == Translator.from_checkpoint(tiny.checkpoint).translate(
        tiny.test_src, beam=3
    )
    assert "BLEU = " in out and "chrF2 = " in out and "signature: nrefs:1|case:mixed" in out
    assert "lowercased" in out and "case:lc" in out
    assert "sentences/s" in err


def test_stdin_to_stdout_with_reference_and_empty_lines(
    tiny, tmp_path, capsys, monkeypatch
) -> None:
    reference = tmp_path / "ref.de"
    lines = [tiny.test_src[0], "", tiny.test_src[1]]
    reference.write_text(
        "\n".join([tiny.test_tgt[0], "", tiny.test_tgt[1]]) + "\n", encoding="utf-8"
    )
    code, out, err = run(
        ["--path", tiny.checkpoint, "--reference", str(reference), "--buffer-size", "2"],
        capsys=capsys,
        stdin=("\n".join(lines) + "\n").encode(),
        monkeypatch=monkeypatch,
    )
    assert code == 0, err
    assert out.split("\n")[:-1][1] == "" and len(out.split("\n")[:-1]) == 3
    assert "BLEU = " in err  # scores go to stderr when hypotheses are on stdout


def test_input_file_nbest_and_average_last(tiny, tmp_path, capsys) -> None:
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        shutil.copy(tiny.checkpoint, save_dir / name)
    source = tmp_path / "in.en"
    source.write_text("\n".join(tiny.test_src[:4]) + "\n", encoding="utf-8")
    output = str(tmp_path / "out.de")
    code, _, err = run(
        [
            "--path",
            str(save_dir),
            "--average-last",
            "2",
            "--input",
            str(source),
            "--output",
            output,
            "--beam",
            "3",
            "--nbest",
            "2",
        ],
        capsys=capsys,
    )
    assert code == 0, err
    with open(output, encoding="utf-8") as handle:
        assert len(handle.read().split("\n")[:-1]) == 8


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["--beam", "0"], "--beam: must be >= 1"),
        (["--split", "nope"], "no split 'nope'"),
        (["--input", "x.txt"], "not both"),
    ],
)
def test_errors_are_one_line(tiny, capsys, argv_tail, message) -> None:
    code, _, err = run([tiny.data_dir, "--path", tiny.checkpoint, *argv_tail], capsys=capsys)
    assert code == 1
    assert (
        err.strip().startswith("nmt-eval: error:")
        and message in err
        and len(err.strip().splitlines()) == 1
    )


def test_not_a_checkpoint_error(tiny, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 10)
    code, _, err = run([tiny.data_dir, "--path", str(bad)], capsys=capsys)
    assert code == 1 and "not an nmt checkpoint" in err


def test_data_encoded_with_another_spm_is_refused(tiny, tmp_path, capsys) -> None:
    other = tmp_path / "data"
    shutil.copytree(tiny.data_dir, other)
    with open(os.path.join(other, "spm.model"), "ab") as handle:
        handle.write(b"\x00")
    code, _, err = run([str(other), "--path", tiny.checkpoint], capsys=capsys)
    assert code == 1 and "not the checkpoint's source SentencePiece model" in err
