"""A distributed sample sort: keys held in shards, one per rank, sorted globally over a process
group, so a curriculum order is the same whatever the number of ranks (``nmt.data.difficulty``)."""

from __future__ import annotations

import numpy as np
import torch

from nmt import dist


def lexsort_rows(rows: np.ndarray) -> np.ndarray:
    """Order of the rows of a (n, k) array, lexicographic with column 0 most significant.

    Successive stable argsorts from the last column: about twice as fast as ``np.lexsort`` on
    float columns (numpy's lexsort is a slow generic merge sort).
    """
    order = np.argsort(rows[:, -1], kind="stable")
    for column in range(rows.shape[1] - 2, -1, -1):
        order = order[np.argsort(rows[order, column], kind="stable")]
    return order


def _as_rows(keys: np.ndarray | torch.Tensor) -> np.ndarray:
    rows = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    if rows.ndim == 1:
        rows = rows[:, None]
    if rows.ndim != 2:
        raise ValueError(f"keys must have shape (n,) or (n, k), got {tuple(rows.shape)}")
    if rows.dtype.kind == "f" and np.isnan(rows).any():
        raise ValueError(
            f"keys contain NaN at row {int(np.flatnonzero(np.isnan(rows).any(axis=1))[0])}"
        )
    return rows


def distributed_sample_sort(
    keys: np.ndarray | torch.Tensor, group: object = None, *, samples_per_rank: int = 4096
) -> np.ndarray | torch.Tensor:
    """Sort keys spread over ranks; return this rank's contiguous slice of the global order.

    ``keys`` is this rank's shard, shape (n,) or (n, k) (rows compared lexicographically, column 0
    first). For a stable curriculum order pass rows (difficulty, global index): rows are then
    unique, so the order is the single-process order whatever the number of ranks, and heavy
    duplicates of a difficulty are still split evenly. Concatenating the slices of ranks
    0..W-1 gives the sorted union of all shards. Shards may be empty; all ranks must use the same
    dtype and k. Returns the type it was given (numpy array or CPU tensor) with the input's ndim.

    Algorithm (sample sort): each rank sends ``samples_per_rank`` evenly spaced rows; the
    all-gathered samples give W - 1 splitters; each rank buckets its rows by the splitters
    (vectorised lexicographic compares), an all-to-all-v sends bucket r to rank r, and each rank
    sorts what it got.
    """
    rows = _as_rows(keys)
    world_size = dist.world_size_in(group)
    if world_size > 1:
        rows = _exchange_by_splitters(
            rows, group=group, world_size=world_size, samples_per_rank=samples_per_rank
        )
    elif rows.shape[0]:
        rows = rows[lexsort_rows(rows)]
    if np.ndim(keys) == 1:
        rows = rows[:, 0]
    return torch.from_numpy(np.ascontiguousarray(rows)) if isinstance(keys, torch.Tensor) else rows


def lex_greater_equal(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Row-wise ``row >= query`` in lexicographic order, vectorised over rows: (n,) bool."""
    result = rows[:, -1] >= query[-1]
    for column in range(rows.shape[1] - 2, -1, -1):
        result = (rows[:, column] > query[column]) | ((rows[:, column] == query[column]) & result)
    return result


def _exchange_by_splitters(
    rows: np.ndarray, *, group: object, world_size: int, samples_per_rank: int
) -> np.ndarray:
    num_rows, width = rows.shape
    # Evenly spaced picks from the unsorted shard: the splitters only steer balance, never the
    # result, so skipping a local sort here halves the sorting work.
    picks = np.minimum(
        (np.arange(samples_per_rank) + 0.5) * num_rows / samples_per_rank, num_rows - 1
    )
    samples = (
        rows[picks.astype(np.int64)]
        if num_rows
        else np.zeros((samples_per_rank, width), dtype=rows.dtype)
    )
    gathered = dist.all_gather_equal(torch.from_numpy(np.ascontiguousarray(samples)), group=group)
    counts = dist.all_gather_equal(torch.tensor([min(num_rows, samples_per_rank)]), group=group)
    pool = np.concatenate([g.numpy()[: int(c)] for g, c in zip(gathered, counts)])
    if pool.shape[0] == 0:  # every shard is empty
        return rows
    pool = pool[lexsort_rows(pool)]
    splitters = pool[(np.arange(1, world_size) * pool.shape[0]) // world_size]
    destination = np.zeros(num_rows, dtype=np.int64)
    for splitter in splitters:
        destination += lex_greater_equal(rows, splitter)
    by_destination = np.argsort(destination, kind="stable")
    send_counts = np.bincount(destination, minlength=world_size).tolist()
    send = torch.from_numpy(np.ascontiguousarray(rows[by_destination]))
    received = dist.all_to_all_v(send, send_counts, group=group).numpy().reshape(-1, width)
    return received[lexsort_rows(received)] if received.shape[0] else received
