import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

from nmt.config import PreprocessConfig
from nmt.data import preprocess as preprocess_module
from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest
from nmt.data.preprocess import FILTER_REASONS, filter_codes, preprocess
from nmt.data.spm import EOS_ID, SentencePieceModel
from nmt_cli.preprocess import main as cli_main

from ..helpers import PREPROCESS_PAIRS, random_pairs, write_corpus


@pytest.fixture()
def corpus_dir(tmp_path):
    src, tgt = random_pairs(300, seed=0, **PREPROCESS_PAIRS)
    write_corpus(tmp_path, "train", src, tgt)
    write_corpus(tmp_path, "valid", *random_pairs(20, seed=1, **PREPROCESS_PAIRS))
    return tmp_path


def config(tmp_path, **overrides):
    values = dict(
        source_lang="en",
        target_lang="de",
        trainpref=[str(tmp_path / "train")],
        validpref=[str(tmp_path / "valid")],
        destdir=str(tmp_path / "out"),
        spm_vocab_size=60,
        workers=1,
    )
    values.update(overrides)
    return PreprocessConfig(**values)


def run_cli(tmp_path, *extra, capsys=None):
    argv = [
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        str(tmp_path / "train"),
        "--validpref",
        str(tmp_path / "valid"),
        "--destdir",
        str(tmp_path / "out"),
        "--spm-vocab-size",
        "60",
        "--workers",
        "1",
        *extra,
    ]
    return cli_main(argv)


def test_read_back_equals_reencoding_and_counts_add_up(corpus_dir):
    manifest, _ = preprocess(config(corpus_dir))
    out = corpus_dir / "out"
    model = SentencePieceModel.load(str(out / manifest.spm.src_model))
    train = ParallelCorpus(str(out), "train")
    src_lines = (corpus_dir / "train.en").read_text().split("\n")[:-1]
    tgt_lines = (corpus_dir / "train.de").read_text().split("\n")[:-1]
    kept_lines = train.line_numbers.tolist()
    # each sample is its line's pieces followed by EOS
    expected_src = [ids + [EOS_ID] for ids in model.encode([src_lines[i] for i in kept_lines])]
    expected_tgt = [ids + [EOS_ID] for ids in model.encode([tgt_lines[i] for i in kept_lines])]
    assert [train[i][0].tolist() for i in range(len(train))] == expected_src
    assert [train[i][1].tolist() for i in range(len(train))] == expected_tgt
    assert train.src_lengths.tolist() == [len(ids) for ids in expected_src]

    entry = manifest.splits["train"]
    assert entry.num_samples + sum(entry.filtered.values()) == entry.num_lines == 300
    assert manifest.splits["valid"].num_samples == 20
    for name, checksum in manifest.checksums.items():
        assert checksum == "sha256:" + hashlib.sha256((out / name).read_bytes()).hexdigest()
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}


def test_output_identical_for_any_worker_count(corpus_dir):
    preprocess(config(corpus_dir, destdir=str(corpus_dir / "w1"), workers=1))
    preprocess(config(corpus_dir, destdir=str(corpus_dir / "w2"), workers=2))
    names = sorted(os.listdir(corpus_dir / "w1"))
    assert names == sorted(os.listdir(corpus_dir / "w2"))
    for name in names:
        a, b = (corpus_dir / "w1" / name).read_bytes(), (corpus_dir / "w2" / name).read_bytes()
        if name == "manifest.json":
            a, b = (json.loads(x) for x in (a, b))
            for m in (a, b):
                m.pop("config")
        assert a == b, name


def test_separate_vocab_and_given_model(corpus_dir):
    manifest, _ = preprocess(config(corpus_dir, separate_vocab=True))
    assert manifest.spm.src_model == "spm.en.model" and manifest.spm.tgt_model == "spm.de.model"
    given = str(corpus_dir / "out" / "spm.en.model")
    again, _ = preprocess(config(corpus_dir, destdir=str(corpus_dir / "again"), spm_model=given))
    assert again.spm.joint and again.spm.given_model == given


def test_filter_codes_first_reason_wins():
    src = np.array([5, 1, 3, 300, 4, 5])
    tgt = np.array([5, 5, 1, 5, 40, 5])
    invalid = np.array([False, False, False, False, False, True])
    codes = filter_codes(src, tgt, invalid, min_len=1, max_len=256, max_len_ratio=3.0)
    names = ["keep" if c < 0 else FILTER_REASONS[c] for c in codes]
    assert names == ["keep", "blank_line", "blank_line", "too_long", "length_ratio", "invalid_utf8"]
    assert (
        FILTER_REASONS[
            filter_codes(
                np.array([3]),
                np.array([3]),
                np.array([False]),
                min_len=3,
                max_len=9,
                max_len_ratio=3,
            )[0]
        ]
        == "too_short"
    )


