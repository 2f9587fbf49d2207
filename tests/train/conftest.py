import contextlib
import glob
import json
import os
import signal
import random
import subprocess
import sys
import threading

import pytest

from nmt.config import PreprocessConfig
from nmt.data.preprocess import preprocess

WORDS = "the a dog cat runs sits on mat red blue big small house tree man woman child ball green old".split()
WORTE = "der die hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind ball gruen alt".split()

# A model small enough that a few updates take well under a second on 2 cores.
TINY_MODEL_FLAGS = [
    "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--share-all-embeddings",
]


def _write(directory, name, pairs):
    for index, lang in enumerate(("en", "de")):
        with open(os.path.join(directory, f"{name}.{lang}"), "w", encoding="utf-8") as handle:
            handle.write("".join(pair[index] + "\n" for pair in pairs))


def _pairs(count, seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        picks = [rng.randrange(len(WORDS)) for _ in range(rng.randint(2, 14))]
        pairs.append((" ".join(WORDS[p] for p in picks), " ".join(WORTE[p] for p in reversed(picks))))
    return pairs


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A preprocessed toy corpus (reversal 'translation'), 600 training pairs, vocab ~60."""
    root = tmp_path_factory.mktemp("tiny")
    _write(root, "train", _pairs(600, seed=0))
    _write(root, "valid", _pairs(40, seed=1))
    preprocess(
        PreprocessConfig(
            source_lang="en", target_lang="de", trainpref=[str(root / "train")], validpref=[str(root / "valid")],
            destdir=str(root / "data"), spm_vocab_size=60, workers=1,
        )
    )
    return str(root / "data")


def train_command(data_dir, save_dir, *extra):
    return [
        "--save-dir", str(save_dir), "--max-tokens", "256", "--log-format", "json", "--log-interval", "1",
        "--warmup-updates", "10", "--lr", "0.003", "--seed", "3", "--no-epoch-checkpoints", *TINY_MODEL_FLAGS, *extra,
    ]


def parse_log(stdout):
    """Per-update training records from --log-format json output."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in records if r["kind"] == "train"]


def run_subprocess(args, *, torchrun_procs=None, timeout=300, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    if torchrun_procs:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(torchrun_procs),
                   "--master_port", str(_free_port()), "-m", "nmt_cli.train", *args]
    else:
        command = [sys.executable, "-m", "nmt_cli.train", *args]
    with process_group(command, timeout=timeout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@contextlib.contextmanager
def process_group(command, *, timeout=300, **popen_kwargs):
    """Popen in its own session, killed whole after ``timeout`` seconds (a watchdog, so a test that
    reads the output line by line cannot hang) and on leaving: ranks hung in a collective after a
    failure never outlive the test."""
    process = subprocess.Popen(command, text=True, start_new_session=True, **popen_kwargs)

    def kill_group():
        # torchrun starts its workers in sessions of their own: kill every descendant too.
        for pid in [process.pid, *_descendants(process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        kill_group()
        process.wait()


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def two_corpus_data(tmp_path_factory):
    """Two training corpora (train: 500 pairs, train1: 80 pairs) sharing one SentencePiece model."""
    root = tmp_path_factory.mktemp("two")
    _write(root, "big", _pairs(500, seed=10))
    _write(root, "small", _pairs(80, seed=11))
    _write(root, "valid", _pairs(30, seed=12))
    preprocess(
        PreprocessConfig(
            source_lang="en", target_lang="de", trainpref=[str(root / "big"), str(root / "small")],
            validpref=[str(root / "valid")], destdir=str(root / "data"), spm_vocab_size=60, workers=1,
        )
    )
    return str(root / "data")


def _descendants(pid):
    """Every process below ``pid``, read from /proc."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return found
