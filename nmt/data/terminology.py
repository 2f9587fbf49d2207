"""Terminology: target terms given inline in the source, after the reserved tag ``<term>``.

A source that asks for terms reads ``source pieces <term> term pieces <term> term pieces EOS``
(the "append constraints" style of Dinu et al. 2019 / Chen et al. 2021): no word alignment is
needed, and every decoder follows it, CTranslate2 included, because the tag is an ordinary token
of the vocabulary (a SentencePiece control symbol, so no typed text ever encodes to it).

- Training (``--term-annotation-rate R``): each epoch, a share R of the training samples get 1-2
  phrases of their own reference (whole words: 1-3 words, each starting at a ``▁`` piece) appended
  that way, so the model learns to copy them. ``--term-mask-rate M`` also replaces a share M of
  those samples' source words by ``<unk>``: a reference phrase is mostly predictable from the
  source alone, so without masking the terms add little the model has to learn to read, and it
  learns to ignore them (Ailem et al. 2021 mask the aligned source words; random words need no
  alignment). Which samples, phrases and masked words is a function of (seed, epoch, sample)
  only: any world size and any resume see the same batches.
- Inference: a ``Glossary`` (source term -> target term) finds its source terms in a sentence
  (whole words, case-sensitive) and the target terms of those found are appended the same way.

Target terms are written with the target's pieces into the source, so the vocabulary must be
joint (one SentencePiece model for both sides, nmt-preprocess's default).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nmt.data.manifest import Manifest
from nmt.data.spm import EOS_ID, TERM_TAG, UNK_ID, SentencePieceModel
from nmt.data.text import read_raw_lines

MAX_TRAINING_TERMS = 2  # phrases per annotated training sample: 1 or 2
MAX_PHRASE_WORDS = 3
# Pieces of one training phrase at most: the room batching counts per phrase (1 + this), so a
# tight cap keeps the length bound close to what is drawn (1-3 words rarely take more).
MAX_PHRASE_PIECES = 5
MAX_ADDED_TOKENS = MAX_TRAINING_TERMS * (1 + MAX_PHRASE_PIECES)  # tags included
_SALT = 0x7465726D  # "term": this module's draws apart from every other use of (seed, epoch)
_MASK = (1 << 64) - 1


def word_starts(spm: SentencePieceModel) -> np.ndarray:
    """(vocab,) bool: the pieces that begin a word (``▁`` first); never a control piece."""
    processor = spm.processor
    return np.array(
        [
            processor.id_to_piece(i).startswith("▁") and not processor.is_control(i)
            for i in range(spm.vocab_size)
        ],
        dtype=bool,
    )


def append_terms(source: np.ndarray, terms: Sequence[Sequence[int]], *, tag: int) -> np.ndarray:
    """``source`` (ids, EOS last) with ``tag`` + each term's ids inserted before its EOS."""
    if not terms:
        return source
    tag_ids = np.array([tag], dtype=source.dtype)
    parts = [source[:-1]]
    for term in terms:
        parts += [tag_ids, np.asarray(term, dtype=source.dtype)]
    return np.concatenate([*parts, source[-1:]])


def mask_words(
    source: np.ndarray, word_start: np.ndarray, rng: random.Random, *, rate: float
) -> np.ndarray:
    """``source`` (ids, EOS last) with each whole word (a ``▁`` piece and the pieces after it)
    replaced by ``<unk>`` pieces with probability ``rate``; tags before the first word and EOS
    stay."""
    if rate == 0.0:
        return source
    body = source[:-1]
    starts = np.flatnonzero(word_start[body]).tolist()
    masked = source.copy()
    for begin, end in zip(starts, [*starts[1:], body.shape[0]]):
        if rng.random() < rate:
            masked[begin:end] = UNK_ID
    return masked


