"""Workers die with their parent, and a stopped nmt-preprocess leaves nothing half-written (issues 47, 50).

The end-to-end cases run the real command with ``--workers 2`` and stop it with SIGTERM (to the
command alone), SIGINT (to its whole process group, as Ctrl+C does) or SIGKILL, at the
SentencePiece sample, during SentencePiece training and during the encoding. Each checks that the
command ends within seconds (one line, exit 143 or 130), that its forked workers end too, that no
dataset appears, and that the next run into the same directory succeeds and sweeps what was left.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from nmt.fileio import describe_os_error
from nmt.workers import (
    Terminated,
    run_in_child,
    signals_deferred,
    stop_on_signals,
)
from nmt_cli.preprocess import main as preprocess_main

from ..helpers import PREPROCESS_PAIRS, random_pairs, write_corpus

STOP_SECONDS = 10  # issue 47: a stopped run is gone within this
WORKERS_GONE_SECONDS = 5


# ----------------------------------------------------------------------------- processes
def _stat(pid):
    """(state, parent PID, start time) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def children(pid):
    """{child PID: start time} of every process whose parent is ``pid``."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == pid:
                found[int(name)] = stat[2]
    return found


def descendants(pid):
    """{PID: start time} of every process below ``pid``."""
    found = {}
    for child, started in children(pid).items():
        found[child] = started
        found.update(descendants(child))
    return found


def still_running(processes):
    """Those of ``processes`` ({PID: start time}) that run yet (a zombie or a new process under
    a reused PID does not)."""
    running = []
    for pid, started in processes.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[0] not in "ZX":
            running.append(pid)
    return running


def wait_until_gone(processes, timeout):
    deadline = time.monotonic() + timeout
    while still_running(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return still_running(processes)


# ----------------------------------------------------------------------------- unit: nmt.workers
@pytest.mark.parametrize("how", ["prctl", "watch"])
def test_a_worker_ends_when_its_parent_ends(how):
    """The kernel's parent-death signal, or (where there is none) the watching thread."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from nmt import workers

        if sys.argv[1] == "watch":
            workers._set_parent_death_signal = lambda: False
        parent = os.getpid()
        child = os.fork()
        if child == 0:
            workers.die_with_parent(parent)
            print("worker ready", flush=True)
            time.sleep(60)
            os._exit(0)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script + "time.sleep(60)\n", how],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout.readline() == "worker ready\n"
        workers = children(parent.pid)
        assert len(workers) == 1
        parent.kill()
        parent.wait()
        assert wait_until_gone(workers, WORKERS_GONE_SECONDS) == []
    finally:
        parent.kill()


def test_a_worker_whose_parent_died_before_it_was_set_up_ends_at_once():
    """The race: the parent is gone before the worker asked to die with it (PPID is no longer it)."""
    script = "from nmt.workers import die_with_parent; die_with_parent(-1); print('alive')"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "alive" not in result.stdout


