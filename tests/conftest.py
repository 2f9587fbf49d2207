"""Small preprocessed datasets shared by the data and training tests, and the tiny trained model
shared by the eval and deploy tests (built once per session)."""

import importlib.util
import os
import pathlib
import random
import sys

import pytest

from nmt.config import PreprocessConfig
from nmt.data.preprocess import preprocess

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
