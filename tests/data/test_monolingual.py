"""nmt-preprocess --only-source: a monolingual dataset, streamed and deduplicated like parallel data,
one token file named by both sides of the manifest; what it cannot be is one line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest, verify_checksums
from nmt.data.monolingual import is_monolingual
from nmt_cli.preprocess import main


@pytest.fixture()
def text(tmp_path):
    lines = ["der hund rennt", "", "die katze sitzt", "der hund rennt", "ein rotes haus " * 40]
    (tmp_path / "mono.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path / "mono"


def _args(text, tiny_data, destdir, *extra):
    spm = os.path.join(tiny_data, "spm.model")
    return [
        "--only-source",
        "-s",
        "de",
        "--trainpref",
        str(text),
        "--spm-model",
        spm,
        "--destdir",
        str(destdir),
        "--workers",
        "1",
        *extra,
    ]


def test_one_token_file_filtered_and_deduplicated(text, tiny_data, tmp_path):
    destdir = tmp_path / "m"
    assert main(_args(text, tiny_data, destdir, "--dedup", "--max-len", "64")) == 0
    manifest = load_manifest(str(destdir))
    assert is_monolingual(manifest) and manifest.source_lang == manifest.target_lang == "de"
    entry = manifest.split("train")
    assert entry.parts[0].src == entry.parts[0].tgt  # both sides name one file
    assert sorted(n for n in os.listdir(destdir) if n.endswith(".bin")) == ["train.de.bin"]
    assert entry.filtered["blank_line"] == 1 and entry.filtered["duplicate"] == 1
    assert entry.filtered["too_long"] == 1 and entry.num_samples == 2
    verify_checksums(manifest)
    corpus = ParallelCorpus(str(destdir), "train")
    assert list(corpus.line_numbers) == [0, 2]
    for i in range(len(corpus)):
        assert np.array_equal(corpus.src[i], corpus.tgt[i])


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["-t", "en"], "--target-lang: a monolingual dataset (--only-source) has no such thing"),
        (["--separate-vocab"], "--separate-vocab: a monolingual dataset"),
        (["--validpref", "x"], "--validpref: a monolingual dataset"),
    ],
)
def test_what_a_monolingual_dataset_lacks_is_one_line(
    text, tiny_data, tmp_path, capsys, extra, fragment
):
    assert main(_args(text, tiny_data, tmp_path / "m", *extra)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "m").exists()


def test_without_a_vocabulary_is_one_line(text, tmp_path, capsys):
    args = ["--only-source", "-s", "de", "--trainpref", str(text), "--destdir", str(tmp_path / "m")]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--spm-model: --only-source needs" in err[0], err