def draw_phrases(
    target: np.ndarray, word_start: np.ndarray, rng: random.Random, *, wanted: int, room: int
) -> list[np.ndarray]:
    """Up to ``wanted`` non-overlapping phrases of ``target`` (ids, EOS last), each 1-3 whole words
    of at most ``MAX_PHRASE_PIECES`` pieces, whose ids plus one tag each fit in ``room`` tokens;
    fewer (or none) when the target has no such words."""
    body = target[:-1] if target.shape[0] and target[-1] == EOS_ID else target
    starts = np.flatnonzero(word_start[body]).tolist()
    if not starts:
        return []
    ends = [*starts[1:], body.shape[0]]  # word w is body[starts[w]:ends[w]]
    order = list(range(len(starts)))
    rng.shuffle(order)
    taken: list[tuple[int, int]] = []
    phrases: list[np.ndarray] = []
    for first in order:
        last = min(first + rng.randint(1, MAX_PHRASE_WORDS), len(starts)) - 1
        while last > first and ends[last] - starts[first] > MAX_PHRASE_PIECES:
            last -= 1  # fewer words rather than none
        begin, end = starts[first], ends[last]
        if (
            end - begin > MAX_PHRASE_PIECES
            or end - begin + 1 > room
            or any(begin < b_end and b_begin < end for b_begin, b_end in taken)
        ):
            continue
        taken.append((begin, end))
        phrases.append(body[begin:end])
        room -= end - begin + 1
        if len(phrases) == wanted:
            break
    return phrases


@dataclass(frozen=True)
class TermAnnotation:
    """``--term-annotation-rate``: what annotating a dataset's training samples needs."""

    rate: float
    tag: int  # the id of <term>
    word_start: np.ndarray  # (vocab,) bool
    mask_rate: float = 0.0  # share of an annotated sample's source words replaced by <unk>

    @classmethod
    def for_dataset(
        cls, manifest: Manifest, rate: float, *, mask_rate: float = 0.0
    ) -> TermAnnotation:
        """ValueError (one line naming the dataset) when its vocabulary cannot carry target terms."""
        if not manifest.spm.joint:
            raise ValueError(
                f"--term-annotation-rate: {manifest.directory} has separate source and target "
                "vocabularies; target terms go into the source, so preprocess again with one joint "
                "vocabulary (nmt-preprocess without --separate-vocab)"
            )
        spm = SentencePieceModel.load(manifest.path(manifest.spm.src_model))
        if TERM_TAG not in spm.tags:
            raise ValueError(
                f"--term-annotation-rate: {manifest.directory} has no {TERM_TAG} tag in its "
                "vocabulary (preprocessed by an older nmt); run nmt-preprocess again"
            )
        return cls(
            rate=rate, tag=spm.tags[TERM_TAG], word_start=word_starts(spm), mask_rate=mask_rate
        )

    def corpus(
        self, corpus: AnnotatedSource, *, seed: int, epoch: int, max_source_len: int | None = None
    ) -> TermAnnotatedCorpus:
        """One epoch of ``corpus`` with this annotation (``epoch``: 0-based)."""
        return TermAnnotatedCorpus(
            corpus, self, seed=seed, epoch=epoch, max_source_len=max_source_len
        )


class AnnotatedSource(Protocol):
    """What ``TermAnnotatedCorpus`` wraps (a corpus or an epoch's blend): lengths and items."""

    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]: ...


