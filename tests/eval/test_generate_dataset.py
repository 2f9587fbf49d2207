"""nmt-eval --output-dataset: back-translation of a monolingual dataset into a parallel one.

Resumable (a kill -9 at any point, then the same command: the bytes an uninterrupted run writes),
the same dataset from 2 ranks under torchrun as from 1, one-line refusals, the <bt> tag on
synthetic sources only, and an exported CTranslate2 model as --path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest
from nmt.data.spm import BT_TAG, SentencePieceModel
from nmt_cli.eval import main as eval_main
from nmt_cli.preprocess import main as preprocess_main

from ..helpers import TINY_MODEL_PAIRS, random_pairs, run_torchrun, tiny_checkpoint

NUM_MONO = 120


def _one_error_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-eval: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.fixture(scope="module")
def mono(tiny, tmp_path_factory):
    """A monolingual English dataset in the tiny model's vocabulary (its source language: the
    tiny en->de model back-translates it into synthetic German sources for a de->en dataset)."""
    root = tmp_path_factory.mktemp("mono")
    src, _ = random_pairs(NUM_MONO, seed=7, **TINY_MODEL_PAIRS)
    (root / "mono.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    spm = os.path.join(tiny.data_dir, "spm.model")
    args = ["--only-source", "-s", "en", "--trainpref", str(root / "mono"), "--spm-model", spm]
    assert preprocess_main([*args, "--destdir", str(root / "data"), "--workers", "1"]) == 0
    return str(root / "data")


def _files(directory: str) -> dict[str, bytes]:
    return {
        name: open(os.path.join(directory, name), "rb").read()
        for name in sorted(os.listdir(directory))
    }


def _bt_args(tiny, mono, out, *extra):
    return [
        mono,
        "--path",
        tiny.checkpoint,
        "--split",
        "train",
        "--output-dataset",
        str(out),
        "--cpu",
        "--chunk-sentences",
        "16",
        "--batch-size",
        "8",
        *extra,
    ]


SAMPLED = ("--sampling", "--topk", "5", "--beam", "1", "--seed", "3")


@pytest.fixture(scope="module")
def reference_run(tiny, mono, tmp_path_factory):
    """An uninterrupted sampled, tagged run: the bytes every other run must reproduce."""
    out = tmp_path_factory.mktemp("bt-ref") / "bt"
    assert eval_main(_bt_args(tiny, mono, out, *SAMPLED, "--tag-source")) == 0
    return str(out)


def test_back_translation_is_a_parallel_dataset_with_tagged_synthetic_sources(
    tiny, mono, reference_run
):
    manifest = load_manifest(reference_run)
    assert (manifest.source_lang, manifest.target_lang) == ("de", "en")
    assert manifest.config["source_tag"] == BT_TAG
    corpus = ParallelCorpus(reference_run, "train")
    mono_corpus = ParallelCorpus(mono, "train")
    entry = manifest.split("train")
    assert entry.num_samples + sum(entry.filtered.values()) == len(mono_corpus)
    spm = SentencePieceModel.load(os.path.join(reference_run, "spm.model"))
    tag = spm.tags[BT_TAG]
    kept = np.asarray(corpus.line_numbers)
    for i in range(len(corpus)):
        src, tgt = corpus[i]
        assert src[0] == tag and tag not in src[1:]  # the tag starts every synthetic source
        # the real target is the monolingual sentence of that line, untouched
        assert np.array_equal(
            tgt,
            mono_corpus.tgt[
                int(np.flatnonzero(np.asarray(mono_corpus.line_numbers) == kept[i])[0])
            ],
        )
    # translated German: the tiny model maps English words to German ones
    text = spm.decode([corpus[0][0]])[0]
    assert text and not any(w in text.split() for w in ("the", "dog", "cat"))


def test_kill_9_then_rerun_gives_the_same_bytes(tiny, mono, reference_run, tmp_path):
    out = tmp_path / "bt"
    chunks = tmp_path / ".bt.chunks"
    command = [
        sys.executable,
        "-m",
        "nmt_cli.eval",
        *_bt_args(tiny, mono, out, *SAMPLED, "--tag-source"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if chunks.is_dir() and len([n for n in os.listdir(chunks) if n.startswith("chunk-")]) >= 3:
            break
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = [n for n in os.listdir(chunks) if n.startswith("chunk-") and n.endswith(".npy")]
    assert 3 <= len(done) < -(-NUM_MONO // 16)  # killed in the middle
    assert eval_main(_bt_args(tiny, mono, out, *SAMPLED, "--tag-source")) == 0
    assert _files(str(out)) == _files(reference_run)
    assert not chunks.exists()  # the chunks go once the dataset is installed


@pytest.mark.slow  # two torchrun ranks start torch each: ~10-25 s
def test_two_ranks_under_torchrun_equal_one(tiny, mono, reference_run, tmp_path):
    out = tmp_path / "bt"
    result = run_torchrun(
        "nmt_cli.eval", *_bt_args(tiny, mono, out, *SAMPLED, "--tag-source"), timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _files(str(out)) == _files(reference_run)


def test_rerun_of_a_finished_dataset_changes_nothing(tiny, mono, reference_run, caplog):
    before = _files(reference_run)
    with caplog.at_level("INFO", logger="nmt.eval"):
        assert eval_main(_bt_args(tiny, mono, reference_run, *SAMPLED, "--tag-source")) == 0
    assert "already complete" in caplog.text
    assert _files(reference_run) == before


def test_the_same_dataset_through_a_link_or_moved_is_the_same_input(
    tiny, mono, reference_run, tmp_path, caplog, capsys
):
    linked, moved = tmp_path / "linked", tmp_path / "moved"
    linked.symlink_to(mono)
    shutil.copytree(mono, moved)
    before = _files(reference_run)
    for other_path in (linked, moved):
        caplog.clear()
        with caplog.at_level("INFO", logger="nmt.eval"):
            args = _bt_args(tiny, str(other_path), reference_run, *SAMPLED, "--tag-source")
            assert eval_main(args) == 0
        assert "already complete" in caplog.text
    assert _files(reference_run) == before
    # a run begun through the original path goes on through the moved one
    out, chunks = tmp_path / "bt", tmp_path / ".bt.chunks"
    chunks.mkdir()
    begun = load_manifest(reference_run).config["back_translation"]
    (chunks / "options.json").write_text(json.dumps(begun))
    assert eval_main(_bt_args(tiny, str(moved), out, *SAMPLED, "--tag-source")) == 0
    written = _files(str(out))
    assert written.pop("manifest.json") and written == {
        k: v for k, v in before.items() if k != "manifest.json"
    }
    # other text is another input, wherever it lies
    (tmp_path / "other.en").write_text("a dog runs .\n", encoding="utf-8")
    spm = os.path.join(tiny.data_dir, "spm.model")
    other = [
        "--only-source",
        "-s",
        "en",
        "--trainpref",
        str(tmp_path / "other"),
        "--spm-model",
        spm,
    ]
    assert preprocess_main([*other, "--destdir", str(tmp_path / "o"), "--workers", "1"]) == 0
    capsys.readouterr()
    args = _bt_args(tiny, str(tmp_path / "o"), reference_run, *SAMPLED, "--tag-source")
    assert eval_main(args) == 1
    _one_error_line(capsys.readouterr().err, "other options", "input tokens: [")


def test_refusals_are_one_line(tiny, mono, reference_run, tmp_path, capsys):
    # other options into a finished dataset
    assert eval_main(_bt_args(tiny, mono, reference_run, "--beam", "2")) == 1
    _one_error_line(capsys.readouterr().err, "other options", "--beam: 1 in the dataset, 2 now")
    # other options into a begun one
    out = tmp_path / "bt"
    chunks = tmp_path / ".bt.chunks"
    chunks.mkdir()
    (chunks / "options.json").write_text('{"model": "sha256:0"}')
    assert eval_main(_bt_args(tiny, mono, out)) == 1
    _one_error_line(capsys.readouterr().err, "was begun here", "model")
    # a parallel dataset
    assert eval_main(_bt_args(tiny, tiny.data_dir, tmp_path / "p")) == 1
    _one_error_line(capsys.readouterr().err, "a parallel dataset", "--only-source")
    # the wrong direction: the synthetic dataset (de) given to the en->de model
    assert eval_main(_bt_args(tiny, reference_run, tmp_path / "d")) == 1
    _one_error_line(capsys.readouterr().err, "a parallel dataset")


def test_other_vocabulary_and_direction_are_one_line(tiny, tmp_path, capsys):
    _, tgt = random_pairs(40, seed=8, **TINY_MODEL_PAIRS)
    (tmp_path / "mono.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    spm = os.path.join(tiny.data_dir, "spm.model")
    common = ["--only-source", "--trainpref", str(tmp_path / "mono"), "--workers", "1"]
    assert (
        preprocess_main(
            [*common, "-s", "de", "--spm-model", spm, "--destdir", str(tmp_path / "de")]
        )
        == 0
    )
    capsys.readouterr()
    assert eval_main(_bt_args(tiny, str(tmp_path / "de"), tmp_path / "x")) == 1
    _one_error_line(capsys.readouterr().err, "translates en->de", "holds de text")
    # English text in another vocabulary
    (tmp_path / "other.en").write_text(
        "zebra quokka " * 3 + "\n" + "yak ibex\n" * 30, encoding="utf-8"
    )
    (tmp_path / "other.de").write_text("zebra quokka\n" * 31, encoding="utf-8")
    assert (
        preprocess_main(
            [
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                str(tmp_path / "other"),
                "--destdir",
                str(tmp_path / "od"),
                "--spm-vocab-size",
                "40",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    other_spm = os.path.join(tmp_path / "od", "spm.model")
    common = ["--only-source", "--trainpref", str(tmp_path / "other"), "--workers", "1"]
    assert (
        preprocess_main(
            [*common, "-s", "en", "--spm-model", other_spm, "--destdir", str(tmp_path / "en")]
        )
        == 0
    )
    capsys.readouterr()
    assert eval_main(_bt_args(tiny, str(tmp_path / "en"), tmp_path / "y")) == 1
    _one_error_line(capsys.readouterr().err, "not the vocabulary of --path")


@pytest.fixture(scope="module")
def tag_loving(tiny, tmp_path_factory):
    """The tiny model with an output bias that prefers the <bt> tag above every piece: the search
    must still never produce it (the vocabulary's tags are banned), on PyTorch and CTranslate2."""
    import dataclasses

    import torch

    from nmt.deploy.ct2 import export_ctranslate2
    from nmt.model import build_model

    root = tmp_path_factory.mktemp("tag-loving")
    spm_proto = open(os.path.join(tiny.data_dir, "spm.model"), "rb").read()
    tag = SentencePieceModel(spm_proto).tags[BT_TAG]
    model = build_model(dataclasses.replace(tiny.model.cfg, output_bias=True)).eval()
    missing = model.load_state_dict(tiny.model.state_dict(), strict=False).missing_keys
    assert missing == ["output_projection.bias"]
    with torch.no_grad():
        model.output_projection.bias.zero_()
        model.output_projection.bias[tag] = 50.0
    checkpoint = tiny_checkpoint(model, root / "checkpoint.pt", spm_proto=spm_proto)
    export_ctranslate2([checkpoint], str(root / "ct2"))
    return checkpoint, str(root / "ct2"), tag


def test_the_tag_is_never_generated_and_an_export_back_translates(tiny, mono, tag_loving, tmp_path):
    checkpoint, exported, tag = tag_loving
    from nmt.deploy.ct2 import export_ctranslate2
    from nmt.eval import Translator

    plain_export = str(tmp_path / "plain-ct2")
    export_ctranslate2([tiny.checkpoint], plain_export)
    runs = {}
    for name, path in (
        ("tag", checkpoint),
        ("tag-ct2", exported),
        ("torch", tiny.checkpoint),
        ("ct2", plain_export),
    ):
        out = str(tmp_path / name)
        args = [
            mono,
            "--path",
            path,
            "--output-dataset",
            out,
            "--split",
            "train",
            "--cpu",
            "--chunk-sentences",
            "50",
            "--beam",
            "2",
            "--tag-source",
            "--max-len-ratio",
            "0",
        ]
        assert eval_main(args) == 0
        runs[name] = corpus = ParallelCorpus(out, "train")
        assert len(corpus) == NUM_MONO
        for i in range(len(corpus)):
            assert corpus.src[i][0] == tag and tag not in corpus.src[i][1:]
        nbest = Translator.from_checkpoint(path).generate(
            [np.asarray(corpus.tgt[i], dtype=np.int64) for i in range(10)], beam=3, nbest=3
        )
        assert all(tag not in hypothesis.tokens for row in nbest for hypothesis in row)
    a, b = runs["torch"], runs["ct2"]
    same = sum(np.array_equal(a.src[i], b.src[i]) for i in range(len(a)))
    assert same >= 0.95 * len(a)  # the same search, up to float rounding


def test_source_noise_drops_blanks_and_shuffles_whole_words_only():
    from nmt.data.spm import EOS_ID, UNK_ID
    from nmt.eval.generate_dataset import add_noise

    starts = np.zeros(40, dtype=bool)
    starts[[10, 20, 30]] = True  # pieces 10, 20, 30 begin words; 11, 21, 31 continue them
    tokens = np.array([10, 11, 20, 21, 30, 31, EOS_ID], dtype=np.int64)
    assert np.array_equal(
        add_noise(
            tokens, starts=starts, rng=np.random.default_rng(0), drop=0, blank=0, shuffle_distance=0
        ),
        tokens,
    )
    seen = set()
    for seed in range(200):
        noised = add_noise(tokens, starts=starts, rng=np.random.default_rng(seed))
        assert noised[-1] == EOS_ID
        words = [
            tuple(w)
            for w in np.split(
                noised[:-1], np.flatnonzero(np.isin(noised[:-1], [10, 20, 30, UNK_ID]))
            )
        ]
        assert all(w in {(), (10, 11), (20, 21), (30, 31), (UNK_ID,)} for w in words)
        seen.add(tuple(noised))
        again = add_noise(tokens, starts=starts, rng=np.random.default_rng(seed))
        assert np.array_equal(noised, again)  # a function of the seed
    assert len(seen) > 5  # drops, blanks and swaps all happen


def test_forward_translation_keeps_the_real_text_as_source(tiny, mono, tmp_path, capsys):
    """--synthetic-side target: the monolingual text stays the source, its translation becomes the
    target, untagged (self-training data for the model's own direction)."""
    forward, back = tmp_path / "ft", tmp_path / "bt"
    assert (
        eval_main(_bt_args(tiny, mono, forward, "--beam", "2", "--synthetic-side", "target")) == 0
    )
    assert eval_main(_bt_args(tiny, mono, back, "--beam", "2")) == 0
    manifest = load_manifest(str(forward))
    assert (manifest.source_lang, manifest.target_lang) == ("en", "de")
    assert manifest.config["synthetic_side"] == "target"
    assert manifest.config["source_tag"] is None
    assert "forward_translation" in manifest.config and "back_translation" not in manifest.config
    # the same translations as back-translation with the same search, the sides turned round
    ft_corpus, bt_corpus = ParallelCorpus(str(forward), "train"), ParallelCorpus(str(back), "train")
    assert len(ft_corpus) == len(bt_corpus) > 0
    assert np.array_equal(ft_corpus.line_numbers, bt_corpus.line_numbers)
    for i in range(len(ft_corpus)):
        assert np.array_equal(ft_corpus.src[i], bt_corpus.tgt[i])
        assert np.array_equal(ft_corpus.tgt[i], bt_corpus.src[i])
    capsys.readouterr()
    # back-translation into the forward dataset: other options, one line
    assert eval_main(_bt_args(tiny, mono, forward, "--beam", "2")) == 1
    _one_error_line(
        capsys.readouterr().err,
        "other options",
        "--synthetic-side: 'target' in the dataset, 'source' now",
    )
    # a tag or noise would mark the real source as synthetic
    for flag in ("--tag-source", "--source-noise"):
        assert (
            eval_main(_bt_args(tiny, mono, tmp_path / "x", "--synthetic-side", "target", flag)) != 0
        )
        _one_error_line(capsys.readouterr().err, flag, "the source is the real text")
    assert not (tmp_path / "x").exists()
    # without --output-dataset there is no side to choose
    assert eval_main([mono, "--path", tiny.checkpoint, "--synthetic-side", "target", "--cpu"]) != 0
    _one_error_line(
        capsys.readouterr().err, "--synthetic-side", "only applies with --output-dataset"
    )


def test_overwrite_replaces_a_dataset_of_other_options_and_the_refusal_names_it(
    tiny, mono, tmp_path, capsys
):
    out = tmp_path / "bt"
    assert eval_main(_bt_args(tiny, mono, out, "--beam", "1")) == 0
    first = _files(str(out))
    capsys.readouterr()
    assert eval_main(_bt_args(tiny, mono, out, "--beam", "2")) == 1
    _one_error_line(capsys.readouterr().err, "other options", "pass --overwrite")
    assert _files(str(out)) == first
    # A run of other options killed midway left its chunks: --overwrite starts over too.
    chunks = tmp_path / ".bt.chunks"
    chunks.mkdir()
    (chunks / "options.json").write_text('{"model": "sha256:0"}')
    assert eval_main(_bt_args(tiny, mono, out, "--beam", "2", "--overwrite")) == 0
    manifest = load_manifest(str(out))
    assert manifest.config["back_translation"]["--beam"] == 2
    capsys.readouterr()
    # --overwrite without --output-dataset is refused
    assert eval_main([mono, "--path", tiny.checkpoint, "--overwrite", "--cpu"]) == 1
    _one_error_line(capsys.readouterr().err, "--overwrite: only applies with --output-dataset")
