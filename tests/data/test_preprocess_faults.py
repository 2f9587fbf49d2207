"""nmt-preprocess driven through its real command line the way a hostile or clumsy user would (issue 13):
two runs into one directory, a crashed run, a moved dataset, a full disk, an unwritable directory,
degenerate training text, corrupt bytes. Each case ends in one clear line or the right result."""

import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest
from nmt.model import build_model
from nmt_cli.eval import main as eval_main
from nmt_cli.preprocess import main as preprocess_main

from ..helpers import (
    PREPROCESS_PAIRS,
    random_pairs,
    tiny_checkpoint,
    tiny_model_config,
    write_corpus,
)


def cli_args(root, *extra, destdir=None):
    return [
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        str(root / "train"),
        "--validpref",
        str(root / "valid"),
        "--testpref",
        str(root / "test"),
        "--destdir",
        str(destdir or root / "out"),
        "--spm-vocab-size",
        "60",
        "--workers",
        "1",
        *extra,
    ]


def cli_command(root, *extra, destdir=None):
    return [sys.executable, "-m", "nmt_cli.preprocess", *cli_args(root, *extra, destdir=destdir)]


@pytest.fixture()
def corpus(tmp_path):
    write_corpus(tmp_path, "train", *random_pairs(400, seed=0, **PREPROCESS_PAIRS))
    write_corpus(tmp_path, "valid", *random_pairs(20, seed=1, **PREPROCESS_PAIRS))
    write_corpus(tmp_path, "test", *random_pairs(25, seed=2, **PREPROCESS_PAIRS))
    return tmp_path


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def assert_one_error_line(stderr, *expected):
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def leftovers(directory, name="out"):
    """Anything a run into ``directory/name`` left behind: the dataset, temporaries, lock files."""
    return sorted(p for p in os.listdir(directory) if p == name or p.startswith(f".{name}"))


