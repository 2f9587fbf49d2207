"""Packing (padding removed) and balanced micro-batches.

A packed side is one sequence of all samples' tokens, shape (N, ...), plus ``cu_seqlens`` (B + 1,)
int32 (sample b is ``tokens[cu[b]:cu[b+1]]``, the layout of varlen attention kernels) and
``positions`` (N,) restarting at 0 in every sample (``nmt.model.unpack`` restores the padded
(B, T, ...) layout from the lengths alone).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from nmt import dist


def cu_seqlens_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """(B,) lengths -> (B + 1,) int32 offsets starting at 0."""
    cu = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    return cu


def positions_from_lengths(lengths: np.ndarray, *, total: int | None = None) -> np.ndarray:
    """(N,) int64 position ids restarting at 0 per sample; ``total`` > sum(lengths) appends zeros
    (padding)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    num_real = int(lengths.sum())
    total = num_real if total is None else total
    starts = np.cumsum(lengths) - lengths
    positions = np.zeros(total, dtype=np.int64)
    positions[:num_real] = np.arange(num_real) - np.repeat(starts, lengths)
    return positions


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Capped first-fit decreasing: bins whose sums stay <= capacity (at most 11/9 OPT + 6/9 bins)."""
    loads: list[int] = []
    bins: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable").tolist():
        fits = np.flatnonzero(np.asarray(loads, dtype=np.int64) + lengths[i] <= capacity)
        if fits.size:
            loads[fits[0]] += int(lengths[i])
            bins[fits[0]].append(i)
        else:
            loads.append(int(lengths[i]))
            bins.append([i])
    return bins


def karmarkar_karp(lengths: np.ndarray, num_parts: int) -> list[list[int]]:
    """Largest differencing method for ``num_parts`` parts: repeatedly merge the two partial
    solutions with the largest spread, pairing the heaviest part of one with the lightest of the other."""
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for i in np.argsort(-lengths, kind="stable").tolist():
        parts = [(int(lengths[i]), [i])] + [(0, []) for _ in range(num_parts - 1)]
        # (negated spread, insertion counter for a deterministic tie-break, parts heaviest first)
        heap.append((-int(lengths[i]), len(heap), parts))
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged.sort(key=lambda part: -part[0])
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], counter, merged))
        counter += 1
    return [part[1] for part in heap[0][2]] if heap else [[] for _ in range(num_parts)]


def repair_capacity(parts: list[list[int]], lengths: np.ndarray, capacity: int) -> bool:
    """Move (or else swap) items out of parts over ``capacity`` into parts with room; in place.

    Each move or swap lowers an overfull part without filling another past the cap, so the loop
    ends; returns False when no move or swap helps (the caller then falls back to first fit).
    """
    loads = np.array([int(lengths[p].sum()) for p in parts], dtype=np.int64)
    while loads.max(initial=0) > capacity:
        over = int(np.argmax(loads))
        if not _move_or_swap(parts, loads, lengths, over, capacity):
            return False
    return True


def _move_or_swap(
    parts: list[list[int]], loads: np.ndarray, lengths: np.ndarray, over: int, capacity: int
) -> bool:
    others = [q for q in np.argsort(loads, kind="stable").tolist() if q != over]
    for item in sorted(parts[over], key=lambda i: -lengths[i]):
        for q in others:
            if loads[q] + lengths[item] <= capacity:
                parts[over].remove(item)
                parts[q].append(item)
                loads[over] -= lengths[item]
                loads[q] += lengths[item]
                return True
    for item in parts[over]:
        for q in others:
            for other in parts[q]:
                if (
                    lengths[other] < lengths[item]
                    and loads[q] - lengths[other] + lengths[item] <= capacity
                ):
                    parts[over][parts[over].index(item)] = other
                    parts[q][parts[q].index(other)] = item
                    delta = lengths[item] - lengths[other]
                    loads[over] -= delta
                    loads[q] += delta
                    return True
    return False


def partition_microbatches(
    lengths: np.ndarray | Sequence[int], max_tokens: int, *, min_partitions: int | None = None
) -> list[np.ndarray]:
    """Split samples into the fewest micro-batches whose packed token sums stay <= ``max_tokens``,
    balanced with Karmarkar-Karp.

    ``lengths``: packed tokens per sample (for source and target, pass the larger side per sample,
    which caps both). The count is max(capped first-fit count, ceil(sum / max_tokens),
    ``min_partitions``), then the MAX over ranks (all-reduce) so all ranks step together; a rank
    with fewer samples than the count gets empty micro-batches (zero weight). Karmarkar-Karp
    balances but may break the cap; overfull parts are repaired by moves and swaps, and in the rare
    case that fails the first-fit bins are used, so the cap always holds. Each micro-batch lists
    its indices ascending; micro-batches are ordered by their first index (empty ones last), and
    ``restore_order`` undoes the permutation.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    bad = np.flatnonzero((lengths > max_tokens) | (lengths < 0))
    if bad.size:
        raise ValueError(
            f"sample {bad[0]} has {lengths[bad[0]]} tokens; must be in [0, max_tokens={max_tokens}]"
        )
    fallback = first_fit_decreasing(lengths, max_tokens)
    count = max(len(fallback), -(-int(lengths.sum()) // max_tokens), min_partitions or 1)
    count = dist.all_reduce_max_int(count)
    parts = karmarkar_karp(lengths, count)
    if not repair_capacity(parts, lengths, max_tokens):
        parts = fallback + [[] for _ in range(count - len(fallback))]
    result = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    result.sort(key=lambda p: (p.shape[0] == 0, int(p[0]) if p.shape[0] else 0))
    return result


def restore_order(partitions: Sequence[np.ndarray]) -> np.ndarray:
    """Permutation p such that ``concatenated_outputs[p]`` is in the original sample order."""
    flat = (
        np.concatenate([np.asarray(p, dtype=np.int64) for p in partitions])
        if partitions
        else np.zeros(0, np.int64)
    )
    inverse = np.empty_like(flat)
    inverse[flat] = np.arange(flat.shape[0])
    return inverse
