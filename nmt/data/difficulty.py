"""The difficulty of every training pair for a curriculum: its length, a score file, or a model's loss.

Difficulties are per sample of each corpus, concatenated in corpus order; the data plan maps them
through an epoch's blend, so a score always follows its pair (never a blend slot).

``model:CHECKPOINT`` scores are computed in training: the corpora are cut into chunks aligned the
same way for any number of ranks, rank r scores its share of the chunks, and the distributed sample
sort ranks all scores globally (ties by sample index), so the order does not depend on the number
of ranks. The result is cached next to the dataset (or in the run's directory when the dataset is
read-only).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from nmt import dist
from nmt.config import DataConfig
from nmt.data.collate import Sample
from nmt.data.corpus import ParallelCorpus
from nmt.data.curriculum import length_difficulty
from nmt.data.sample_sort import distributed_sample_sort
from nmt.fileio import atomic_write

logger = logging.getLogger(__name__)

# Scores a list of training pairs (higher: harder); must depend on each pair alone.
DifficultyScorer = Callable[[Sequence[Sample]], np.ndarray]
SCORE_CHUNK = 512  # pairs scored together: chunks are aligned globally, so no score depends on W


def corpus_difficulty(
    cfg: DataConfig,
    corpora: Sequence[ParallelCorpus],
    *,
    scorer: DifficultyScorer | None,
    rank: int,
    world_size: int,
    cache_dir: str | None,
) -> np.ndarray | None:
    """One difficulty per sample of the corpora, in corpus order (concatenated); None without a curriculum."""
    spec = cfg.curriculum_spec
    if spec is None:
        return None
    if spec.kind == "length":
        return np.concatenate([length_difficulty(c.src_lengths, c.tgt_lengths) for c in corpora])
    if spec.kind == "file":
        return np.concatenate(
            [read_scores(path, corpus) for path, corpus in zip(spec.paths, corpora)]
        )
    if scorer is None:
        raise ValueError(
            f"--curriculum {cfg.curriculum}: no model scorer was given to the data plan"
        )
    checkpoint = spec.checkpoint
    cache_name = f"model-{_cache_key(checkpoint, corpora)}.npy"
    candidates = [os.path.join(cfg.data_dir, "difficulty", cache_name)]
    if cache_dir is not None:
        candidates.append(os.path.join(cache_dir, "difficulty", cache_name))
    found = dist.broadcast_object(next((p for p in candidates if os.path.isfile(p)), None))
    if found is not None:
        logger.info("difficulty of %d pairs read from %s", sum(len(c) for c in corpora), found)
        return np.load(found, mmap_mode="r")
    difficulty = model_difficulty(checkpoint, corpora, scorer, rank=rank, world_size=world_size)
    if rank == 0:
        _write_cache(candidates, difficulty)
    return difficulty


def model_difficulty(
    checkpoint: str,
    corpora: Sequence[ParallelCorpus],
    scorer: DifficultyScorer,
    *,
    rank: int,
    world_size: int,
) -> np.ndarray:
    """Each pair's rank (0 = easiest) by the scores of ``scorer``, this rank scoring its chunks."""
    total = sum(len(c) for c in corpora)
    lo, scores = score_share(
        corpora, scorer, rank=rank, world_size=world_size, desc=f"score ({checkpoint})"
    )
    hi = lo + len(scores)
    if not np.isfinite(scores).all():
        raise ValueError(f"--curriculum model:{checkpoint}: the model gave a non-finite score")
    rows = np.stack([scores, np.arange(lo, hi, dtype=np.float64)], axis=1)  # (n, 2): ties by index
    mine = distributed_sample_sort(rows)[:, 1].astype(np.int64)
    order = np.concatenate(
        [part.numpy() for part in dist.all_gather_variable(torch.from_numpy(mine))]
    )
    difficulty = np.empty(total, dtype=np.float64)
    difficulty[order] = np.arange(total, dtype=np.float64)
    return difficulty


