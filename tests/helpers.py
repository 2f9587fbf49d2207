"""The tests' one set of helpers: a tiny corpus, a tiny dataset, a tiny model and checkpoint, and
the runners of the commands (nmt-train forked from a zygote, torchrun, a process group).

Plain functions: tests/conftest.py builds its session fixtures from them, and a test that needs its
own variant calls them with other arguments. Test files import them as ``from ..helpers import``
(``--import-mode=importlib`` keeps test folders off sys.path, but resolves ``tests`` as a package).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import io
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import FORMAT, VERSION, atomic_torch_save, bytes_to_tensor
from nmt.config import ModelConfig, PreprocessConfig, to_dict
from nmt.data.corpus import ParallelCorpus
from nmt.data.preprocess import preprocess
from nmt.data.spm import BOS_ID, PAD_ID, SPECIAL_IDS
from nmt.model import TransformerModel, build_model

# ----------------------------------------------------------------------------- a tiny corpus
# A toy language pair: word i of WORDS translates to word i of WORTE (and of MOTS), one for one.
WORDS = "the a dog cat runs sits on mat red blue big small house tree man woman child ball green old".split()
WORTE = "der die hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind ball gruen alt".split()
MOTS = "le un chien chat court assis sur tapis rouge bleu grand petit maison arbre homme femme enfant balle vert vieux".split()
MULTI_WORDS = {"en": WORDS, "de": WORTE, "fr": MOTS}
MULTI_PAIRS = "en-de,de-en,en-fr,fr-en"

# The sentences the tiny model (`tiny`) learned to translate: 2 to 9 of the first 18 words.
TINY_MODEL_WORDS = 18
TINY_MODEL_PAIRS = {"lengths": (2, 9), "num_words": TINY_MODEL_WORDS}
# The training tests' task (`tiny_data`): 2 to 14 words, the German in the reverse order.
REVERSAL_PAIRS = {"lengths": (2, 14), "reverse": True}
# The preprocessing tests' corpus: 18 words, "das" among the German ones (their expectations, e.g.
# which lines --dedup drops, were written on it).
PREPROCESS_PAIRS = {
    "num_words": 18,
    "target_words": "der die das hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind".split(),
}


def random_pairs(
    count: int,
    *,
    seed: int,
    lengths: tuple[int, int] = (3, 12),
    reverse: bool = False,
    num_words: int = len(WORDS),
    target_words: Sequence[str] = WORTE,
) -> tuple[list[str], list[str]]:
    """``count`` (English, German) sentences of ``lengths`` words drawn from the first
    ``num_words`` (German from ``target_words``); ``reverse``: the German words in the reverse
    order (a reordering task)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(count):
        picks = [rng.randrange(num_words) for _ in range(rng.randint(*lengths))]
        src.append(" ".join(WORDS[p] for p in picks))
        tgt.append(" ".join(target_words[p] for p in (reversed(picks) if reverse else picks)))
    return src, tgt


def write_corpus(
    directory: str | os.PathLike,
    name: str,
    src_lines: Sequence[str],
    tgt_lines: Sequence[str],
    *,
    src_lang: str = "en",
    tgt_lang: str = "de",
    ending: str = "\n",
) -> str:
    """``directory/name.SRC`` and ``.TGT``, one line each (no lines: an empty file); the prefix."""
    for lang, lines in ((src_lang, src_lines), (tgt_lang, tgt_lines)):
        with open(os.path.join(directory, f"{name}.{lang}"), "wb") as handle:
            handle.write("".join(line + ending for line in lines).encode("utf-8"))
    return os.path.join(directory, name)


def tiny_corpus(
    directory: str | os.PathLike, splits: dict[str, tuple[int, int]], **pair_options
) -> None:
    """``directory/NAME.en`` and ``.de`` for every ``NAME: (count, seed)`` of ``splits``, from
    ``random_pairs(count, seed=seed, **pair_options)``."""
    for name, (count, seed) in splits.items():
        write_corpus(directory, name, *random_pairs(count, seed=seed, **pair_options))


def write_multiway(directory: str | os.PathLike, name: str, count: int, seed: int) -> None:
    """``directory/name.LANG`` for en, de, fr: ``count`` aligned lines (line i of every language
    is the same sentence, word for word)."""
    rng = random.Random(seed)
    picks = [[rng.randrange(len(WORDS)) for _ in range(rng.randint(2, 9))] for _ in range(count)]
    for lang, words in MULTI_WORDS.items():
        with open(os.path.join(directory, f"{name}.{lang}"), "w", encoding="utf-8") as handle:
            handle.write("".join(" ".join(words[p] for p in line) + "\n" for line in picks))