# ----------------------------------------------------------------------------- 3: two runs, one directory
def _wait_for_lock(path, pid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if path.read_text().strip() == str(pid):
                return
        time.sleep(0.05)
    raise AssertionError(f"{path} never named PID {pid}")


def test_second_run_into_the_same_destdir_is_refused_naming_the_holder(corpus):
    # a few seconds of work
    write_corpus(corpus, "train", *random_pairs(30_000, seed=3, **PREPROCESS_PAIRS))
    first = subprocess.Popen(
        cli_command(corpus), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lock(corpus / ".out.lock", first.pid)
        first.send_signal(
            signal.SIGSTOP
        )  # holds the lock, mid-run, for as long as the second run takes
        second = subprocess.run(
            cli_command(corpus, "--overwrite", "--spm-vocab-size", "50"),
            capture_output=True,
            text=True,
        )
        first.send_signal(signal.SIGCONT)
        assert second.returncode == 1
        assert_one_error_line(
            second.stderr, str(corpus / "out"), f"PID {first.pid}", "in use by another run"
        )
        _, stderr = first.communicate(timeout=240)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    assert (
        load_manifest(str(corpus / "out")).spm.src_vocab_size == 60
    )  # the first run's dataset, complete
    assert leftovers(corpus) == ["out"]  # no temporary, and the lock file went with its holder


def test_a_killed_run_leaves_no_stuck_lock_and_its_leftovers_are_swept(corpus):
    write_corpus(corpus, "train", *random_pairs(30_000, seed=3, **PREPROCESS_PAIRS))
    first = subprocess.Popen(
        cli_command(corpus), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _wait_for_lock(corpus / ".out.lock", first.pid)
    deadline = time.monotonic() + 60
    while (
        not any(name.startswith(".out.tmp-") for name in os.listdir(corpus))
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    first.kill()
    first.wait()
    assert any(name.startswith(".out.tmp-") for name in os.listdir(corpus))  # what kill -9 leaves
    second = subprocess.run(cli_command(corpus), capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert leftovers(corpus) == ["out"]


def test_the_final_rename_checks_again(corpus, monkeypatch, capsys):
    """Something wrote --destdir while the run was working (not another nmt run: that one has no lock):
    the finished dataset is not installed over it."""
    from nmt.data.manifest import Manifest

    original = Manifest.write

    def meanwhile(manifest, directory):  # the last step before the rename
        os.makedirs(corpus / "out", exist_ok=True)
        (corpus / "out" / "precious.txt").write_text("someone else's")
        original(manifest, directory)

    monkeypatch.setattr(Manifest, "write", meanwhile)
    assert preprocess_main(cli_args(corpus)) == 1
    assert_one_error_line(capsys.readouterr().err, str(corpus / "out"), "--overwrite")
    assert (corpus / "out" / "precious.txt").read_text() == "someone else's"
    assert leftovers(corpus) == ["out"]


# ----------------------------------------------------------------------------- 4: self-contained datasets
def random_checkpoint(data_dir, path):
    """An untrained model saved the way the trainer saves one (nmt-eval needs a checkpoint, not a good one)."""
    manifest = load_manifest(str(data_dir))
    cfg = tiny_model_config(
        manifest.spm.src_vocab_size, layers=1, dim=16, ffn=16, heads=2, max_target_positions=64
    )
    torch.manual_seed(0)
    proto = (data_dir / manifest.spm.src_model).read_bytes()
    return tiny_checkpoint(build_model(cfg), path, spm_proto=proto)


def test_a_moved_dataset_scores_without_its_raw_text(corpus, tmp_path_factory, capsys):
    assert preprocess_main(cli_args(corpus)) == 0
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "data"
    shutil.move(str(corpus / "out"), str(elsewhere))
    for name in ("train", "valid", "test"):
        for lang in ("en", "de"):
            os.remove(corpus / f"{name}.{lang}")
    checkpoint = random_checkpoint(elsewhere, tmp_path_factory.mktemp("ckpt") / "model.pt")
    capsys.readouterr()
    os.chdir(tmp_path_factory.mktemp("somewhere"))
    assert (
        eval_main(
            [
                str(elsewhere),
                "--path",
                checkpoint,
                "--split",
                "test",
                "--beam",
                "1",
                "--max-len-b",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "BLEU" in out.out + out.err
    # the reference inside the dataset is the raw target text, line for line
    manifest = load_manifest(str(elsewhere))
    reference = gzip.decompress(
        (elsewhere / manifest.splits["test"].reference).read_bytes()
    ).decode()
    assert reference == "".join(
        line + "\n" for line in random_pairs(25, seed=2, **PREPROCESS_PAIRS)[1]
    )

    # what nmt-train --eval-bleu runs, from the moved directory
    from nmt.eval.evaluate import make_bleu_validator
    from nmt.model import load_model

    model = load_model(torch.load(checkpoint, weights_only=True), name=str(checkpoint))
    scores = make_bleu_validator(manifest, "valid", search={"beam": 1})(model, torch.device("cpu"))
    assert tuple(scores) == manifest.languages().pairs and min(scores.values()) >= 0


# ----------------------------------------------------------------------------- 7: one clear line, nothing half-written
@pytest.fixture()
def small_tmpfs(tmp_path):
    """A 3 MB file system (root only); the test is skipped where it cannot be mounted."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
            capture_output=True,
        ).returncode
    ):
        pytest.skip("needs root to mount a small tmpfs")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_disk_full_names_the_file_and_leaves_nothing(corpus, small_tmpfs):
    write_corpus(
        corpus, "train", *random_pairs(60_000, seed=4, **PREPROCESS_PAIRS)
    )  # ~3.6 MB of tokens: more than fits
    result = subprocess.run(
        cli_command(corpus, destdir=small_tmpfs / "out"), capture_output=True, text=True
    )
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr, "disk full", str(small_tmpfs))
    assert ".bin" in line or ".idx" in line or ".npy" in line
    assert os.listdir(small_tmpfs) == []  # no dataset, no temporary directory, no lock


def test_file_size_limit_names_the_file(corpus):
    write_corpus(corpus, "train", *random_pairs(20_000, seed=4, **PREPROCESS_PAIRS))

    def limit_file_size():
        signal.signal(
            signal.SIGXFSZ, signal.SIG_IGN
        )  # write() then fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    result = subprocess.run(
        cli_command(corpus), capture_output=True, text=True, preexec_fn=limit_file_size
    )
    assert result.returncode == 1
    assert_one_error_line(result.stderr, str(corpus / ".out.tmp-"), "file too large")
    assert leftovers(corpus) == []


def test_unwritable_destdir_is_one_line_naming_it(corpus, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: a read-only file system it is
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)],
            capture_output=True,
        ).returncode:
            pytest.skip("cannot mount a read-only tmpfs")
    else:
        read_only.chmod(0o555)
    try:
        result = subprocess.run(
            cli_command(corpus, destdir=read_only / "out"), capture_output=True, text=True
        )
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(read_only)], check=True)
    assert result.returncode == 1
    assert_one_error_line(result.stderr, str(read_only / "out"), "cannot write here")
    assert "sample for SentencePiece" not in result.stderr  # it failed before any work


def test_degenerate_training_text_is_one_line(corpus):
    (corpus / "train.en").write_text(
        "word " * 1_000_000 + "\n"
    )  # one 5 MB line: SentencePiece skips it and has nothing left
    (corpus / "train.de").write_text("wort " * 1_000_000 + "\n")
    result = subprocess.run(cli_command(corpus), capture_output=True, text=True)
    assert result.returncode == 1
    assert_one_error_line(result.stderr, "SentencePiece training failed", "4,192 bytes")
    assert leftovers(corpus) == []


def _corrupt_first_token(data_dir, value):
    manifest = load_manifest(str(data_dir))
    path = data_dir / f"{manifest.splits['train'].parts[0].src.prefix}.bin"
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(32)  # past the header: the first token
        handle.write(np.array([value], dtype="<u2").tobytes())
    assert path.stat().st_size == size
    return path


def test_same_size_corruption_of_a_bin_is_one_line_when_training_opens_it(corpus, tmp_path):
    assert preprocess_main(cli_args(corpus)) == 0
    path = _corrupt_first_token(corpus / "out", 0xFFFF)
    command = [
        sys.executable,
        "-m",
        "nmt_cli.train",
        str(corpus / "out"),
        "--save-dir",
        str(tmp_path / "ckpt"),
        "--max-update",
        "2",
        "--encoder-layers",
        "1",
        "--decoder-layers",
        "1",
        "--encoder-embed-dim",
        "16",
        "--decoder-embed-dim",
        "16",
        "--encoder-ffn-embed-dim",
        "16",
        "--decoder-ffn-embed-dim",
        "16",
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert result.returncode == 1
    assert_one_error_line(result.stderr, str(path), "outside the vocabulary")


def test_corruption_inside_the_vocabulary_is_found_by_the_checksums(corpus):
    from nmt.data.manifest import verify_checksums  # what nmt-train --verify-data runs

    assert preprocess_main(cli_args(corpus)) == 0
    manifest = load_manifest(str(corpus / "out"))
    verify_checksums(manifest)  # intact
    largest = manifest.splits["train"].parts[0].src.max_token_id
    _corrupt_first_token(corpus / "out", largest)  # a valid id, and not a new maximum
    ParallelCorpus(str(corpus / "out"), "train")  # opening cannot tell (ids in range, same maximum)
    with pytest.raises(ValueError, match="SHA-256 differs"):
        verify_checksums(manifest)


def test_line_count_mismatch_found_at_the_end_of_the_stream_leaves_nothing(corpus, capsys):
    assert preprocess_main(cli_args(corpus, destdir=corpus / "model")) == 0  # a vocabulary to give
    with open(corpus / "train.de", "a") as handle:
        handle.write("ein satz zu viel\n")
    # with a given model, the mismatch shows only once the source side has been encoded to its end
    assert (
        preprocess_main(cli_args(corpus, "--spm-model", str(corpus / "model" / "spm.model"))) == 1
    )
    assert_one_error_line(capsys.readouterr().err, "train.en has 400 lines", "train.de has 401")
    assert leftovers(corpus) == []


def test_manifest_records_what_makes_a_dataset_self_contained(corpus):
    assert preprocess_main(cli_args(corpus)) == 0
    manifest = json.loads((corpus / "out" / "manifest.json").read_text())
    assert manifest["splits"]["valid"]["reference"] == "valid.ref.de.gz"
    assert manifest["splits"]["test"]["reference"] == "test.ref.de.gz"
    assert (
        "reference" not in manifest["splits"]["train"]
        or manifest["splits"]["train"]["reference"] is None
    )
    for split in manifest["splits"].values():
        for part in split["parts"]:
            assert 0 < part["src"]["max_token_id"] < manifest["spm"]["src_vocab_size"]