def test_blank_lines_dropped_from_train_and_kept_in_valid(tmp_path):
    src, tgt = random_pairs(200, seed=2, **PREPROCESS_PAIRS)
    src[5], tgt[9] = "", "   "
    write_corpus(tmp_path, "train", src, tgt)
    vsrc, vtgt = random_pairs(10, seed=3, **PREPROCESS_PAIRS)
    vsrc[4] = ""
    write_corpus(tmp_path, "valid", vsrc, vtgt)
    manifest, _ = preprocess(config(tmp_path))
    assert manifest.splits["train"].filtered["blank_line"] == 2
    assert 5 not in ParallelCorpus(str(tmp_path / "out"), "train").line_numbers.tolist()
    valid = ParallelCorpus(str(tmp_path / "out"), "valid")
    assert len(valid) == 10 and valid[4][0].tolist() == [2]  # EOS only


def test_messy_text_windows_endings_control_chars_and_a_1mb_line(tmp_path):
    src, tgt = random_pairs(200, seed=4, **PREPROCESS_PAIRS)
    src[0] = "tab\there form\x0cfeed nel\x85 ls\u2028 ctrl\x01 dog"
    tgt[0] = "der\rhund"
    vsrc, vtgt = random_pairs(10, seed=5, **PREPROCESS_PAIRS)
    vsrc[3] = "dog " * 250_000  # 1 MB
    write_corpus(tmp_path, "train", src, tgt, ending="\r\n")
    write_corpus(tmp_path, "valid", vsrc, vtgt)
    manifest, _ = preprocess(config(tmp_path, max_len=40))
    assert (
        manifest.splits["train"].num_lines == 200
    )  # no line was split on \r, \x0c, \x85 or U+2028
    valid = ParallelCorpus(str(tmp_path / "out"), "valid")
    assert len(valid) == 10 and valid.src_lengths[3] > 100_000


def _assert_clean_failure(tmp_path, capsys, *extra, expect):
    code = run_cli(tmp_path, *extra)
    err_lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code != 0
    assert len(err_lines) == 1 and expect in err_lines[0], err_lines
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_missing_file(corpus_dir, capsys):
    os.remove(corpus_dir / "valid.de")
    _assert_clean_failure(corpus_dir, capsys, expect="valid.de: no such file")


def test_line_count_mismatch(corpus_dir, capsys):
    with open(corpus_dir / "train.de", "a") as handle:
        handle.write("ein extra satz\n")
    _assert_clean_failure(corpus_dir, capsys, expect="train.en has 300 lines but")


