"""The session fixtures: small preprocessed datasets shared by the data and training tests, and the
tiny trained model shared by the eval and deploy tests, each built once from tests/helpers.py."""

import pytest

from .helpers import (
    REVERSAL_PAIRS,
    make_tiny,
    multiway_dataset,
    one_thread,
    random_pairs,
    tiny_corpus,
    tiny_dataset,
    train_multilingual,
    write_corpus,
)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A preprocessed toy corpus (reversal 'translation'), 600 training pairs, vocab ~60."""
    root = tmp_path_factory.mktemp("tiny")
    tiny_corpus(root, {"train": (600, 0), "valid": (40, 1)}, **REVERSAL_PAIRS)
    return tiny_dataset(root)


@pytest.fixture(scope="session")
def two_corpus_data(tmp_path_factory):
    """Two training corpora (train: 500 pairs, train1: 80 pairs) sharing one SentencePiece model."""
    root = tmp_path_factory.mktemp("two")
    tiny_corpus(root, {"big": (500, 10), "small": (80, 11), "valid": (30, 12)}, **REVERSAL_PAIRS)
    return tiny_dataset(root, train=["big", "small"])


@pytest.fixture(scope="session")
def long_valid_data(tmp_path_factory):
    """200 training pairs and 10 validation pairs, the 4th of them 200 words long on each side
    (longer than the positions the tests give the model)."""
    root = tmp_path_factory.mktemp("long-valid")
    tiny_corpus(root, {"train": (200, 1)}, **REVERSAL_PAIRS)
    src, tgt = random_pairs(10, seed=2, **REVERSAL_PAIRS)
    src[3], tgt[3] = " ".join(["dog"] * 200), " ".join(["hund"] * 200)
    write_corpus(root, "valid", src, tgt)
    return tiny_dataset(root)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny dataset and a model trained on it (helpers.make_tiny), one for every eval and deploy
    test: training it takes seconds, and a checkpoint is only read by those tests."""
    with one_thread():
        return make_tiny(tmp_path_factory.mktemp("tiny-model"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip cleanly on a machine without a CUDA device (CI has none)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def multi_data(tmp_path_factory):
    """A multilingual dataset (en-de, de-en, en-fr, fr-en) from 400 multi-way lines."""
    return multiway_dataset(tmp_path_factory.mktemp("multi"))


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