class TermAnnotatedCorpus:
    """One epoch of a dataset whose chosen samples carry 1-2 of their reference's phrases.

    Source lengths are upper bounds: batching reads lengths, not tokens, and a phrase is only
    known once the target is read. A chosen sample wanting k phrases (drawn here, from lengths
    alone) may add ``min(k (1 + MAX_PHRASE_PIECES), target length - 1 + k, max_source_len - source
    length)`` tokens; the annotation drawn always fits in that room, so no batch exceeds its
    budget. Per sample, the draws come from (seed, epoch, sample) alone.
    """

    def __init__(
        self,
        corpus: AnnotatedSource,
        annotation: TermAnnotation,
        *,
        seed: int,
        epoch: int,
        max_source_len: int | None = None,
    ) -> None:
        self.corpus = corpus
        self.annotation = annotation
        self.seed, self.epoch = seed, epoch
        src = np.asarray(corpus.src_lengths, dtype=np.int64)
        tgt = np.asarray(corpus.tgt_lengths, dtype=np.int64)
        draws = np.random.default_rng([seed, epoch, _SALT]).random(len(corpus))
        chosen = draws < annotation.rate
        # Half of the chosen samples want 2 phrases: the same draw decides, no second array.
        self.wanted = np.where(draws < annotation.rate / 2, 2, 1).astype(np.int8)  # (N,)
        room = np.minimum(self.wanted * (1 + MAX_PHRASE_PIECES), tgt - 1 + self.wanted)
        if max_source_len is not None:
            room = np.minimum(room, max_source_len - src)
        self.room = np.where(chosen & (room >= 2), room, 0)  # (N,) tokens sample i may gain
        self.src_lengths = src + self.room
        self.tgt_lengths = corpus.tgt_lengths

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt = self.corpus[index]
        room = int(self.room[index])
        if room == 0:
            return src, tgt
        # Python's generator: seeded in microseconds (numpy's takes ~100 us), the same everywhere.
        rng = random.Random(
            (_SALT << 192) | ((self.seed & _MASK) << 128) | ((self.epoch & _MASK) << 64) | index
        )
        annotation = self.annotation
        phrases = draw_phrases(
            tgt, annotation.word_start, rng, wanted=int(self.wanted[index]), room=room
        )
        if not phrases:
            return src, tgt
        src = mask_words(src, annotation.word_start, rng, rate=annotation.mask_rate)
        return append_terms(src, phrases, tag=annotation.tag), tgt


# ----------------------------------------------------------------------------- glossaries
def term_problem(source: str, target: str) -> str | None:
    """Why an entry cannot be a glossary's (empty or blank term, a line break inside), else None."""
    for side, term in (("source", source), ("target", target)):
        if not term.strip():
            return f"empty {side} term"
        if term != term.strip():
            return f"{side} term {term!r} begins or ends with a space"
        if "\n" in term or "\r" in term or "\t" in term:
            return f"{side} term {term!r} holds a tab or a line break"
    return None


class Glossary:
    """Source term -> target term, matched in a sentence as whole words (not inside a longer
    word: "cat" is not found in "cats" nor in "bobcat"), case-sensitive ("Apple" is not "apple":
    a glossary lists each casing it means). Where terms overlap, the longest wins."""

    def __init__(self, entries: Mapping[str, str], *, name: str = "glossary") -> None:
        """ValueError (one line naming ``name`` and the entry) for an entry no sentence should
        match: an empty term would be found between any two characters."""
        for source, target in entries.items():
            problem = term_problem(source, target)
            if problem is not None:
                raise ValueError(f"{name}: entry {source!r}: {problem}")
        self.entries = dict(entries)
        self.name = name
        alternatives = sorted(self.entries, key=len, reverse=True)
        self._pattern = (
            re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, alternatives)) + r")(?!\w)")
            if alternatives
            else None
        )

    def __len__(self) -> int:
        return len(self.entries)

    def matches(self, sentence: str) -> list[tuple[str, str]]:
        """(source term, target term) of each entry found in ``sentence``, in order of first
        occurrence, each once."""
        if self._pattern is None:
            return []
        found = dict.fromkeys(match.group(0) for match in self._pattern.finditer(sentence))
        return [(term, self.entries[term]) for term in found]

    @classmethod
    def read(cls, path: str) -> Glossary:
        """A TSV file: ``source term<TAB>target term`` per line (blank lines skipped); a bad line
        is a ValueError naming ``path:line``."""
        return cls(dict(_entries(read_raw_lines(path), path=path)), name=path)


def _entries(lines: Iterable[bytes], *, path: str) -> Iterable[tuple[str, str]]:
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{number}: invalid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}:{number}: expected 'source term<TAB>target term', got {len(fields)} "
                "tab-separated fields"
            )
        source, target = fields
        problem = term_problem(source, target)
        if problem is not None:
            raise ValueError(f"{path}:{number}: {problem}")
        if source in seen:
            raise ValueError(
                f"{path}:{number}: source term {source!r} is already on line {seen[source]}"
            )
        seen[source] = number
        yield source, target
