"""A dataset's directions as corpora, each direction's tag in place (``nmt.languages`` says which
tag, on which side). A dataset of one untagged direction opens as its plain corpora."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from nmt.data.corpus import ParallelCorpus
from nmt.data.indexed import IndexedDataset
from nmt.data.manifest import Manifest
from nmt.data.subsets import open_subset
from nmt.languages import BILINGUAL, Direction, Languages, Pair


class TaggedCorpus:
    """One direction: a ``ParallelCorpus`` whose samples carry how the direction is asked for (its
    tag on the source, or first on the target). Lengths count the tag."""

    def __init__(self, corpus: ParallelCorpus, *, direction: Direction) -> None:
        self.corpus = corpus
        self.src_prefix = np.asarray(direction.source_prefix, dtype=np.int64)
        self.tgt_prefix = np.asarray(direction.target_prefix, dtype=np.int64)
        self.src_lengths = np.asarray(corpus.src_lengths, dtype=np.int64) + len(self.src_prefix)
        self.tgt_lengths = np.asarray(corpus.tgt_lengths, dtype=np.int64) + len(self.tgt_prefix)
        self.entry = corpus.entry

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt = self.corpus[index]
        return np.concatenate([self.src_prefix, src]), np.concatenate([self.tgt_prefix, tgt])

    @property
    def line_numbers(self) -> np.ndarray:
        return self.corpus.line_numbers


def _check_tags(manifest: Manifest, languages: Languages) -> None:
    missing = [tag for tag in languages.target_tags().values() if tag not in languages.tags]
    if missing:
        raise ValueError(f"{manifest.directory}: no tag {missing[0]} in its vocabulary")


def open_directions(
    manifest: Manifest, split: str, *, placement: str, check_token_ids: bool = True
) -> dict[str, ParallelCorpus | TaggedCorpus]:
    """Every direction's corpus of ``split`` (``train``, ``valid``...), in the manifest's order
    (none where it has no such split), each direction's tag where ``placement`` says. On a dataset of
    one untagged direction, ``DIR/SPLIT`` is the split of another dataset (``nmt.data.subsets``).

    The token files are shared between directions (one per language side): each is checked once,
    not once per direction, so opening 100 directions reads each file once.
    """
    languages = manifest.languages(placement)
    _check_tags(manifest, languages)
    splits = manifest.direction_splits(split)
    if not splits and not languages.tagged and "/" in split:
        return {languages.pairs[0]: open_subset(manifest, split)}
    corpora = {
        pair: ParallelCorpus(manifest.directory, name, manifest=manifest, check_token_ids=False)
        for pair, name in splits.items()
    }
    if check_token_ids and corpora:
        # A --separate-vocab dataset's two sides have vocabularies of their own sizes.
        sides = {
            side.prefix: (side, vocab)
            for corpus in corpora.values()
            for part in corpus.entry.parts
            for side, vocab in (
                (part.src, manifest.spm.src_vocab_size),
                (part.tgt, manifest.spm.tgt_vocab_size),
            )
        }

        def check(prefix: str) -> None:
            side, vocab = sides[prefix]
            ParallelCorpus._check_token_ids(IndexedDataset(manifest.path(prefix)), side, vocab)

        with concurrent.futures.ThreadPoolExecutor(min(len(sides), os.cpu_count() or 1)) as pool:
            list(pool.map(check, sorted(sides)))
    return {pair: _tagged(corpus, languages, pair) for pair, corpus in corpora.items()}


def _tagged(
    corpus: ParallelCorpus, languages: Languages, pair: str
) -> ParallelCorpus | TaggedCorpus:
    """``corpus`` as its direction is asked for: itself when that takes no tag (lazy, unchanged)."""
    wanted = Pair.parse(pair, codes=False)
    direction = languages.direction(wanted.source, wanted.target)
    if direction == BILINGUAL:
        return corpus
    return TaggedCorpus(corpus, direction=direction)
