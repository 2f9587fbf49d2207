"""Curriculum: per-sample difficulty and square-root competence (numpy only).

Difficulty is any float per training pair (``length_difficulty``: the longer side). Samples are ranked by
(difficulty, index), so ties never depend on the sort algorithm or on the number of ranks.
Competence (Platanios et al. 2019, "Competence-based curriculum learning for NMT"):
``c(t) = min(1, sqrt(t * (1 - c0**2) / T + c0**2))``; at update t only the easiest c(t) fraction of
the data is eligible. The batch sampler (``nmt.data.batching``) uses these pure functions; the
sort of difficulty keys held in shards (one score file read per rank) is ``nmt.data.sample_sort``.
"""

from __future__ import annotations

import numpy as np


def length_difficulty(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """``--curriculum length``: the longer side of each pair, as float64."""
    return np.maximum(src_lengths, tgt_lengths).astype(np.float64)


def check_difficulty(difficulty: np.ndarray, *, num_samples: int) -> np.ndarray:
    """One finite float64 score per sample, or ValueError naming the first bad one."""
    difficulty = np.asarray(difficulty, dtype=np.float64)
    if difficulty.shape != (num_samples,):
        raise ValueError(
            f"difficulty has {difficulty.shape} scores, expected one per sample ({num_samples},)"
        )
    bad = np.flatnonzero(~np.isfinite(difficulty))
    if bad.size:
        raise ValueError(
            f"difficulty of sample {bad[0]} is {difficulty[bad[0]]}; scores must be finite"
        )
    return difficulty


def difficulty_fractions(difficulty: np.ndarray) -> np.ndarray:
    """(rank + 1) / N of each sample in the (difficulty, index) order: the share of data as easy or easier."""
    num_samples = difficulty.shape[0]
    # A stable sort keeps index order among equal scores, which is the tie rule everywhere.
    order = np.argsort(difficulty, kind="stable")
    fractions = np.empty(num_samples, dtype=np.float64)
    fractions[order] = np.arange(1, num_samples + 1, dtype=np.float64) / max(num_samples, 1)
    return fractions


def competence(
    update: int | np.ndarray, *, total_updates: int, initial: float = 0.01
) -> np.ndarray:
    """Square-root competence c(t) in [initial, 1]; reaches 1 at ``total_updates``."""
    t = np.asarray(update, dtype=np.float64)
    rising = np.minimum(1.0, np.sqrt(t * (1.0 - initial**2) / total_updates + initial**2))
    return np.where(t >= total_updates, 1.0, rising)  # exactly 1 from T on, whatever the round-off


def competence_update(
    fraction: np.ndarray, *, total_updates: int, initial: float = 0.01
) -> np.ndarray:
    """The first update t with c(t) >= fraction (the inverse of ``competence``), as int64."""
    fraction = np.asarray(fraction, dtype=np.float64)
    if initial >= 1.0:  # full competence from the start
        return np.zeros(fraction.shape, dtype=np.int64)
    t = np.ceil(total_updates * (fraction**2 - initial**2) / (1.0 - initial**2))
    t = np.clip(t, 0.0, total_updates).astype(np.int64)

    def reached(updates: np.ndarray) -> np.ndarray:
        return competence(updates, total_updates=total_updates, initial=initial) >= fraction

    # The closed form is exact but for round-off, which grows without bound as c0 nears 1; where
    # it missed the first update, bisect for it (c is non-decreasing and reaches 1 at T).
    wrong = ~reached(t) | ((t > 0) & reached(np.maximum(t - 1, 0)))
    if wrong.any():
        low = np.zeros(int(wrong.sum()), dtype=np.int64)
        high = np.full(low.shape, total_updates, dtype=np.int64)
        target = fraction[wrong] if fraction.ndim else fraction
        while (low < high).any():
            middle = (low + high) // 2
            ok = competence(middle, total_updates=total_updates, initial=initial) >= target
            high, low = np.where(ok, middle, high), np.where(ok, low, middle + 1)
        t[wrong] = high
    return t


def competence_schedule(
    eligible_update: np.ndarray,
    *,
    start_update: int,
    batches_per_update: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Order batches so none is used before the update at which it becomes eligible.

    ``eligible_update[b]`` is batch b's first eligible update; batches come in their base order
    (shuffled or by difficulty), which is kept among batches eligible at the same time. Each update
    takes ``batches_per_update`` slots (all ranks x accumulation steps): new batches first, and when
    no new batch is eligible yet, already used eligible batches drawn uniformly (Platanios et al.
    sample from the eligible prefix with replacement). Returns batch ids, every batch at least once,
    ending with the last new one. If nothing is eligible at ``start_update`` the easiest-scheduled
    batch is admitted anyway, so the stream never stalls.
    """
    num_batches = eligible_update.shape[0]
    if num_batches == 0:
        return np.zeros(0, dtype=np.int64)
    # Updates relative to the epoch's first one; already eligible batches all tie at 0, so they
    # keep their base order.
    ready = np.maximum(eligible_update - start_update, 0)
    order = np.argsort(ready, kind="stable")
    ready = ready[order]
    ready[0] = 0
    horizon = int(ready[-1]) + -(-num_batches // batches_per_update) + 1
    steps = np.arange(horizon)
    eligible = np.searchsorted(ready, steps, side="right")
    # placed(t) = min over s <= t of eligible(s) + (t - s) * B: the recurrence
    # placed(t) = min(eligible(t), placed(t - 1) + B) written as a running minimum.
    placed = np.minimum(
        np.minimum.accumulate(eligible - steps * batches_per_update) + steps * batches_per_update,
        (steps + 1) * batches_per_update,
    )
    new_count = np.diff(placed, prepend=0)
    last_step = int(np.searchsorted(placed, num_batches))
    slot_step = np.repeat(steps[: last_step + 1], batches_per_update)
    slot_in_step = np.tile(np.arange(batches_per_update), last_step + 1)
    is_new = slot_in_step < new_count[slot_step]
    new_ids = (placed[slot_step] - new_count[slot_step] + slot_in_step)[is_new]
    pool = placed[slot_step][~is_new]
    repeat_ids = np.floor(rng.random(pool.shape[0]) * pool).astype(np.int64)
    sequence = np.empty(slot_step.shape[0], dtype=np.int64)
    sequence[is_new] = new_ids
    sequence[~is_new] = repeat_ids
    # Drop the repeats after the last new batch: the epoch ends once everything was seen.
    sequence = sequence[: int(np.flatnonzero(is_new)[-1]) + 1]
    return order[sequence]
