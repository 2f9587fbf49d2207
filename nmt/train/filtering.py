"""Filtering by dual conditional cross-entropy (Junczys-Dowmunt 2018): a pair (x, y) scores
``|H_f(y|x) - H_r(x|y)| + (H_f(y|x) + H_r(x|y)) / 2``, the cross-entropies per token of a
forward and a reverse model; low is good (both models find the pair likely, and agree).

The scores come from the distributed scorer of ``--curriculum model:`` (each rank scores its
share of fixed chunks, so they do not depend on the number of ranks); the kept pairs become a
dataset of their own, and the scores a file ``--curriculum file:`` reads.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from nmt.config import FilterConfig, to_dict
from nmt.data.corpus import ParallelCorpus
from nmt.data.derived import TrainSplitWriter, write_derived_dataset
from nmt.data.difficulty import all_scores
from nmt.data.manifest import Manifest, SplitEntry, load_manifest
from nmt.fileio import (
    Destination,
    atomic_write,
    check_destination,
    exclusive_lock,
    lock_path_beside,
)
from nmt.train.difficulty import checkpoint_scorer

FILTER_REASON = "dual_conditional_cross_entropy"
BLOCK = 1 << 16  # pairs copied at a time into the filtered dataset


def dual_conditional_cross_entropy(forward: np.ndarray, reverse: np.ndarray) -> np.ndarray:
    """(N,) scores from the per-token cross-entropies (N,) of the two directions; lower is better."""
    return np.abs(forward - reverse) + 0.5 * (forward + reverse)


def kept_indices(
    scores: np.ndarray, *, keep_fraction: float | None, threshold: float | None
) -> np.ndarray:
    """The samples kept, in dataset order: the lowest ``keep_fraction`` (ties by index), or those
    scoring at most ``threshold``."""
    if keep_fraction is not None:
        count = math.ceil(keep_fraction * len(scores))
        return np.sort(np.argsort(scores, kind="stable")[:count])
    assert threshold is not None
    return np.flatnonzero(scores <= threshold)


def distribution(scores: np.ndarray, *, bins: int = 10) -> str:
    """Quantiles and a text histogram of the scores."""
    quantiles = np.quantile(scores, [0, 0.1, 0.25, 0.5, 0.75, 0.9, 1])
    names = ("min", "10%", "25%", "50%", "75%", "90%", "max")
    lines = ["  ".join(f"{n} {q:.3f}" for n, q in zip(names, quantiles))]
    counts, edges = np.histogram(scores, bins=bins)
    widest = max(int(counts.max()), 1)
    for count, lo, hi in zip(counts, edges[:-1], edges[1:]):
        lines.append(f"  [{lo:7.3f}, {hi:7.3f})  {'#' * round(40 * count / widest):<40} {count}")
    return "\n".join(lines)


@dataclass
class FilterResult:
    scores: np.ndarray  # (N,) per sample of the split
    forward: np.ndarray  # (N,) H_f(y|x)
    reverse: np.ndarray  # (N,) H_r(x|y)
    kept: np.ndarray | None  # indices kept (None: scores only)
    manifest: Manifest | None  # the filtered dataset (rank 0)


def score_pairs(
    cfg: FilterConfig,
    corpus: ParallelCorpus,
    *,
    device: torch.device,
    rank: int,
    world_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token cross-entropy of each pair under the forward and the reverse model."""
    manifest = corpus.manifest
    # Both loaded before scoring: a bad --reverse is said at once, not after the forward pass.
    scorers = [
        (
            option,
            path,
            checkpoint_scorer(
                path, manifest=manifest, device=device, option=f"{option} {path}", reverse=reverse
            ),
        )
        for option, path, reverse in (
            ("--forward", cfg.forward, False),
            ("--reverse", cfg.reverse, True),
        )
    ]
    results = []
    for option, path, scorer in scorers:
        scores = all_scores(
            [corpus], scorer, rank=rank, world_size=world_size, desc=f"score ({option[2:]})"
        )
        if not np.isfinite(scores).all():
            raise ValueError(f"{option} {path}: the model gave a non-finite score")
        results.append(scores)
    return results[0], results[1]


def filter_dataset(
    cfg: FilterConfig, *, device: torch.device, rank: int = 0, world_size: int = 1
) -> FilterResult:
    source = load_manifest(cfg.data_dir)
    corpus = ParallelCorpus(cfg.data_dir, cfg.split, manifest=source)
    target = None
    if cfg.destdir is not None:
        target = Destination(
            os.path.abspath(cfg.destdir),
            option="--destdir",
            replace_flag="--overwrite",
            made_by="nmt-filter",
            replace=cfg.overwrite,
            inputs=[
                ("DATA_DIR", cfg.data_dir),
                ("--forward", cfg.forward),
                ("--reverse", cfg.reverse),
            ]
            + ([("--scores", cfg.scores)] if cfg.scores else []),
        )
        check_destination(target)  # before hours of scoring
    forward, reverse = score_pairs(cfg, corpus, device=device, rank=rank, world_size=world_size)
    scores = dual_conditional_cross_entropy(forward, reverse)
    kept = (
        None
        if target is None
        else kept_indices(scores, keep_fraction=cfg.keep_fraction, threshold=cfg.threshold)
    )
    manifest = None
    if rank == 0:
        if cfg.scores is not None:
            with atomic_write(cfg.scores, "w", encoding="utf-8") as handle:
                handle.writelines(f"{score:.6f}\n" for score in scores)
        if target is not None:
            assert kept is not None
            with exclusive_lock(lock_path_beside(target.path), what=f"--destdir {target.path}"):
                manifest = _write_kept(cfg, source, corpus, kept, target)
    return FilterResult(scores, forward, reverse, kept, manifest)


def _write_kept(
    cfg: FilterConfig,
    source: Manifest,
    corpus: ParallelCorpus,
    kept: np.ndarray,
    target: Destination,
) -> Manifest:
    entry = source.split(cfg.split)
    line_numbers = np.asarray(corpus.line_numbers)

    def fill(writer: TrainSplitWriter) -> SplitEntry:
        for start in range(0, len(kept), BLOCK):
            block = kept[start : start + BLOCK]
            writer.add(
                [corpus.src[int(i)] for i in block],
                [corpus.tgt[int(i)] for i in block],
                line_numbers[block],
            )
        return writer.finish(
            num_lines=entry.num_lines,
            input_prefix=os.path.abspath(source.directory),
            filtered={**entry.filtered, FILTER_REASON: len(corpus) - len(kept)},
        )

    settings = {k: v for k, v in to_dict(cfg).items() if k not in ("destdir", "scores", "device")}
    return write_derived_dataset(
        source,
        target,
        langs=(source.source_lang, source.target_lang),
        fill=fill,
        config={**source.config, "filter": settings},
    )