def test_a_worker_ignores_sigint_and_sigterm_ends_it():
    """Ctrl+C reaches the worker too (one process group): only its parent reacts. A SIGTERM sent to
    the worker ends it, even though the parent's handler (inherited by fork) raises."""
    script = textwrap.dedent(
        """
        import os, signal, time
        from nmt.workers import die_with_parent, stop_on_signals

        with stop_on_signals():
            parent = os.getpid()
            if os.fork() == 0:
                die_with_parent(parent)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)
                print("survived SIGINT", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                print("survived SIGTERM", flush=True)
                os._exit(0)
            print(os.wait()[1], flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.splitlines() == ["survived SIGINT", str(signal.SIGTERM)], result.stderr
    assert "Traceback" not in result.stderr


def _signal_soon(signum, delay=0.2):
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def test_sigterm_raises_terminated_once_and_the_handlers_are_restored():
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(Terminated):
        with stop_on_signals():
            _signal_soon(signal.SIGTERM)
            try:
                time.sleep(30)
            finally:  # cleanup is not cut short by a second signal
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                cleaned = True
    assert cleaned
    assert time.monotonic() - started < STOP_SECONDS
    assert signal.getsignal(signal.SIGTERM) is previous


def test_an_error_the_signal_caused_is_reported_as_the_signal():
    """A signal arrives, then an error follows from it (a worker killed by the same group signal
    breaks the pool: an OSError): the run says it was stopped, not that a worker died."""
    with pytest.raises(KeyboardInterrupt) as raised:
        with stop_on_signals():
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                raise OSError("an encoding worker process died")
    assert type(raised.value) is KeyboardInterrupt


def test_a_signal_in_a_deferred_block_stops_the_run_after_it():
    finished = []
    with pytest.raises(Terminated):
        with stop_on_signals():
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                finished.append("install")
            finished.append("after")
    assert finished == ["install"]


def _deaf_sleep(seconds):
    """Like a long call into C that never looks at signals (SentencePiece training)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    time.sleep(seconds)


def test_a_long_call_in_c_in_a_child_is_stopped_at_once_and_the_child_with_it():
    started = time.monotonic()
    before = children(os.getpid())
    with pytest.raises(Terminated):
        with stop_on_signals():
            _signal_soon(signal.SIGTERM)
            run_in_child(lambda: _deaf_sleep(30), what="sleeping")
    assert time.monotonic() - started < STOP_SECONDS
    assert set(children(os.getpid())) <= set(before)  # killed and reaped


def test_a_child_gives_back_its_result_its_error_or_its_death():
    assert run_in_child(lambda: os.getpid(), what="pid") != os.getpid()
    with pytest.raises(ValueError, match="bad text"):
        run_in_child(lambda: (_ for _ in ()).throw(ValueError("bad text")), what="raising")
    with pytest.raises(OSError) as died:
        run_in_child(lambda: os.kill(os.getpid(), signal.SIGKILL), what="SentencePiece training")
    assert describe_os_error(died.value).strerror == (
        "SentencePiece training: its process died (exit status -9: killed, or out of memory)"
    )


@pytest.mark.parametrize(
    "stop, status, line",
    [
        (Terminated, 143, "nmt-preprocess: terminated (SIGTERM)\n"),
        (KeyboardInterrupt, 130, "nmt-preprocess: interrupted\n"),
    ],
)
def test_the_commands_exit_status_names_the_signal(
    tmp_path, monkeypatch, capsys, stop, status, line
):
    """As a shell reports a process the signal ended: 128 + the signal's number, and one line."""
    import nmt.data.preprocess

    def stopped(cfg):
        raise stop()

    monkeypatch.setattr(nmt.data.preprocess, "preprocess", stopped)
    write_corpus(tmp_path, "train", *random_pairs(10, seed=0, **PREPROCESS_PAIRS))
    argv = _command(tmp_path, tmp_path / "out", vocab=60)[3:]
    assert preprocess_main(argv) == status
    assert capsys.readouterr().err == line


def test_sigterm_during_the_install_loses_no_dataset(tmp_path, monkeypatch, capsys):
    """--overwrite swaps the new dataset in for the old one: a signal in the middle waits for the
    install to end (stopped there, the old dataset would be swept by the next run)."""
    import nmt.fileio
    from nmt.data.manifest import load_manifest

    write_corpus(tmp_path, "train", *random_pairs(300, seed=0, **PREPROCESS_PAIRS))
    write_corpus(tmp_path, "valid", *random_pairs(20, seed=1, **PREPROCESS_PAIRS))
    argv = _command(tmp_path, tmp_path / "out", vocab=60)[3:]
    assert preprocess_main(argv) == 0
    real_exchange = nmt.fileio._exchange

    def exchange_then_signal(first, second):
        swapped = real_exchange(first, second)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # where the handler runs
        return swapped

    monkeypatch.setattr(nmt.fileio, "_exchange", exchange_then_signal)
    capsys.readouterr()
    assert preprocess_main([*argv, "--overwrite", "--spm-vocab-size", "50"]) == 143
    assert capsys.readouterr().err.endswith("nmt-preprocess: terminated (SIGTERM)\n")
    assert load_manifest(str(tmp_path / "out")).spm.src_vocab_size == 50  # the new one, whole
    assert sorted(p for p in os.listdir(tmp_path) if "out" in p) == ["out"]


# ----------------------------------------------------------------------------- end to end
def _random_words(count, seed):
    """Text over many distinct words: SentencePiece trains on it for seconds."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(20_000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(count)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``long``: a sample of ~1 s and an encoding of ~10 s; ``slow_spm``: SentencePiece trains ~5 s
    on it; ``tiny``: the rerun."""
    root = tmp_path_factory.mktemp("corpora")
    src, tgt = random_pairs(50_000, seed=3, **PREPROCESS_PAIRS)
    for name, pairs in (
        ("long", (src * 10, tgt * 10)),
        ("slow_spm", (_random_words(20_000, seed=4), _random_words(20_000, seed=5))),
        ("tiny", random_pairs(300, seed=6, **PREPROCESS_PAIRS)),
    ):
        os.makedirs(root / name)
        write_corpus(root / name, "train", *pairs)
        write_corpus(root / name, "valid", *random_pairs(20, seed=1, **PREPROCESS_PAIRS))
    return root


def _command(corpus, destdir, *, vocab, sample=500_000):
    return [
        sys.executable,
        "-m",
        "nmt_cli.preprocess",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        str(corpus / "train"),
        "--validpref",
        str(corpus / "valid"),
        "--destdir",
        str(destdir),
        "--spm-vocab-size",
        str(vocab),
        "--spm-sample-size",
        str(sample),
        "--workers",
        "2",
    ]


class _Stderr:
    """A child's stderr, read as it comes (tqdm writes "\\r" updates)."""

    def __init__(self, stream):
        self.text = ""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for piece in iter(lambda: stream.read1(4096), b""):
            with self._lock:
                self.text += piece.decode("utf-8", "replace")

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if re.search(pattern, self.text):
                    return
            time.sleep(0.02)
        raise AssertionError(f"never saw {pattern!r} in:\n{self.text}")

    def finish(self):
        self._thread.join(timeout=30)
        return self.text


# stage -> (corpus, --spm-vocab-size, --spm-sample-size, what stderr shows once the stage runs,
# the child processes then (2 encoding workers, and SentencePiece's trainer), what stderr shows
# once the stage is over)
STAGES = {
    "sample": ("long", 60, 2000, r"sample for SentencePiece", 2, r"trained SentencePiece"),
    "spm training": (
        "slow_spm",
        4000,
        500_000,
        r"sample for SentencePiece[^\n]*\n",
        3,
        r"trained SentencePiece",
    ),
    "encoding": ("long", 60, 2000, r"encode: [1-9]", 2, r"encoded \d+ pairs"),
}
# signal -> (sent to the process group, exit status, last line of stderr)
STOPS = {
    "SIGTERM": (False, 128 + signal.SIGTERM, "nmt-preprocess: terminated (SIGTERM)"),
    "SIGINT": (True, 128 + signal.SIGINT, "nmt-preprocess: interrupted"),
    "SIGKILL": (False, -signal.SIGKILL, None),
}


def _stop(command, *, running, num_children, stop):
    """Start ``command``, send it ``stop`` once stderr matches ``running`` and it has
    ``num_children`` processes below it: (exit status, seconds from the signal to the exit,
    stderr, {PID: start time} of those processes)."""
    run = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's job is
    )
    try:
        stderr = _Stderr(run.stderr)
        stderr.wait_for(running)
        deadline = time.monotonic() + 30
        while len(workers := descendants(run.pid)) != num_children and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(workers) == num_children, (workers, stderr.text)
        signum = getattr(signal, stop)
        stopped = time.monotonic()
        if STOPS[stop][0]:
            os.killpg(run.pid, signum)
        else:
            run.send_signal(signum)
        returncode = run.wait(timeout=60)
        return returncode, time.monotonic() - stopped, stderr.finish(), workers
    finally:
        run.kill()


