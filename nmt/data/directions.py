"""Directions of a multilingual dataset as corpora, each with its target-language tag in place.

Where the tag ``<2xx>`` ("into xx") goes is the run's choice (``--lang-tok``), recorded in every
checkpoint so inference never re-specifies it:

- ``encoder`` (the default; Marian/Sockeye/fairseq ``--encoder-langtok tgt``): the source is
  ``<2xx> pieces EOS``;
- ``decoder`` (fairseq ``--decoder-langtok``): the target is ``<2xx> pieces EOS`` and the decoder
  reads ``BOS <2xx> ...``; at inference the tag is forced as the first output token.

A tag enters a sequence by id only: it is a SentencePiece control symbol, so text typed by a user
(``"<2de> hello"``) never encodes to it.
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from nmt.config import LANG_TOK_PLACEMENTS
from nmt.data.corpus import ParallelCorpus
from nmt.data.indexed import IndexedDataset
from nmt.data.manifest import Manifest
from nmt.data.spm import language_tag


def split_pair(pair: str) -> tuple[str, str]:
    src, tgt = pair.split("-")
    return src, tgt


def tag_id(manifest: Manifest, lang: str) -> int:
    tag = language_tag(lang)
    if tag not in manifest.tags:
        raise ValueError(f"{manifest.directory}: no tag {tag} in its vocabulary")
    return int(manifest.tags[tag])


class TaggedCorpus:
    """One direction: a ``ParallelCorpus`` whose samples get the target-language tag, on the
    source (``encoder``) or the target (``decoder``). Lengths count the tag."""

    def __init__(self, corpus: ParallelCorpus, *, tag: int, placement: str) -> None:
        if placement not in LANG_TOK_PLACEMENTS:
            raise ValueError(
                f"--lang-tok: must be one of {', '.join(LANG_TOK_PLACEMENTS)}, got {placement!r}"
            )
        self.corpus = corpus
        self.placement = placement
        self.tag = np.array([tag], dtype=np.int64)
        on_source = placement == "encoder"
        self.src_lengths = np.asarray(corpus.src_lengths, dtype=np.int64) + int(on_source)
        self.tgt_lengths = np.asarray(corpus.tgt_lengths, dtype=np.int64) + int(not on_source)
        self.entry = corpus.entry

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt = self.corpus[index]
        if self.placement == "encoder":
            return np.concatenate([self.tag, src]), tgt
        return src, np.concatenate([self.tag, tgt])

    @property
    def line_numbers(self) -> np.ndarray:
        return self.corpus.line_numbers


def open_directions(
    manifest: Manifest, split: str, *, placement: str, check_token_ids: bool = True
) -> dict[str, TaggedCorpus]:
    """Every direction's corpus of ``split`` (``train``, ``valid``...), in the manifest's order.

    The token files are shared between directions (one per language side): each is checked once,
    not once per direction, so opening 100 directions reads each file once.
    """
    splits = manifest.direction_splits(split)
    corpora = {
        pair: ParallelCorpus(manifest.directory, name, manifest=manifest, check_token_ids=False)
        for pair, name in splits.items()
    }
    if check_token_ids and corpora:
        sides = {
            side.prefix: side
            for corpus in corpora.values()
            for part in corpus.entry.parts
            for side in (part.src, part.tgt)
        }
        vocab = manifest.spm.src_vocab_size

        def check(prefix: str) -> None:
            ParallelCorpus._check_token_ids(
                IndexedDataset(manifest.path(prefix)), sides[prefix], vocab
            )

        with concurrent.futures.ThreadPoolExecutor(min(len(sides), os.cpu_count() or 1)) as pool:
            list(pool.map(check, sorted(sides)))
    return {
        pair: TaggedCorpus(corpus, tag=tag_id(manifest, split_pair(pair)[1]), placement=placement)
        for pair, corpus in corpora.items()
    }
