"""Small preprocessed datasets shared by the data and training tests, and the tiny trained model
shared by the eval and deploy tests (built once per session)."""

import atexit
import importlib.util
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from nmt.config import PreprocessConfig
from nmt.data.multilingual import preprocess_multilingual
from nmt.data.preprocess import preprocess

# A model small enough that a few updates take well under a second on 2 cores (nmt-train flags).
TINY_MODEL_FLAGS = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
    "--decoder-attention-heads 2 --share-all-embeddings"
).split()

WORDS = "the a dog cat runs sits on mat red blue big small house tree man woman child ball green old".split()
WORTE = "der die hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind ball gruen alt".split()


def _write(directory, name, pairs):
    for index, lang in enumerate(("en", "de")):
        with open(os.path.join(directory, f"{name}.{lang}"), "w", encoding="utf-8") as handle:
            handle.write("".join(pair[index] + "\n" for pair in pairs))


def _pairs(count, seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        picks = [rng.randrange(len(WORDS)) for _ in range(rng.randint(2, 14))]
        pairs.append(
            (" ".join(WORDS[p] for p in picks), " ".join(WORTE[p] for p in reversed(picks)))
        )
    return pairs


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A preprocessed toy corpus (reversal 'translation'), 600 training pairs, vocab ~60."""
    root = tmp_path_factory.mktemp("tiny")
    _write(root, "train", _pairs(600, seed=0))
    _write(root, "valid", _pairs(40, seed=1))
    preprocess(
        PreprocessConfig(
            source_lang="en",
            target_lang="de",
            trainpref=[str(root / "train")],
            validpref=[str(root / "valid")],
            destdir=str(root / "data"),
            spm_vocab_size=60,
            workers=1,
        )
    )
    return str(root / "data")


@pytest.fixture(scope="session")
def two_corpus_data(tmp_path_factory):
    """Two training corpora (train: 500 pairs, train1: 80 pairs) sharing one SentencePiece model."""
    root = tmp_path_factory.mktemp("two")
    _write(root, "big", _pairs(500, seed=10))
    _write(root, "small", _pairs(80, seed=11))
    _write(root, "valid", _pairs(30, seed=12))
    preprocess(
        PreprocessConfig(
            source_lang="en",
            target_lang="de",
            trainpref=[str(root / "big"), str(root / "small")],
            validpref=[str(root / "valid")],
            destdir=str(root / "data"),
            spm_vocab_size=60,
            workers=1,
        )
    )
    return str(root / "data")


def _eval_conftest():
    """tests/eval/conftest.py as a module: its tiny-model recipe is shared, not copied."""
    name = "_nmt_tests_eval_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).parent / "eval" / "conftest.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny dataset and a model trained on it (tests/eval/conftest.py), one for every eval and
    deploy test: training it takes seconds, and a checkpoint is only read by those tests."""
    eval_conftest = _eval_conftest()
    with eval_conftest.one_thread():
        return eval_conftest._make_tiny(tmp_path_factory.mktemp("tiny-model"))


# The zygote: a process that has imported nmt_cli.train (torch, torch._dynamo, nmt) once and forks a
# fresh child per run, which runs the module as `python -m` does. A training run of these tests takes
# well under a second; the imports took ~3 CPU-seconds of every one of them. The child is a process of
# its own (own session, environment, stdout/stderr, exit status, signals); only its imports are done.
# The runs that need a pid or a signal of their own (process_group) and torchrun's ranks start as
# before, so `python -m nmt_cli.train` itself stays tested from a cold start.
_ZYGOTE = """
import json, os, random, runpy, sys
import numpy
import nmt_cli.train  # noqa: F401  (the imports each run would repeat)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid:
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
        continue
    os.setsid()
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        handle = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    handle = os.open(os.devnull, os.O_RDONLY)
    os.dup2(handle, 0)
    os.close(handle)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()  # a fresh process draws its own seeds
    numpy.random.seed()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)  # exceptions and SystemExit leave as they leave `python -m`
"""


class _Zygote:
    def __init__(self):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # read once, when torch loads OpenMP
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, module, args, *, env, timeout):
        assert env.get("OMP_NUM_THREADS") == "1", "the zygote loaded OpenMP with one thread"
        command = [sys.executable, "-m", module, *args]
        with tempfile.TemporaryDirectory() as directory:
            paths = [os.path.join(directory, name) for name in ("stdout", "stderr")]
            for path in paths:
                open(path, "w").close()
            request = dict(
                module=module,
                args=[str(a) for a in args],
                env=env,
                cwd=os.getcwd(),
                stdout=paths[0],
                stderr=paths[1],
            )
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = self._read("pid")
            watchdog = threading.Timer(timeout, lambda: _kill_session(pid))
            watchdog.start()
            try:
                returncode = self._read("returncode")
            finally:
                watchdog.cancel()
                _kill_session(pid)  # what the run left behind (DataLoader workers...)
            stdout, stderr = (pathlib.Path(path).read_text(encoding="utf-8") for path in paths)
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)

    def _read(self, key):
        line = self.process.stdout.readline()
        assert line, f"the zygote exited ({self.process.poll()}); its stderr is the test's"
        return json.loads(line)[key]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def _kill_session(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_zygotes = []


def run_forked(module, args, *, env, timeout=300):
    """`python -m module *args` as a CompletedProcess (text), the child forked from the zygote."""
    if not _zygotes:
        _zygotes.append(_Zygote())
        atexit.register(_zygotes[0].close)
    return _zygotes[0].run(module, args, env=env, timeout=timeout)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(target, *args, nproc=2):
    """``torchrun`` of ``target`` (a module, or a script's path) with ``nproc`` ranks on a free port."""
    entry = [target] if target.endswith(".py") else ["-m", target]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    return [*launcher, "--master_port", str(free_port()), *entry, *args]


def run_torchrun(target, *args, nproc=2, timeout=300):
    """``torchrun_command`` run to its end, one thread per rank, its output captured as text."""
    return subprocess.run(
        torchrun_command(target, *args, nproc=nproc),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip cleanly on a machine without a CUDA device (CI has none)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# ----------------------------------------------------------------------------- multilingual
# A multi-way toy corpus: line i of every language is the same "sentence", word for word.
MOTS = "le un chien chat court assis sur tapis rouge bleu grand petit maison arbre homme femme enfant balle vert vieux".split()
MULTI_WORDS = {"en": WORDS, "de": WORTE, "fr": MOTS}
MULTI_PAIRS = "en-de,de-en,en-fr,fr-en"


def write_multiway(directory, name, count, seed):
    """``directory/name.LANG`` for en, de, fr: ``count`` aligned lines."""
    rng = random.Random(seed)
    picks = [[rng.randrange(len(WORDS)) for _ in range(rng.randint(2, 9))] for _ in range(count)]
    for lang, words in MULTI_WORDS.items():
        with open(os.path.join(directory, f"{name}.{lang}"), "w", encoding="utf-8") as handle:
            handle.write("".join(" ".join(words[p] for p in line) + "\n" for line in picks))


@pytest.fixture(scope="session")
def multi_data(tmp_path_factory):
    """A multilingual dataset (en-de, de-en, en-fr, fr-en) from 400 multi-way lines."""
    root = tmp_path_factory.mktemp("multi")
    write_multiway(root, "train", 400, seed=0)
    write_multiway(root, "valid", 20, seed=1)
    write_multiway(root, "test", 20, seed=2)
    preprocess_multilingual(
        PreprocessConfig(
            lang_pairs=MULTI_PAIRS,
            trainpref=[str(root / "train")],
            validpref=[str(root / "valid")],
            testpref=[str(root / "test")],
            destdir=str(root / "data"),
            spm_vocab_size=100,
            workers=1,
        )
    )
    return str(root / "data")


def train_multilingual(data_dir, save_dir, *extra, updates=400, check=True):
    """A tiny multilingual model (nmt-train, forked from the zygote); its completed process, which
    must have succeeded unless ``check`` is false."""
    args = [
        data_dir,
        "--save-dir",
        str(save_dir),
        "--max-tokens",
        "400",
        "--max-update",
        str(updates),
        "--lr",
        "0.01",
        "--warmup-updates",
        "20",
        "--log-format",
        "json",
        "--log-interval",
        "50",
        "--no-epoch-checkpoints",
        "--no-progress-bar",
        "--dropout",
        "0",
        *TINY_MODEL_FLAGS,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_forked("nmt_cli.train", args, env=env)
    assert result.returncode == 0 or not check, result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def multi_models(multi_data, tmp_path_factory):
    """Checkpoints of a tiny multilingual model per tag placement: {"encoder": path, "decoder": path}."""
    root = tmp_path_factory.mktemp("multi-models")
    return {
        placement: (
            train_multilingual(
                multi_data, root / placement, "--lang-tok", placement, "--validate-interval", "100"
            ),
            str(root / placement / "checkpoint_last.pt"),
        )[1]
        for placement in ("encoder", "decoder")
    }