def score_share(
    corpora: Sequence[ParallelCorpus],
    scorer: DifficultyScorer,
    *,
    rank: int,
    world_size: int,
    desc: str,
) -> tuple[int, np.ndarray]:
    """This rank's scores: (its first sample, in corpus order, concatenated; the scores of its
    consecutive chunks). Rank r's share follows rank r-1's, so the shares in rank order are all scores."""
    starts = np.cumsum([0] + [len(c) for c in corpora])
    total = int(starts[-1])
    num_chunks = -(-total // SCORE_CHUNK)
    first, last = rank * num_chunks // world_size, (rank + 1) * num_chunks // world_size
    lo, hi = min(first * SCORE_CHUNK, total), min(last * SCORE_CHUNK, total)
    scores = np.empty(hi - lo, dtype=np.float64)
    with tqdm(total=hi - lo, unit="pair", desc=desc, mininterval=2.0, disable=rank != 0) as bar:
        for start in range(lo, hi, SCORE_CHUNK):
            stop = min(start + SCORE_CHUNK, hi)
            samples = []
            for index in range(start, stop):
                corpus = int(np.searchsorted(starts, index, side="right")) - 1
                samples.append(corpora[corpus][index - int(starts[corpus])])
            scores[start - lo : stop - lo] = scorer(samples)
            bar.update(stop - start)
    return lo, scores


def all_scores(
    corpora: Sequence[ParallelCorpus],
    scorer: DifficultyScorer,
    *,
    rank: int,
    world_size: int,
    desc: str,
) -> np.ndarray:
    """Every sample's score, on every rank, each rank scoring its share (``score_share``)."""
    _, mine = score_share(corpora, scorer, rank=rank, world_size=world_size, desc=desc)
    return np.concatenate(
        [part.numpy() for part in dist.all_gather_variable(torch.from_numpy(mine))]
    )


def _cache_key(checkpoint: str, corpora: Sequence[ParallelCorpus]) -> str:
    digest = hashlib.sha256()
    try:
        with open(checkpoint, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as error:
        raise ValueError(
            f"--curriculum model:{checkpoint}: cannot read the checkpoint ({error.strerror})"
        ) from None
    for corpus in corpora:
        digest.update(corpus.split.encode())
        for part in corpus.entry.parts:
            for side in (part.src, part.tgt):
                checksums = corpus.manifest.checksums  # a DIR/SPLIT corpus: its own dataset's
                digest.update(checksums.get(side.prefix + ".bin", side.prefix).encode())
    return digest.hexdigest()[:20]


def _write_cache(candidates: list[str], difficulty: np.ndarray) -> None:
    for path in candidates:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with atomic_write(path) as handle:
                np.save(handle, difficulty)
            logger.info("difficulty cached in %s", path)
            return
        except OSError as error:
            logger.warning("cannot cache the difficulty in %s (%s)", path, error)


def read_scores(path: str, corpus: ParallelCorpus) -> np.ndarray:
    """``--curriculum file:PATH``: one float per raw training line (or per kept pair), aligned to
    the corpus's samples."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--curriculum: cannot read {path}: {error}") from None
    if lines and lines[-1] == "":
        lines.pop()
    scores = np.empty(len(lines), dtype=np.float64)
    for number, line in enumerate(lines, start=1):
        try:
            scores[number - 1] = float(line)
        except ValueError:
            raise ValueError(
                f"{path}:{number}: not a number: {line[:40]!r} (--curriculum)"
            ) from None
    if not np.isfinite(scores).all():
        raise ValueError(
            f"{path}:{int(np.flatnonzero(~np.isfinite(scores))[0]) + 1}: score is not finite (--curriculum)"
        )
    num_lines = corpus.entry.num_lines
    if scores.shape[0] == num_lines:
        return scores[np.asarray(corpus.line_numbers)]
    if scores.shape[0] == len(corpus):
        return scores
    raise ValueError(
        f"{path}: {scores.shape[0]} scores, expected one per training line ({num_lines}) "
        f"or per kept pair ({len(corpus)}) of split {corpus.split!r}"
    )