def _check_stopped(directory, stop, returncode, took, text):
    """The exit status and last line ``stop`` calls for, in time; no dataset, and after a signal
    the run can handle, no leftover at all (work directory removed, the lock file gone with its
    holder)."""
    _, status, last_line = STOPS[stop]
    assert returncode == status, text
    assert took < STOP_SECONDS, (took, text)
    if last_line is not None:
        assert text.rstrip("\n").rsplit("\n", 1)[-1].rsplit("\r", 1)[-1] == last_line, text
        assert "Traceback" not in text, text
        assert [p for p in os.listdir(directory) if "out" in p] == []
    assert not (directory / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stopped_run_ends_with_its_workers_and_leaves_no_dataset(corpora, tmp_path, stage, stop):
    corpus, vocab, sample, running, num_children, over = STAGES[stage]
    destdir = tmp_path / "out"
    command = _command(corpora / corpus, destdir, vocab=vocab, sample=sample)
    returncode, took, text, workers = _stop(
        command, running=running, num_children=num_children, stop=stop
    )
    _check_stopped(tmp_path, stop, returncode, took, text)
    assert wait_until_gone(workers, WORKERS_GONE_SECONDS) == []
    assert not re.search(over, text), "stopped after the stage it was meant to stop in"

    rerun = subprocess.run(
        _command(corpora / "tiny", destdir, vocab=60), capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p for p in os.listdir(tmp_path) if "out" in p) == ["out"]  # SIGKILL's left swept


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_a_multilingual_run_stopped_in_sentencepiece_training(corpora, tmp_path, stop):
    """--lang-pairs, the same pipeline as -s/-t: the same exit, at once, with its 2 encoding workers
    and SentencePiece's trainer process."""
    command = [
        sys.executable,
        "-m",
        "nmt_cli.preprocess",
        "--lang-pairs",
        "en-de",
        "--trainpref",
        str(corpora / "slow_spm" / "train"),
        "--destdir",
        str(tmp_path / "out"),
        "--spm-vocab-size",
        "4000",
    ]
    returncode, took, text, processes = _stop(
        command, running=r"SentencePiece sample: \d+ en sentences", num_children=3, stop=stop
    )
    _check_stopped(tmp_path, stop, returncode, took, text)
    assert wait_until_gone(processes, WORKERS_GONE_SECONDS) == []
    assert "trained SentencePiece" not in text


@pytest.mark.slow
def test_sharded_under_torchrun_every_process_ends_with_the_run(corpora, tmp_path):
    """SIGTERM to torchrun while rank 0 trains SentencePiece (rank 1 waits for the vocabulary):
    both ranks stop in one line each, their workers and the trainer with them; no part is left,
    and a shard runs again into the same directory."""
    destdir = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        *_command(corpora / "slow_spm", destdir, vocab=4000)[2:],
    ]
    # 2 ranks, each with 2 encoding workers, and rank 0's SentencePiece trainer
    returncode, took, text, processes = _stop(
        command, running=r"sample for SentencePiece[^\n]*\n", num_children=7, stop="SIGTERM"
    )
    assert returncode != 0 and took < STOP_SECONDS, (returncode, took, text)
    assert wait_until_gone(processes, WORKERS_GONE_SECONDS) == []
    assert text.count("nmt-preprocess: terminated (SIGTERM)\n") == 2, text
    assert not [name for _, _, names in os.walk(tmp_path) for name in names if "manifest" in name]

    rerun = subprocess.run(
        [*_command(corpora / "tiny", destdir, vocab=60), "--num-shards", "2", "--shard-id", "0"],
        capture_output=True,
        text=True,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert (destdir / "part-00000-of-00002" / "manifest.json").exists()