def test_invalid_utf8_error_and_skip(corpus_dir, capsys):
    raw = (corpus_dir / "train.en").read_bytes().split(b"\n")
    raw[6] = b"caf\xe9 dog"
    (corpus_dir / "train.en").write_bytes(b"\n".join(raw))
    _assert_clean_failure(corpus_dir, capsys, expect="train.en:7: invalid UTF-8")
    assert run_cli(corpus_dir, "--skip-invalid") == 0
    manifest = json.loads((corpus_dir / "out" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["filtered"]["invalid_utf8"] == 1
    assert 6 not in ParallelCorpus(str(corpus_dir / "out"), "train").line_numbers.tolist()


def test_empty_training_set_after_filtering(corpus_dir, capsys):
    _assert_clean_failure(
        corpus_dir,
        capsys,
        "--max-len",
        "2",
        "--min-len",
        "0",
        expect="training set is empty after filtering",
    )


def test_overwrite_replaces_only_a_dataset_nmt_preprocess_made(corpus_dir, capsys):
    (corpus_dir / "out").mkdir()
    (corpus_dir / "out" / "keep.txt").write_text("precious")
    assert run_cli(corpus_dir) != 0
    assert "--overwrite" in capsys.readouterr().err
    assert (corpus_dir / "out" / "keep.txt").read_text() == "precious"
    # Someone else's directory: --overwrite does not make it ours (issue 28, case 2).
    assert run_cli(corpus_dir, "--overwrite") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a directory nmt-preprocess made" in err, err
    assert (corpus_dir / "out" / "keep.txt").read_text() == "precious"
    (corpus_dir / "out" / "keep.txt").unlink()
    assert run_cli(corpus_dir) == 0  # empty: ours from now on
    (corpus_dir / "out" / "stray.txt").write_text("left in our dataset")
    assert run_cli(corpus_dir, "--overwrite") == 0
    assert (corpus_dir / "out" / "manifest.json").exists()
    assert not (corpus_dir / "out" / "stray.txt").exists()  # ours is replaced whole, as before


def test_destdir_that_holds_an_input_is_refused_and_nothing_is_lost(corpus_dir, capsys):
    """nmt-preprocess --destdir RAW --overwrite, RAW holding the raw text (and other languages)."""
    (corpus_dir / "train.fr").write_text("not an input, but in the same directory\n")
    before = {p.name: p.read_bytes() for p in corpus_dir.iterdir() if p.is_file()}
    assert run_cli(corpus_dir, "--destdir", str(corpus_dir), "--overwrite") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--destdir {corpus_dir}: holds --trainpref {corpus_dir / 'train.en'}" in err
    assert {p.name: p.read_bytes() for p in corpus_dir.iterdir() if p.is_file()} == before
    # A reused SentencePiece model inside the dataset being replaced: the same refusal.
    assert run_cli(corpus_dir) == 0
    spm_model = corpus_dir / "out" / "spm.model"
    assert run_cli(corpus_dir, "--overwrite", "--spm-model", str(spm_model)) == 1
    assert f"holds --spm-model {spm_model}" in capsys.readouterr().err
    assert spm_model.exists()


def test_a_vocabulary_smaller_than_asked_is_one_warning_line(corpus_dir, caplog):
    assert run_cli(corpus_dir, "--spm-vocab-size", "100000") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    vocab_size = load_manifest(str(corpus_dir / "out")).spm.src_vocab_size
    assert warnings == [
        f"--spm-vocab-size 100000: the training text (en+de) yields only {vocab_size} pieces, "
        f"so the vocabulary has {vocab_size}"
    ]


def test_a_truncated_gz_is_reported_at_the_line_it_breaks(corpus_dir, capsys):
    src, tgt = random_pairs(3000, seed=5, **PREPROCESS_PAIRS)
    write_corpus(corpus_dir, "big", src, tgt)
    compressed = gzip.compress((corpus_dir / "big.en").read_bytes())
    truncated = compressed[: len(compressed) // 2]
    (corpus_dir / "big.en").unlink()
    (corpus_dir / "big.en.gz").write_bytes(truncated)
    decoded = zlib.decompressobj(wbits=31).decompress(truncated)  # all that can be decoded
    whole_lines = decoded.count(b"\n")
    assert 1000 < whole_lines < 3000
    assert run_cli(corpus_dir, "--trainpref", str(corpus_dir / "big")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith(
        f"nmt-preprocess: error: {corpus_dir / 'big.en.gz'}: cannot read line {whole_lines + 1} "
        f"({whole_lines} lines decoded before it): "
    ), errors


def test_a_destdir_whose_parents_do_not_exist_is_created(corpus_dir):
    preprocess(
        config(corpus_dir, destdir=str(corpus_dir / "runs" / "multi30k" / "data"))
    )  # as scripts/main.sh does
    assert (corpus_dir / "runs" / "multi30k" / "data" / "manifest.json").exists()


def test_bad_option_names_the_option(corpus_dir, capsys):
    assert run_cli(corpus_dir, "--max-len-ratio", "0.5") != 0
    assert "--max-len-ratio" in capsys.readouterr().err


def test_failure_midway_leaves_no_dataset_and_keeps_the_old_one(corpus_dir, monkeypatch):
    preprocess(config(corpus_dir))
    before = (corpus_dir / "out" / "manifest.json").read_bytes()
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    original = preprocess_module.write_split
    monkeypatch.setattr(preprocess_module, "write_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        preprocess(config(corpus_dir, overwrite=True, spm_vocab_size=50))
    assert (corpus_dir / "out" / "manifest.json").read_bytes() == before
    assert not [p for p in os.listdir(corpus_dir) if p.startswith(".out")]


@pytest.mark.slow
def test_kill_9_never_leaves_a_dataset_that_looks_complete(tmp_path):
    src, tgt = random_pairs(60_000, seed=6, **PREPROCESS_PAIRS)
    write_corpus(tmp_path, "train", src, tgt)
    write_corpus(tmp_path, "valid", *random_pairs(20, seed=7, **PREPROCESS_PAIRS))
    command = [
        sys.executable,
        "-m",
        "nmt_cli.preprocess",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        str(tmp_path / "train"),
        "--validpref",
        str(tmp_path / "valid"),
        "--destdir",
        str(tmp_path / "out"),
        "--spm-vocab-size",
        "60",
        "--workers",
        "1",
    ]
    started = time.perf_counter()
    assert subprocess.run(command, capture_output=True).returncode == 0
    full_run = time.perf_counter() - started
    import shutil

    shutil.rmtree(tmp_path / "out")
    for fraction in (0.4, 0.7, 0.9):
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(full_run * fraction)
        process.send_signal(signal.SIGKILL)
        process.wait()
        out = tmp_path / "out"
        if out.exists():  # it finished before the kill: then it must be complete and valid
            manifest = json.loads((out / "manifest.json").read_text())
            for name, checksum in manifest["checksums"].items():
                assert checksum == "sha256:" + hashlib.sha256((out / name).read_bytes()).hexdigest()
            shutil.rmtree(out)
        # a killed run leaves at most a hidden temporary directory, never a manifest at --destdir
        assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("encoder", ["threads", "processes"])
def test_output_identical_for_any_worker_count_over_many_chunks(corpus_dir, monkeypatch, encoder):
    """Chunks of 37 lines, 1 or 3 workers, dedup and filters on: the same bytes."""
    src, tgt = random_pairs(1_000, seed=8, **PREPROCESS_PAIRS)
    src[100], tgt[200] = "", ""
    src[600], tgt[600] = src[5], tgt[5]
    write_corpus(corpus_dir, "train", src, tgt)
    monkeypatch.setattr(preprocess_module, "CHUNK_LINES", 37)
    for workers in (1, 3):
        preprocess(
            config(
                corpus_dir,
                destdir=str(corpus_dir / f"w{workers}"),
                workers=workers,
                dedup=True,
                encoder=encoder,
            )
        )
    for name in sorted(os.listdir(corpus_dir / "w1")):
        a, b = (corpus_dir / "w1" / name).read_bytes(), (corpus_dir / "w3" / name).read_bytes()
        if name == "manifest.json":
            a, b = (json.loads(x)["splits"] for x in (a, b))
        assert a == b, name


def test_dedup_drops_later_exact_duplicates_and_counts_them(tmp_path):
    src, tgt = random_pairs(300, seed=9, **PREPROCESS_PAIRS)
    for later, earlier in ((50, 3), (51, 3), (260, 40)):
        src[later], tgt[later] = src[earlier], tgt[earlier]
    src[70] = src[4]  # same source, other target: not a duplicate pair
    write_corpus(tmp_path, "train", src, tgt)
    write_corpus(tmp_path, "valid", src[:10], tgt[:10])  # valid and test are never deduplicated
    manifest, stats = preprocess(config(tmp_path, dedup=True))
    assert (
        manifest.splits["train"].filtered["duplicate"] == 3 and stats[0].filtered["duplicate"] == 3
    )
    line_numbers = ParallelCorpus(str(tmp_path / "out"), "train").line_numbers.tolist()
    assert 3 in line_numbers and 40 in line_numbers and 70 in line_numbers  # first occurrences stay
    assert not {50, 51, 260} & set(line_numbers)
    assert len(ParallelCorpus(str(tmp_path / "out"), "valid")) == 10
    without, _ = preprocess(config(tmp_path, destdir=str(tmp_path / "all")))
    assert "duplicate" not in without.splits["train"].filtered
    assert without.splits["train"].num_samples == manifest.splits["train"].num_samples + 3


def test_reservoir_sample_is_uniform_and_deterministic():
    from nmt.data.preprocess import Reservoir

    counts = np.zeros(1_000)
    for seed in range(400):
        reservoir = Reservoir(100, seed=seed)
        for start in range(0, 1_000, 64):
            reservoir.offer([str(i) for i in range(start, min(start + 64, 1_000))])
        sample = [int(x) for x in reservoir.sample()]
        assert sample == sorted(sample) and len(set(sample)) == 100  # in stream order, no repeats
        counts[sample] += 1
    # each item is kept with probability 0.1: 40 of 400 times (sd 6), early and late items alike
    assert (
        abs(counts[:500].mean() - 40) < 2
        and abs(counts[500:].mean() - 40) < 2
        and counts.min() > 10
    )
    again = Reservoir(100, seed=399)
    for start in range(0, 1_000, 64):
        again.offer([str(i) for i in range(start, min(start + 64, 1_000))])
    assert [int(x) for x in again.sample()] == sample
    small = Reservoir(100, seed=0)
    small.offer(["a", "b"])
    assert small.sample() == ["a", "b"]


def test_spm_trained_on_a_sample_depends_on_the_seed_only(corpus_dir):
    write_corpus(corpus_dir, "train", *random_pairs(3_000, seed=10, **PREPROCESS_PAIRS))
    models = []
    for seed, workers, name in ((1, 1, "a"), (1, 2, "b"), (2, 1, "c")):
        manifest, _ = preprocess(
            config(
                corpus_dir,
                destdir=str(corpus_dir / name),
                seed=seed,
                workers=workers,
                spm_sample_size=300,
            )
        )
        models.append((corpus_dir / name / "spm.model").read_bytes())
    assert models[0] == models[1]
    assert models[0] != models[2]
