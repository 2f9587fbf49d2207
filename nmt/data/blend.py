"""Weighted blend index over several corpora: which (corpus, sample) fills each slot of an epoch.

The index for an epoch is a pure function of (sizes, weights, num_samples, seed, epoch):

1. Allocation: corpus i gets floor(w_i N) samples, plus one for the N - sum(floor) corpora with the
   largest remainders w_i N - floor(w_i N), ties to the lower corpus index (O(k log k)). These are
   exactly the final counts of the greedy loop "give the next sample to the corpus furthest below
   its target w_i N" (tests/data/test_blend.py checks this against that loop).
2. Samples of corpus i: its list L_i has n_i entries in passes of s_i: entry o = r s_i + j (pass r)
   is (a_ir j + b_ir) mod s_i, with a_ir coprime to s_i. Each pass is a permutation of the corpus
   of its own (a_ir cycles through up to 64 random multipliers, b_ir = b_i + r d_i mod s_i), so a
   corpus smaller than its allocation is repeated whole in a fresh order (each sample q or q+1
   times, copies spread evenly over the epoch) and a larger one is subsampled without replacement.
3. Order: the epoch is cut into blocks of about 2**17 slots (more for over 16k corpora). Corpus i's entries
   are spread over the blocks in proportion (stratified with a random phase), so every block holds
   each corpus in its share, within one sample. Inside a block the slots are permuted by a keyed
   bijection: one xorshift-multiply permutation of 2**17 values per epoch, xor-ed with a per-block
   key, cycle-walked into the block's size.

Why not numpy's shuffle: Fisher-Yates costs ~20 ns per element here and touches memory at random;
the steps above are a handful of vectorised passes over cache-sized blocks, need no temporaries of
size N, and every block is computed independently from O(k + blocks) parameters. That last point is
what makes the distributed build cheap: rank r computes blocks [r B/W, (r+1) B/W) and the result
does not depend on W. The permutation is deterministic and a true bijection of the slots, but it
is not uniform over all N! orders (step 2 is affine per corpus, pass and epoch).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.fileio import atomic_write

FORMAT_VERSION = 2
# Slots per block, at most, unless there are so many corpora that a block must be larger to hold
# each in proportion. The gathers of the in-block permutation then read from arrays (int32 and
# uint16) that fit a core's L2 cache: from L3 or memory they cost ~5x more per element here.
MIN_BLOCK_BITS = 17
MAX_CORPORA = np.iinfo(np.uint16).max + 1
_NUM_ROUNDS = 3
# Distinct multipliers per corpus: pass r uses number r mod this (its offset is new every pass).
MAX_PASS_MULTIPLIERS = 64
# Blocks whose pieces are computed together (one vectorised pass over blocks x corpora).
_BLOCKS_PER_CHUNK = 64

CorpusIds = np.ndarray  # (N,) uint16
SampleIds = np.ndarray  # (N,) int32, or int64 when a corpus has more than 2**31 samples


def normalize_weights(weights: Sequence[float], *, num_corpora: int) -> np.ndarray:
    """Check user weights (one per corpus, >= 0, finite, positive sum); return them summing to 1."""
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1 or array.shape[0] != num_corpora:
        raise ValueError(
            f"--subset-weights needs one weight per corpus ({num_corpora}), got {array.size}"
        )
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"--subset-weights must be finite and >= 0, got {array.tolist()}")
    total = float(array.sum())
    if total <= 0:
        raise ValueError(f"--subset-weights must not all be zero, got {array.tolist()}")
    return array / total


def weights_from_temperature(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """Weights proportional to size**(1/T), summing to 1: T=1 samples by size, large T evens out."""
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"--sampling-temperature must be > 0, got {temperature}")
    sizes_array = _check_sizes(sizes)
    if not np.any(sizes_array > 0):
        raise ValueError("every corpus in --train-subsets is empty")
    # Log space: size**(1/T) overflows float64 for small T.
    positive = sizes_array > 0
    logs = np.full(sizes_array.shape, -np.inf)
    logs[positive] = np.log(sizes_array[positive].astype(np.float64)) / temperature
    weights = np.exp(logs - logs.max())
    return weights / weights.sum()


def allocate_samples(weights: np.ndarray, num_samples: int) -> np.ndarray:
    """Largest-remainder counts (int64, summing to num_samples) for normalised weights."""
    targets = weights * num_samples
    counts = np.floor(targets).astype(np.int64)
    remainders = targets - counts  # exact in float64: a float minus its floor
    missing = num_samples - int(counts.sum())
    assert 0 <= missing <= weights.shape[0], (missing, weights.shape[0])
    # Stable sort of -remainder: equal remainders go to the lower index, as argmax would pick.
    counts[np.argsort(-remainders, kind="stable")[:missing]] += 1
    return counts


@dataclass(frozen=True)
class BlendPlan:
    """Everything needed to compute any block of one epoch's index: O(k x num_blocks) numbers."""

    sizes: np.ndarray  # (k,) int64
    counts: np.ndarray  # (k,) int64, samples per corpus this epoch
    block_counts: np.ndarray  # (num_blocks, k) int64, samples of each corpus in each block
    block_starts: np.ndarray  # (num_blocks + 1,) int64, first slot of each block
    list_starts: np.ndarray  # (num_blocks, k) int64, offset in L_i where each block begins
    multipliers: np.ndarray  # (k, R) int64, a_i(r mod R) coprime to s_i
    offsets: np.ndarray  # (k,) int64, b_i: pass r starts its permutation at b_i + r d_i
    offset_steps: np.ndarray  # (k,) int64, d_i
    base_permutation: np.ndarray  # (2**bits,) int64, bijection the blocks' orders derive from
    block_keys: np.ndarray  # (num_blocks,) int64 in [0, 2**bits), one per block
    sample_dtype: np.dtype

    @property
    def num_samples(self) -> int:
        return int(self.block_starts[-1])

    @property
    def num_blocks(self) -> int:
        return self.block_counts.shape[0]


