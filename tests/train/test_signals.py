"""SIGTERM to nmt-train, alone and under torchrun: in training, the run stops within seconds of the
signal whatever --log-interval, saves and resumes; during start-up it ends at once, nothing saved.

The model is wide enough that an update takes about a second on 2 CPU cores, so that a signal
lands in the middle of the updates, and --log-interval 1000 is never reached: the stop cannot come
from a log point."""

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
import torch

from ..helpers import process_group, torchrun_command

SLOW_MODEL = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256 "
    "--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4 --share-all-embeddings"
).split()
STOP_SECONDS = 10  # a scheduler's grace period is 10 to 30 s
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def command(data_dir, save_dir, *extra, nproc=1):
    args = [
        data_dir,
        "--save-dir",
        str(save_dir),
        "--max-tokens",
        "2048",
        "--log-interval",
        "1000",
        "--max-update",
        "1000",
        "--no-epoch-checkpoints",
        "--layout",
        "padded",
        "--no-progress-bar",
        *SLOW_MODEL,
        *extra,
    ]
    if nproc > 1:
        return torchrun_command("nmt_cli.train", *map(str, args), nproc=nproc)
    return [sys.executable, "-m", "nmt_cli.train", *map(str, args)]


def signalled(argv, log, *, when, after_seconds=0.0):
    """Run ``argv`` with its stderr in ``log``; SIGTERM once ``when(log text)`` holds and
    ``after_seconds`` more have passed. (exit status, seconds from the signal to the exit, log text)."""
    with open(log, "w") as stderr, process_group(argv, env=ENV, stderr=stderr) as process:
        deadline = time.monotonic() + 240
        while not when(log.read_text()):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(after_seconds)
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after SIGTERM:\n{log.read_text()}")
        return returncode, time.monotonic() - signalled_at, log.read_text()


def logged_at(text, pattern):
    """The time stamp of the first log line matching ``pattern``."""
    match = re.search(r"^(\S+ \S+) \|.*" + pattern, text, re.MULTILINE)
    assert match, f"no line matches {pattern!r}:\n{text}"
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")


def saved_update(save_dir):
    return torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["num_updates"]


def assert_nothing_saved(save_dir):
    left = sorted(os.listdir(save_dir)) if save_dir.exists() else []
    assert not [name for name in left if name.endswith(".pt") or ".tmp-" in name], left


@pytest.mark.slow
def test_sigterm_in_training_stops_within_seconds_saves_and_resumes(tiny_data, tmp_path):
    save_dir = tmp_path / "ck"
    returncode, seconds, text = signalled(
        command(tiny_data, save_dir),
        tmp_path / "log",
        when=lambda text: "checkpoint_last.pt at update" in text,  # the first epoch's end
        after_seconds=1.5,
    )
    assert returncode == 0, text
    assert seconds < STOP_SECONDS, text
    assert "done: stopped by signal" in text
    stopped_at = saved_update(save_dir)
    assert stopped_at > 3  # after the first epoch's 3 updates: mid-epoch

    resumed = subprocess.run(
        command(tiny_data, save_dir, "--max-update", str(stopped_at + 1)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"update {stopped_at}, update" in resumed.stderr
    )  # "resumed from ...: epoch E, update N, ..."
    assert f"--max-update {stopped_at + 1} reached ({stopped_at + 1} updates" in resumed.stderr


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_after_the_same_update(tiny_data, tmp_path):
    save_dir = tmp_path / "ck"
    _, _, text = signalled(
        command(tiny_data, save_dir, nproc=2),
        tmp_path / "log",
        when=lambda text: "checkpoint_last.pt at update" in text,
        after_seconds=1.5,
    )
    # torchrun forwards the signal to both ranks (and SIGKILLs them 30 s later), then reports its
    # own SignalException (exit 1)
    assert "done: stopped by signal" in text
    signalled_at = logged_at(text, "received signal 15")
    stopped = (logged_at(text, "done: stopped by signal") - signalled_at).total_seconds()
    assert stopped < STOP_SECONDS, text
    assert text.count("received signal 15") == 2, text
    stopped_at = saved_update(save_dir)
    assert stopped_at > 3
    assert re.search(rf"saved checkpoint_last.pt at update {stopped_at} ", text)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_during_the_compile_warm_up_ends_the_start_up_at_once(tiny_data, tmp_path, nproc):
    save_dir = tmp_path / "ck"
    returncode, seconds, text = signalled(
        command(tiny_data, save_dir, "--compile", nproc=nproc),
        tmp_path / "log",
        when=lambda text: (
            text.count("training pairs in") >= 1
        ),  # the trainer is built: warm-up next
        after_seconds=3.0,
    )
    assert "compiled" not in text  # the warm-up had not finished
    assert text.count("nmt-train: terminated (SIGTERM)") == nproc, text
    assert seconds < STOP_SECONDS, text
    if nproc == 1:  # torchrun exits 1 after a signal, whatever its ranks do
        assert returncode == 128 + signal.SIGTERM
    assert_nothing_saved(save_dir)


@pytest.mark.slow
def test_sigterm_while_the_first_blend_is_built_ends_the_start_up_at_once(
    two_corpus_data, tmp_path
):
    save_dir = tmp_path / "ck"
    blend = ["--train-subsets", "train,train1", "--epoch-samples", "20000000"]  # ~4 s to build
    returncode, seconds, text = signalled(
        command(two_corpus_data, save_dir, *blend),
        tmp_path / "log",
        when=lambda text: "training pairs in" in text,
        after_seconds=1.0,
    )
    assert "blend |" not in text  # the epoch's blend was not ready: no counts logged
    assert returncode == 128 + signal.SIGTERM, text
    assert "nmt-train: terminated (SIGTERM)" in text
    assert seconds < STOP_SECONDS, text
    assert_nothing_saved(save_dir)
    assert not list((save_dir / "blend-cache").glob("*.tmp-*"))
