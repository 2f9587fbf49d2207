"""A tiny preprocessed dataset and a tiny model trained on it for a few seconds, as a checkpoint of ours.

The task is word-for-word "translation" through a fixed dictionary, so even a few hundred updates
give a model that ends its outputs with EOS at sensible lengths (a random model runs to the maximum
length every time, which would leave the early-stopping paths of the search untested).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import FORMAT, VERSION, atomic_torch_save, bytes_to_tensor
from nmt.config import ModelConfig, PreprocessConfig, to_dict
from nmt.data.corpus import ParallelCorpus
from nmt.data.preprocess import preprocess
from nmt.data.spm import BOS_ID, PAD_ID, SPECIAL_IDS
from nmt.model import TransformerModel, build_model

WORDS = "the a dog cat runs sits on mat red blue big small house tree man woman child ball".split()
WORTE = "der die hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind ball".split()


def random_pairs(count: int, *, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(count):
        picks = [rng.randrange(len(WORDS)) for _ in range(rng.randint(2, 9))]
        src.append(" ".join(WORDS[p] for p in picks))
        tgt.append(" ".join(WORTE[p] for p in picks))
    return src, tgt


def tiny_model_config(*, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        encoder_layers=2,
        decoder_layers=2,
        encoder_embed_dim=64,
        decoder_embed_dim=64,
        encoder_ffn_embed_dim=128,
        decoder_ffn_embed_dim=128,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        dropout=0.0,
        max_target_positions=64,
        share_all_embeddings=False,
        share_decoder_input_output_embed=False,
    )


def checkpoint_state(model: TransformerModel, *, spm_proto: bytes) -> dict:
    """What the trainer writes, less the training state (the fields nmt-eval reads)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "model_config": to_dict(model.cfg),
        "vocab": {
            "source_lang": "en",
            "target_lang": "de",
            "special_ids": dict(SPECIAL_IDS),
            "src_spm": bytes_to_tensor(spm_proto),
            "tgt_spm": bytes_to_tensor(spm_proto),
        },
    }


def _padded(rows: list[np.ndarray], *, prefix: list[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [
        np.concatenate([np.asarray(prefix, dtype=np.int64), row.astype(np.int64)]) for row in rows
    ]
    lengths = torch.tensor([len(row) for row in rows])
    tokens = torch.full((len(rows), int(lengths.max())), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.from_numpy(row)
    return tokens, lengths


def train_tiny_model(
    corpus: ParallelCorpus, *, vocab_size: int, num_updates: int, seed: int
) -> TransformerModel:
    torch.manual_seed(seed)
    model = build_model(tiny_model_config(vocab_size=vocab_size))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    for _ in range(num_updates):
        batch = rng.choice(len(corpus), size=32, replace=False)
        src, src_lengths = _padded([corpus[i][0] for i in batch])
        target, tgt_lengths = _padded([corpus[i][1] for i in batch])
        prev_output, _ = _padded([corpus[i][1][:-1] for i in batch], prefix=[BOS_ID])
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


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@dataclass
class TinySetup:
    data_dir: str
    checkpoint: str
    model: TransformerModel
    test_src: list[str]  # raw test lines
    test_tgt: list[str]


# The session fixture `tiny` (a TinySetup from _make_tiny) is in tests/conftest.py: the deploy tests
# share the same model.


def _make_tiny(root: pathlib.Path) -> TinySetup:
    prefixes = {}
    for name, count, seed in (("train", 600, 0), ("valid", 20, 1), ("test", 30, 2)):
        src, tgt = random_pairs(count, seed=seed)
        for lang, lines in (("en", src), ("de", tgt)):
            with open(root / f"{name}.{lang}", "w", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
        prefixes[name] = str(root / name)
    data_dir = str(root / "data")
    preprocess(
        PreprocessConfig(
            source_lang="en",
            target_lang="de",
            destdir=data_dir,
            trainpref=[prefixes["train"]],
            validpref=[prefixes["valid"]],
            testpref=[prefixes["test"]],
            spm_vocab_size=64,
            workers=1,
        )
    )
    with open(os.path.join(data_dir, "spm.model"), "rb") as handle:
        spm_proto = handle.read()
    corpus = ParallelCorpus(data_dir, "train")
    vocab_size = corpus.manifest.spm.src_vocab_size
    model = train_tiny_model(corpus, vocab_size=vocab_size, num_updates=300, seed=0)
    checkpoint = str(root / "checkpoint_best.pt")
    atomic_torch_save(checkpoint_state(model, spm_proto=spm_proto), checkpoint)
    test_src, test_tgt = random_pairs(30, seed=2)
    return TinySetup(
        data_dir=data_dir, checkpoint=checkpoint, model=model, test_src=test_src, test_tgt=test_tgt
    )