def make_plan(
    sizes: Sequence[int], weights: Sequence[float], num_samples: int, *, seed: int, epoch: int
) -> BlendPlan:
    sizes_array = _check_sizes(sizes)
    normalized = normalize_weights(weights, num_corpora=sizes_array.shape[0])
    empty_but_weighted = np.flatnonzero((sizes_array == 0) & (normalized > 0))
    if empty_but_weighted.size:
        raise ValueError(
            f"corpora {empty_but_weighted.tolist()} are empty but have a positive --subset-weights"
        )
    if num_samples < 0:
        raise ValueError(f"--epoch-samples must be >= 0, got {num_samples}")
    if seed < 0 or epoch < 0:
        raise ValueError(f"--seed and the epoch must be >= 0, got seed={seed} epoch={epoch}")
    counts = allocate_samples(normalized, num_samples)
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, FORMAT_VERSION]))
    # Block sizes differ from the nominal size by less than 2 k (below), so nominal blocks of
    # 2**bits - 2k slots never exceed 2**bits, and with 8 k <= 2**bits the walk is short.
    num_used = int(np.count_nonzero(counts))
    max_bits = max(MIN_BLOCK_BITS, (8 * num_used - 1).bit_length())
    block_size = (1 << max_bits) - 2 * num_used
    num_blocks = max(1, -(-num_samples // block_size))
    boundaries = np.minimum(np.arange(num_blocks + 1, dtype=np.int64) * block_size, num_samples)
    # Entry j of corpus i sits at virtual slot (j + phase_i) N / n_i; a block holds the entries
    # whose virtual slot falls inside it. Cumulative counts are monotone in the boundary, so the
    # per-block counts are >= 0, and pinning both ends makes them sum to n_i exactly.
    phases = rng.random(counts.shape[0])
    rates = counts / max(num_samples, 1)
    cumulative = np.ceil(boundaries[:, None] * rates[None, :] - phases[None, :])
    cumulative = np.clip(cumulative, 0, counts[None, :]).astype(np.int64)
    cumulative[0] = 0
    cumulative[-1] = counts
    block_counts = np.diff(cumulative, axis=0)
    block_starts = np.concatenate([[0], np.cumsum(block_counts.sum(axis=1))]).astype(np.int64)
    passes = -(-counts // np.maximum(sizes_array, 1))
    num_multipliers = int(min(MAX_PASS_MULTIPLIERS, max(1, passes.max(initial=1))))
    multipliers, offsets, offset_steps = _affine_params(rng, sizes_array, num_multipliers)
    # Each term ceil(x - phase) - x lies in (-1, 1), so |block size - nominal| < 2 k.
    bits = max(1, int(block_counts.sum(axis=1).max() - 1).bit_length())
    assert bits <= max_bits, (bits, max_bits)
    base_permutation = _base_permutation(rng, bits)
    block_keys = rng.integers(0, 1 << bits, size=num_blocks, dtype=np.int64)
    fits_int32 = int(sizes_array.max(initial=0)) <= np.iinfo(np.int32).max + 1
    return BlendPlan(
        sizes=sizes_array,
        counts=counts,
        block_counts=block_counts,
        block_starts=block_starts,
        list_starts=cumulative[:-1],
        multipliers=multipliers,
        offsets=offsets,
        offset_steps=offset_steps,
        base_permutation=base_permutation,
        block_keys=block_keys,
        sample_dtype=np.dtype(np.int32 if fits_int32 else np.int64),
    )


def fill_blocks(
    plan: BlendPlan,
    corpus_out: np.ndarray,
    sample_out: np.ndarray,
    *,
    first_block: int,
    last_block: int,
    num_threads: int = 1,
) -> None:
    """Write blocks [first_block, last_block) into the outputs, which start at that block's slot."""
    origin = int(plan.block_starts[first_block])
    stops = np.linspace(first_block, last_block, num_threads + 1).round().astype(int)

    def run(start: int, stop: int) -> None:
        scratch = _BlockScratch(plan)
        for chunk_start in range(start, stop, _BLOCKS_PER_CHUNK):
            chunk_stop = min(stop, chunk_start + _BLOCKS_PER_CHUNK)
            pieces = _block_pieces(plan, scratch.sizes, chunk_start, chunk_stop)
            for block in range(chunk_start, chunk_stop):
                lo = int(plan.block_starts[block]) - origin
                hi = int(plan.block_starts[block + 1]) - origin
                block_pieces = pieces.block(block - chunk_start)
                scratch.fill(block, block_pieces, corpus_out[lo:hi], sample_out[lo:hi])

    if num_threads == 1:
        run(first_block, last_block)
        return
    # numpy drops the GIL inside each vectorised pass, so threads use several cores.
    with ThreadPoolExecutor(num_threads) as pool:
        for future in [pool.submit(run, a, b) for a, b in zip(stops[:-1], stops[1:])]:
            future.result()


def build_blend_index(
    sizes: Sequence[int],
    weights: Sequence[float],
    num_samples: int,
    *,
    seed: int,
    epoch: int,
    num_threads: int | None = None,
) -> tuple[CorpusIds, SampleIds]:
    """The epoch's (corpus_ids uint16, sample_ids int32|int64), each of length num_samples."""
    plan = make_plan(sizes, weights, num_samples, seed=seed, epoch=epoch)
    return _build_rank_part(plan, rank=0, world_size=1, num_threads=num_threads)


def _build_rank_part(
    plan: BlendPlan, *, rank: int, world_size: int, num_threads: int | None
) -> tuple[CorpusIds, SampleIds]:
    """Blocks [r B/W, (r+1) B/W) into fresh arrays: the whole index for one rank."""
    first, last = _rank_blocks(plan.num_blocks, rank=rank, world_size=world_size)
    lo, hi = int(plan.block_starts[first]), int(plan.block_starts[last])
    corpus_part, sample_part = _allocate(hi - lo, plan.sample_dtype)
    threads = _threads(num_threads, last - first)
    fill_blocks(
        plan, corpus_part, sample_part, first_block=first, last_block=last, num_threads=threads
    )
    return corpus_part, sample_part


def cache_key(
    sizes: Sequence[int], weights: Sequence[float], num_samples: int, *, seed: int, epoch: int
) -> str:
    """Hex digest naming the cache files; normalised weights, so 1,1 and 2,2 share an entry."""
    sizes_array = _check_sizes(sizes)
    normalized = normalize_weights(weights, num_corpora=sizes_array.shape[0])
    payload = json.dumps(
        {
            "version": FORMAT_VERSION,
            "min_block_bits": MIN_BLOCK_BITS,
            "sizes": sizes_array.tolist(),
            "weights": [w.hex() for w in normalized.tolist()],
            "num_samples": int(num_samples),
            "seed": int(seed),
            "epoch": int(epoch),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def cache_paths(cache_dir: str | os.PathLike, key: str) -> tuple[Path, Path]:
    directory = Path(cache_dir)
    return directory / f"blend-{key}.corpus.npy", directory / f"blend-{key}.sample.npy"


def load_or_build_blend_index(
    sizes: Sequence[int],
    weights: Sequence[float],
    num_samples: int,
    *,
    seed: int,
    epoch: int,
    cache_dir: str | os.PathLike,
    num_threads: int | None = None,
) -> tuple[CorpusIds, SampleIds]:
    """build_blend_index through an on-disk cache; a hit returns read-only memory maps."""
    key = cache_key(sizes, weights, num_samples, seed=seed, epoch=epoch)
    corpus_path, sample_path = cache_paths(cache_dir, key)
    if corpus_path.exists() and sample_path.exists():
        return _load(corpus_path, sample_path)
    corpus_ids, sample_ids = build_blend_index(
        sizes, weights, num_samples, seed=seed, epoch=epoch, num_threads=num_threads
    )
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    # Sample file first: a reader tests for the corpus file's existence last-written.
    _save_atomic(sample_path, sample_ids)
    _save_atomic(corpus_path, corpus_ids)
    return corpus_ids, sample_ids


class BlendedEpochs:
    """Index per epoch; ``get(e)`` also starts building epoch e+1 in a background thread.

    With several ranks (``world_size`` > 1, ``cache_dir`` on a file system the ranks share), each
    rank's background thread builds only its 1/W of the blocks into part files of the cache; at
    the epoch boundary ``get`` waits on ``barrier`` (called from the training thread, where
    collectives are safe) and reads every part back. A part another rank wrote where this rank
    cannot see it (a node-local disk) is built here instead. Two epochs are in memory at a boundary.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        num_samples: int,
        *,
        seed: int,
        cache_dir: str | os.PathLike | None = None,
        num_threads: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        # Fail on bad arguments now rather than inside the background thread.
        make_plan(sizes, weights, 0, seed=seed, epoch=0)
        if num_samples < 0:
            raise ValueError(f"--epoch-samples must be >= 0, got {num_samples}")
        if world_size > 1 and (cache_dir is None or barrier is None):
            raise ValueError("several ranks share a blend through cache_dir and a barrier")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self._sizes = list(sizes)
        self._weights = list(weights)
        self._num_samples = num_samples
        self._seed = seed
        self._cache_dir = cache_dir
        self._num_threads = num_threads
        self._rank, self._world_size, self._barrier = rank, world_size, barrier
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blend-prefetch")
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self.num_prefetch_hits = 0
        self.parts_built: list[tuple[int, int]] = []  # (epoch, rank) of the parts built here

    def _build(self, epoch: int) -> tuple[CorpusIds, SampleIds] | None:
        kwargs = dict(seed=self._seed, epoch=epoch, num_threads=self._num_threads)
        if self._world_size > 1:
            self._build_part(epoch, self._rank)
            return None
        if self._cache_dir is None:
            return build_blend_index(self._sizes, self._weights, self._num_samples, **kwargs)
        return load_or_build_blend_index(
            self._sizes, self._weights, self._num_samples, cache_dir=self._cache_dir, **kwargs
        )

    def _part_paths(self, epoch: int, rank: int) -> tuple[Path, Path]:
        key = cache_key(self._sizes, self._weights, self._num_samples, seed=self._seed, epoch=epoch)
        return cache_paths(self._cache_dir, f"{key}.part{rank}of{self._world_size}")

    def _build_part(self, epoch: int, rank: int) -> None:
        corpus_path, sample_path = self._part_paths(epoch, rank)
        if corpus_path.exists() and sample_path.exists():
            return
        plan = make_plan(
            self._sizes, self._weights, self._num_samples, seed=self._seed, epoch=epoch
        )
        corpus_part, sample_part = _build_rank_part(
            plan, rank=rank, world_size=self._world_size, num_threads=self._num_threads
        )
        Path(self._cache_dir).mkdir(parents=True, exist_ok=True)
        _save_atomic(sample_path, sample_part)
        _save_atomic(corpus_path, corpus_part)  # last: its presence marks a complete part
        self.parts_built.append((epoch, rank))

    def _assemble(self, epoch: int) -> tuple[CorpusIds, SampleIds]:
        self._barrier()  # every rank has written its part (or found it cached)
        parts = []
        for rank in range(self._world_size):
            corpus_path, sample_path = self._part_paths(epoch, rank)
            if not corpus_path.exists():
                self._build_part(epoch, rank)
            parts.append(_load(corpus_path, sample_path))
        return np.concatenate([c for c, _ in parts]), np.concatenate([s for _, s in parts])

    def get(self, epoch: int) -> tuple[CorpusIds, SampleIds]:
        with self._lock:
            future = self._pending.pop(epoch, None)
            # Drop prefetches for other epochs (a resume jumped): they would only hold memory.
            self._pending.clear()
        if future is not None:
            result = future.result()
            self.num_prefetch_hits += 1
        else:
            result = self._build(epoch)
        if self._world_size > 1:
            result = self._assemble(epoch)
        with self._lock:
            self._pending[epoch + 1] = self._executor.submit(self._build, epoch + 1)
        return result

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def __enter__(self) -> BlendedEpochs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_sizes(sizes: Sequence[int]) -> np.ndarray:
    sizes_array = np.asarray(sizes, dtype=np.int64)
    if sizes_array.ndim != 1 or sizes_array.shape[0] == 0:
        raise ValueError("--train-subsets needs at least one corpus")
    if sizes_array.shape[0] > MAX_CORPORA:
        raise ValueError(
            f"--train-subsets lists {sizes_array.shape[0]} corpora; at most {MAX_CORPORA} "
            "fit the uint16 corpus ids"
        )
    if np.any(sizes_array < 0):
        raise ValueError(f"corpus sizes must be >= 0, got {sizes_array.tolist()}")
    return sizes_array


def _affine_params(
    rng: np.random.Generator, sizes: np.ndarray, num_multipliers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per corpus: num_multipliers values a in [1, s) coprime to s (so a j + b mod s permutes),
    an offset b and an offset step d in [0, s)."""
    spans = np.maximum(sizes, 1)[:, None]
    offsets = rng.integers(0, spans[:, 0])
    offset_steps = rng.integers(0, spans[:, 0])
    multipliers = rng.integers(0, spans, size=(spans.shape[0], num_multipliers)) | 1
    bad = np.gcd(multipliers, spans) != 1
    # Odd values halve the retries for even sizes; about 1 draw in 2 is coprime at worst (6/pi^2
    # on average): a few rounds at most.
    while np.any(bad):
        rows, _ = np.nonzero(bad)
        multipliers[bad] = rng.integers(0, spans[rows, 0]) | 1
        bad = np.gcd(multipliers, spans) != 1
    return multipliers % spans, offsets, offset_steps


@dataclass(frozen=True)
class _Pieces:
    """A block's corpus-major layout cut into pieces: runs of one corpus within one pass.

    Slot t of a piece holds (multiplier * t + shift) mod size: its pass's permutation, advanced
    to where the piece begins (t counts from the block's first slot, so the shift absorbs the
    piece's own start)."""

    corpora: np.ndarray  # (P,) uint16
    layout_starts: np.ndarray  # (P,) int64, first slot in the block's corpus-major layout
    multipliers: np.ndarray  # (P,) int64
    shifts: np.ndarray  # (P,) int64 in [0, size)
    sizes: np.ndarray  # (P,) int64
    bounds: np.ndarray  # (blocks + 1,) int64: block b's pieces are [bounds[b], bounds[b + 1])

    def block(self, index: int) -> _Pieces:
        lo, hi = self.bounds[index], self.bounds[index + 1]
        return _Pieces(
            self.corpora[lo:hi],
            self.layout_starts[lo:hi],
            self.multipliers[lo:hi],
            self.shifts[lo:hi],
            self.sizes[lo:hi],
            self.bounds[index : index + 2] - lo,
        )


def _block_pieces(plan: BlendPlan, sizes: np.ndarray, first_block: int, last_block: int) -> _Pieces:
    """The pieces of blocks [first_block, last_block), block after block, in one vectorised pass:
    per block, a dozen numpy calls on k-sized arrays held the GIL long enough to stall the other
    threads."""
    counts = plan.block_counts[first_block:last_block]
    blocks, used = np.nonzero(counts)  # row-major: block after block, corpora in order
    list_starts = plan.list_starts[first_block:last_block][blocks, used]
    list_stops = list_starts + counts[blocks, used]
    spans = sizes[used]
    first_pass, last_pass = list_starts // spans, (list_stops - 1) // spans
    pieces_per_run = last_pass - first_pass + 1
    owner = np.repeat(np.arange(used.shape[0]), pieces_per_run)  # the (block, corpus) run
    run_firsts = np.cumsum(pieces_per_run) - pieces_per_run
    passes = first_pass[owner] + (np.arange(owner.shape[0]) - run_firsts[owner])
    spans = spans[owner]
    pass_starts = passes * spans
    starts = np.maximum(list_starts[owner], pass_starts)
    lengths = np.minimum(list_stops[owner], pass_starts + spans) - starts
    # Blocks' pieces are consecutive and fill their block exactly, so the running total minus the
    # block's own start is the position inside the block.
    block_origins = plan.block_starts[first_block:last_block] - plan.block_starts[first_block]
    layout_starts = np.cumsum(lengths) - lengths - block_origins[blocks[owner]]
    corpora = used[owner]
    multipliers = plan.multipliers[corpora, passes % plan.multipliers.shape[1]]
    pass_offsets = plan.offsets[corpora] + _mulmod(
        passes % spans, plan.offset_steps[corpora], spans
    )
    # Entry j of the pass sits at slot t = layout_start + (j - (start - pass_start)) of the block.
    first_entries = (starts - pass_starts - layout_starts) % spans
    shifts = (_mulmod(multipliers, first_entries, spans) + pass_offsets) % spans
    piece_bounds = np.searchsorted(blocks[owner], np.arange(last_block - first_block + 1))
    return _Pieces(
        corpora=corpora.astype(np.uint16),
        layout_starts=layout_starts,
        multipliers=multipliers,
        shifts=shifts,
        sizes=spans,
        bounds=piece_bounds,
    )


class _BlockScratch:
    """One thread's buffers for filling blocks, each of a block's size at most.

    Every pass writes into these (``out=``): fresh temporaries of a block's size went through
    malloc's trim and mmap thresholds, and the page faults that followed tripled the cost per
    slot at 1B samples on our VMs (19 vs 7 ns).
    """

    def __init__(self, plan: BlendPlan) -> None:
        capacity = plan.base_permutation.shape[0]
        self.plan = plan
        self.sizes = np.maximum(plan.sizes, 1)  # empty corpora get no entries; 1 avoids % 0
        self.positions = np.arange(capacity, dtype=np.int64)
        self.segment = np.empty(capacity, dtype=np.intp)
        self.segment16 = np.empty(capacity, dtype=np.uint16)
        self.layout = np.empty(capacity, dtype=np.int64)
        self.per_slot = np.empty(capacity, dtype=np.int64)
        self.order = np.empty(capacity, dtype=np.intp)
        self.outside = np.empty(capacity, dtype=bool)
        narrow = plan.sample_dtype != np.int64
        self.layout_narrow = np.empty(capacity, dtype=plan.sample_dtype) if narrow else None

    def fill(
        self, block: int, pieces: _Pieces, corpus_out: np.ndarray, sample_out: np.ndarray
    ) -> None:
        num_slots = corpus_out.shape[0]
        if num_slots == 0:
            return
        plan = self.plan
        segment = self.segment[:num_slots]  # the piece of each corpus-major slot
        segment.fill(0)
        # Piece p > 0 starts where the running count of starts reaches p.
        np.add.at(segment, pieces.layout_starts[1:], 1)
        np.cumsum(segment, out=segment)
        layout, per_slot = self.layout[:num_slots], self.per_slot[:num_slots]
        np.take(pieces.multipliers, segment, out=layout)
        layout *= self.positions[:num_slots]
        layout += np.take(pieces.shifts, segment, out=per_slot)
        np.remainder(layout, np.take(pieces.sizes, segment, out=per_slot), out=layout)
        order = self._walk(int(plan.block_keys[block]), num_slots)
        corpus_of_slot = np.take(pieces.corpora, segment, out=self.segment16[:num_slots])
        np.take(corpus_of_slot, order, out=corpus_out)
        if self.layout_narrow is not None:
            narrow = self.layout_narrow[:num_slots]
            np.copyto(narrow, layout, casting="unsafe")  # samples < 2**31 here: exact
            layout = narrow
        np.take(layout, order, out=sample_out)

    def _walk(self, key: int, num_slots: int) -> np.ndarray:
        order = self.order[:num_slots]
        _walk(self.plan.base_permutation, key, num_slots, out=order, scratch=self.outside)
        return order


def _mulmod(a: np.ndarray, b: np.ndarray, modulus: np.ndarray) -> np.ndarray:
    """(a * b) % modulus for operands below modulus; Python ints when int64 could overflow."""
    if int(modulus.max(initial=0)) <= 2**31:
        return (a * b) % modulus
    return np.array([x * y % m for x, y, m in zip(a.tolist(), b.tolist(), modulus.tolist())])


def _walk(
    base: np.ndarray,
    key: int,
    num_slots: int,
    *,
    out: np.ndarray | None = None,
    scratch: np.ndarray | None = None,
) -> np.ndarray:
    """The block's bijection of [0, num_slots): y -> base[y] ^ key (a bijection of [0, 2**bits)),
    re-applied to the few values that land at or past num_slots (cycle walking)."""
    values = np.bitwise_xor(base[:num_slots], key, out=out)
    beyond = np.greater_equal(
        values, num_slots, out=None if scratch is None else scratch[:num_slots]
    )
    outside = np.flatnonzero(beyond)
    while outside.size:
        walked = base[values[outside]] ^ key
        values[outside] = walked
        outside = outside[walked >= num_slots]
    return values


def _base_permutation(rng: np.random.Generator, bits: int) -> np.ndarray:
    """A keyed bijection of [0, 2**bits) (int64): rounds of add, times odd, xor with own high bits,
    each a bijection mod 2**bits. Computed once per epoch; blocks reuse it xor-ed with their key."""
    mask = np.uint64((1 << bits) - 1)
    shift = np.uint64(max(1, bits // 2))
    values = np.arange(1 << bits, dtype=np.uint64)
    for addend, multiplier in rng.integers(0, 2**63, size=(_NUM_ROUNDS, 2), dtype=np.uint64):
        values += addend
        values *= multiplier | np.uint64(1)
        values &= mask
        values ^= values >> shift
    return values.view(np.int64)


def _threads(num_threads: int | None, num_blocks: int) -> int:
    wanted = (os.cpu_count() or 1) if num_threads is None else num_threads
    if wanted < 1:
        raise ValueError(f"num_threads must be >= 1, got {wanted}")
    return max(1, min(wanted, num_blocks))


def _rank_blocks(num_blocks: int, *, rank: int, world_size: int) -> tuple[int, int]:
    return num_blocks * rank // world_size, num_blocks * (rank + 1) // world_size


def _allocate(num_samples: int, sample_dtype: np.dtype) -> tuple[CorpusIds, SampleIds]:
    # zeros, not empty: numpy asks for huge pages on large np.empty arrays, and faulting those in
    # was 30x slower than calloc's pages on our VMs (1 s vs 0.03 s per 200 MB).
    return np.zeros(num_samples, dtype=np.uint16), np.zeros(num_samples, dtype=sample_dtype)


def _save_atomic(path: Path, array: np.ndarray) -> None:
    with atomic_write(str(path), tag=f"-{threading.get_ident()}") as handle:
        np.save(handle, array)


def _load(corpus_path: Path, sample_path: Path) -> tuple[CorpusIds, SampleIds]:
    return np.load(corpus_path, mmap_mode="r"), np.load(sample_path, mmap_mode="r")


class BlendedCorpus:
    """One epoch's blend as a dataset: slot i is sample ``sample_ids[i]`` of corpus ``corpus_ids[i]``.

    Exposes what the sampler and trainer need from a ``ParallelCorpus`` (item access and length
    arrays), so blending feeds the same batching, curriculum and packing as a single corpus.
    """

    def __init__(self, corpora: Sequence, corpus_ids: CorpusIds, sample_ids: SampleIds) -> None:
        self.corpora = list(corpora)
        self.corpus_ids = corpus_ids
        self.sample_ids = sample_ids
        starts = np.zeros(len(self.corpora), dtype=np.int64)
        np.cumsum([len(c) for c in self.corpora[:-1]], out=starts[1:])
        self.flat_ids = starts[corpus_ids] + sample_ids  # (N,) position in the concatenated corpora
        self.src_lengths = np.concatenate([np.asarray(c.src_lengths) for c in self.corpora])[
            self.flat_ids
        ]
        self.tgt_lengths = np.concatenate([np.asarray(c.tgt_lengths) for c in self.corpora])[
            self.flat_ids
        ]

    def __len__(self) -> int:
        return int(self.corpus_ids.shape[0])

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.corpora[int(self.corpus_ids[index])][int(self.sample_ids[index])]

    def per_corpus_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(samples, source + target tokens) per corpus in this epoch."""
        k = len(self.corpora)
        tokens = self.src_lengths.astype(np.float64) + self.tgt_lengths
        samples = np.bincount(self.corpus_ids, minlength=k)
        return samples, np.bincount(self.corpus_ids, weights=tokens, minlength=k).astype(np.int64)