# ----------------------------------------------------------------------------- a tiny dataset
def tiny_dataset(
    root: pathlib.Path,
    *,
    train: Sequence[str] = ("train",),
    valid: Sequence[str] = ("valid",),
    test: Sequence[str] = (),
    **overrides,
) -> str:
    """The en-de text files ``root/NAME.{en,de}`` (NAMEs per split) preprocessed into
    ``root/data`` with a 60-piece joint vocabulary (``overrides``: other PreprocessConfig
    values); its path."""
    values = dict(
        source_lang="en",
        target_lang="de",
        trainpref=[str(root / name) for name in train],
        validpref=[str(root / name) for name in valid],
        testpref=[str(root / name) for name in test],
        destdir=str(root / "data"),
        spm_vocab_size=60,
        workers=1,
    )
    values.update(overrides)
    preprocess(PreprocessConfig(**values))
    return values["destdir"]


def multiway_dataset(root: pathlib.Path) -> str:
    """A multilingual dataset (MULTI_PAIRS) from 400 multi-way lines in ``root/data``; its path."""
    for name, count, seed in (("train", 400, 0), ("valid", 20, 1), ("test", 20, 2)):
        write_multiway(root, name, count, seed)
    preprocess(
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


# ----------------------------------------------------------------------------- a tiny model
def tiny_model_config(
    vocab_size: int,
    *,
    layers: int = 2,
    dim: int = 32,
    ffn: int | None = None,
    heads: int = 4,
    **overrides,
) -> ModelConfig:
    """A transformer that builds and runs in milliseconds on 2 CPU cores: the same ``layers``,
    ``dim``, ``ffn`` (default 2 x dim) and ``heads`` on both sides, dropout 0 and no shared
    embeddings (a test that shares says so); ``overrides``: any other ModelConfig values."""
    values = dict(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_embed_dim=dim,
        decoder_embed_dim=dim,
        encoder_ffn_embed_dim=ffn or 2 * dim,
        decoder_ffn_embed_dim=ffn or 2 * dim,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        dropout=0.0,
        share_all_embeddings=False,
        share_decoder_input_output_embed=False,
    )
    values.update(overrides)
    return ModelConfig(**values)


def padded(
    rows: Sequence[Sequence[int]], *, prefix: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefix + row`` for every row, padded with PAD_ID: tokens (B, T) and lengths (B,)."""
    tensors = [
        torch.as_tensor([*prefix, *np.asarray(row).tolist()], dtype=torch.long) for row in rows
    ]
    lengths = torch.tensor([len(row) for row in tensors])
    tokens = torch.full((len(tensors), int(lengths.max())), PAD_ID, dtype=torch.long)
    for i, row in enumerate(tensors):
        tokens[i, : len(row)] = row
    return tokens, lengths


def train_tiny_model(corpus, *, vocab_size: int, num_updates: int, seed: int) -> TransformerModel:
    """A 2-layer, 64-wide model trained on ``corpus`` (items: source and target ids) by plain
    teacher forcing, batches of 32 drawn at random: a few seconds for a usable dictionary task."""
    torch.manual_seed(seed)
    model = build_model(tiny_model_config(vocab_size, dim=64, max_target_positions=64))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    for _ in range(num_updates):
        batch = rng.choice(len(corpus), size=32, replace=False)
        src, src_lengths = padded([corpus[i][0] for i in batch])
        target, tgt_lengths = padded([corpus[i][1] for i in batch])
        prev_output, _ = padded([corpus[i][1][:-1] for i in batch], prefix=[BOS_ID])
        logits = model.output_projection(model(src, src_lengths, prev_output, tgt_lengths))
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny matrices gain nothing from threads, and on a shared 2-core machine two threads per
    process oversubscribe the cores (measured: setup 93 s with 2 threads, 9 s with 1, under load)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------- a tiny checkpoint
def tiny_checkpoint(
    model: TransformerModel,
    path: str | os.PathLike,
    *,
    spm_proto: bytes,
    source_lang: str = "en",
    target_lang: str = "de",
) -> str:
    """``model`` saved at ``path`` with the fields nmt-eval reads (the trainer's checkpoint, less
    the training state), one joint SentencePiece model; the path."""
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "model_config": to_dict(model.cfg),
        "vocab": {
            "source_lang": source_lang,
            "target_lang": target_lang,
            "special_ids": dict(SPECIAL_IDS),
            "src_spm": bytes_to_tensor(spm_proto),
            "tgt_spm": bytes_to_tensor(spm_proto),
        },
    }
    atomic_torch_save(state, str(path))
    return str(path)


@dataclass
class TinySetup:
    data_dir: str
    checkpoint: str
    model: TransformerModel
    test_src: list[str]  # raw test lines
    test_tgt: list[str]


def make_tiny(root: pathlib.Path) -> TinySetup:
    """A tiny dataset (600 training pairs, a 64-piece vocabulary) and a model trained on it for a
    few seconds, as a checkpoint of ours.

    The task is word-for-word "translation" through a fixed dictionary, so even a few hundred
    updates give a model that ends its outputs with EOS at sensible lengths (a random model runs to
    the maximum length every time, which would leave the early-stopping paths of the search
    untested)."""
    splits = {"train": (600, 0), "valid": (20, 1), "test": (30, 2)}
    tiny_corpus(root, splits, **TINY_MODEL_PAIRS)
    data_dir = tiny_dataset(root, test=["test"], spm_vocab_size=64)
    with open(os.path.join(data_dir, "spm.model"), "rb") as handle:
        spm_proto = handle.read()
    corpus = ParallelCorpus(data_dir, "train")
    vocab_size = corpus.manifest.spm.src_vocab_size
    model = train_tiny_model(corpus, vocab_size=vocab_size, num_updates=300, seed=0)
    checkpoint = tiny_checkpoint(model, root / "checkpoint_best.pt", spm_proto=spm_proto)
    test_src, test_tgt = random_pairs(30, seed=2, **TINY_MODEL_PAIRS)
    return TinySetup(
        data_dir=data_dir, checkpoint=checkpoint, model=model, test_src=test_src, test_tgt=test_tgt
    )


# ----------------------------------------------------------------------------- commands
# A model small enough that a few updates take well under a second on 2 cores (nmt-train flags).
TINY_MODEL_FLAGS = (
    "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
    "--decoder-attention-heads 2 --share-all-embeddings"
).split()

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


def run_cli(main, argv, *, capsys, stdin: bytes | None = None, monkeypatch=None):
    """A command's ``main(argv)`` run in this process, ``stdin`` (bytes, with ``monkeypatch``) as
    its standard input: (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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


@contextlib.contextmanager
def process_group(command, *, timeout=300, **popen_kwargs):
    """Popen in its own session, killed whole after ``timeout`` seconds (a watchdog, so a test that
    reads the output line by line cannot hang) and on leaving: ranks hung in a collective after a
    failure never outlive the test."""
    process = subprocess.Popen(command, text=True, start_new_session=True, **popen_kwargs)

    def kill_group():
        # torchrun starts its workers in sessions of their own: kill every descendant too.
        for pid in [process.pid, *descendants(process.pid)]:
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


def descendants(pid):
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


def train_command(data_dir, save_dir, *extra):
    """nmt-train's options (after the data directory) for a few quick updates of the tiny model
    with dropout on (the invariance and resume tests prove it reproducible), then ``extra``."""
    return [
        "--save-dir",
        str(save_dir),
        "--max-tokens",
        "256",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--warmup-updates",
        "10",
        "--lr",
        "0.003",
        "--seed",
        "3",
        "--no-epoch-checkpoints",
        "--layout",
        "padded",
        *TINY_MODEL_FLAGS,
        "--dropout",
        "0.1",
        *extra,
    ]


def parse_log(stdout, kind="train"):
    """The records of ``kind`` (train: one per update) in --log-format json output."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in records if r["kind"] == kind]


def run_subprocess(args, *, torchrun_procs=None, timeout=300, env_extra=None):
    """``nmt-train *args`` (forked from the zygote, or under torchrun with ``torchrun_procs``
    ranks) as a CompletedProcess (text)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    if torchrun_procs:
        command = torchrun_command("nmt_cli.train", *args, nproc=torchrun_procs)
    else:
        return run_forked("nmt_cli.train", args, env=env, timeout=timeout)
    with process_group(
        command, timeout=timeout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


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
