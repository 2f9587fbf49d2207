"""Raw parallel text -> SentencePiece ids -> filtered, memory-mapped dataset with a manifest, streamed.

Memory does not grow with the corpus: text is read in chunks of ``CHUNK_LINES`` aligned lines,
encoded on worker processes (at most two chunks per worker in flight) and appended to the token
and index files as the chunks come back, in order. The chunking never depends on ``--workers``,
so the output is byte-identical for any worker count. SentencePiece is trained on a reservoir
sample of the training text taken in one streaming pass.

The output directory appears only when complete: everything is written into a hidden temporary
sibling directory that is renamed into place at the end, under a lock on the destination held for
the whole run, so an interrupted or failed run leaves no dataset that looks finished and two runs
never write one directory.

Sharded (``--num-shards N --shard-id i``, or one shard per rank under ``torchrun``): each run
encodes the lines ``[i*L/N, (i+1)*L/N)`` of every training corpus into ``DESTDIR/part-i-of-N``,
a complete dataset of its own; the run that completes the last part writes ``DESTDIR/manifest.json``,
which reads the parts as one corpus, in the original line order, without copying them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gzip
import hashlib
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from nmt.config import PreprocessConfig, option_name, to_dict
from nmt.data.dedup import HashSet64
from nmt.data.indexed import IndexedWriter
from nmt.data.manifest import (
    MANIFEST_NAME,
    Manifest,
    PartEntry,
    SideEntry,
    SplitEntry,
    SpmEntry,
    load_manifest,
    sha256_files,
)
from nmt.data.spm import (
    SPECIAL_IDS,
    UNK_ID,
    SentencePieceModel,
    reserved_tags,
    token_dtype,
    train_model,
)
from nmt.data.text import (
    DataError,
    count_lines,
    decode_lines,
    iter_parallel_chunks,
    line_count_mismatch,
    resolve_text_file,
)
from nmt.fileio import (
    Destination,
    check_apart,
    check_destination,
    describe_os_error,
    exclusive_lock,
    install_directory,
    lock_path_beside,
    mark_directory,
    open_for_writing,
    write_all,
)
from nmt.provenance import defaults, differences, identity
from nmt.workers import die_with_parent, signals_deferred

logger = logging.getLogger(__name__)

# Order matters: a pair is counted under the first reason that applies.
FILTER_REASONS = ("invalid_utf8", "blank_line", "too_short", "too_long", "length_ratio")
DUPLICATE = "duplicate"  # --dedup: counted after the filters, among the pairs they kept
KEEP = -1
# Lines per unit of work. Fixed (never derived from --workers or the shard count): chunk boundaries
# decide the reservoir sample's random draws, so they must be the same in every run.
CHUNK_LINES = 20_000
# A lost rank is noticed by torchrun itself; this only bounds how long ranks wait for rank 0's vocabulary.
VOCABULARY_WAIT_MINUTES = 24 * 60


def filter_codes(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    invalid: np.ndarray,
    *,
    min_len: int,
    max_len: int,
    max_len_ratio: float,
) -> np.ndarray:
    """Per pair: ``KEEP`` or the index into ``FILTER_REASONS`` of the first reason that applies.

    Lengths count stored tokens (pieces + EOS), so ``max_len`` bounds what the model sees;
    a side with no pieces (length 1, EOS only) is a blank line; ``min_len`` counts pieces.
    """
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    conditions = (
        np.asarray(invalid, dtype=bool),
        (src <= 1) | (tgt <= 1),
        (src - 1 < min_len) | (tgt - 1 < min_len),
        (src > max_len) | (tgt > max_len),
        np.maximum(src, tgt) > max_len_ratio * np.minimum(src, tgt),
    )
    codes = np.full(src.shape[0], KEEP, dtype=np.int8)
    for reason_index in reversed(range(len(conditions))):
        codes[conditions[reason_index]] = reason_index
    return codes


# ----------------------------------------------------------------------------- encoding one chunk
@dataclass(frozen=True)
class EncodeOptions:
    """What a worker needs to encode a chunk of one split (models by path: loaded once per process)."""

    role: str  # train | valid | test
    src_path: str
    tgt_path: str
    src_model: str
    tgt_model: str
    src_dtype: str
    tgt_dtype: str
    skip_invalid: bool
    min_len: int
    max_len: int
    max_len_ratio: float
    dedup: bool
    num_threads: int = 1  # SentencePiece's own threads (the in-process mode)
    monolingual: bool = False  # --only-source: the target is the source (encoded once)


@dataclass
class EncodedChunk:
    first_line: int
    num_lines: int
    src_tokens: np.ndarray  # (S,) kept pairs' source ids, EOS after each
    src_lengths: np.ndarray  # (K,)
    tgt_tokens: np.ndarray
    tgt_lengths: np.ndarray
    line_numbers: np.ndarray  # (K,) raw line of each kept pair
    filtered: np.ndarray  # (len(FILTER_REASONS),) pairs dropped per reason
    replaced_invalid: int  # valid/test lines repaired (U+FFFD) under --skip-invalid
    pair_hashes: np.ndarray | None  # (K,) uint64, with --dedup
    reference: bytes | None  # valid/test: the target lines as decoded, each ending in "\n"


_LOADED_MODELS: dict[str, SentencePieceModel] = {}


def _model(path: str) -> SentencePieceModel:
    if path not in _LOADED_MODELS:
        _LOADED_MODELS[path] = SentencePieceModel.load(path)
    return _LOADED_MODELS[path]


def pair_hashes(src_lines: list[bytes], tgt_lines: list[bytes]) -> np.ndarray:
    """64-bit hash of each raw pair (lines never contain "\\n", so it separates the sides unambiguously)."""
    digests = b"".join(
        hashlib.blake2b(s + b"\n" + t, digest_size=8).digest() for s, t in zip(src_lines, tgt_lines)
    )
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def encode_chunk(
    options: EncodeOptions, first_line: int, src_lines: list[bytes], tgt_lines: list[bytes]
) -> EncodedChunk:
    """Decode, encode and (training splits) filter one chunk of aligned lines."""
    num_lines = len(src_lines)
    src = decode_lines(
        src_lines,
        path=options.src_path,
        replace_invalid=options.skip_invalid,
        first_line=first_line,
    )
    tgt = (
        src
        if options.monolingual
        else decode_lines(
            tgt_lines,
            path=options.tgt_path,
            replace_invalid=options.skip_invalid,
            first_line=first_line,
        )
    )
    invalid = np.zeros(num_lines, dtype=bool)
    invalid[src.invalid] = True
    invalid[tgt.invalid] = True
    src_tokens, src_lengths = _model(options.src_model).encode_with_eos(
        src.lines, dtype=np.dtype(options.src_dtype), num_threads=options.num_threads
    )
    tgt_tokens, tgt_lengths = (
        (src_tokens, src_lengths)
        if options.monolingual
        else _model(options.tgt_model).encode_with_eos(
            tgt.lines, dtype=np.dtype(options.tgt_dtype), num_threads=options.num_threads
        )
    )
    filtered = np.zeros(len(FILTER_REASONS), dtype=np.int64)
    if options.role != "train":  # valid and test keep every line, repaired if need be
        return EncodedChunk(
            first_line=first_line,
            num_lines=num_lines,
            src_tokens=src_tokens,
            src_lengths=src_lengths,
            tgt_tokens=tgt_tokens,
            tgt_lengths=tgt_lengths,
            line_numbers=np.arange(first_line, first_line + num_lines, dtype=np.int64),
            filtered=filtered,
            replaced_invalid=int(invalid.sum()),
            pair_hashes=None,
            reference="".join(line + "\n" for line in tgt.lines).encode("utf-8"),
        )
    codes = filter_codes(
        src_lengths,
        tgt_lengths,
        invalid,
        min_len=options.min_len,
        max_len=options.max_len,
        max_len_ratio=options.max_len_ratio,
    )
    filtered += np.bincount(codes[codes != KEEP], minlength=len(FILTER_REASONS))
    keep = codes == KEEP
    kept = np.flatnonzero(keep)
    hashes = (
        pair_hashes([src_lines[i] for i in kept], [tgt_lines[i] for i in kept])
        if options.dedup
        else None
    )
    return EncodedChunk(
        first_line=first_line,
        num_lines=num_lines,
        src_tokens=src_tokens[np.repeat(keep, src_lengths)],
        src_lengths=src_lengths[keep],
        tgt_tokens=tgt_tokens[np.repeat(keep, tgt_lengths)],
        tgt_lengths=tgt_lengths[keep],
        line_numbers=first_line + kept.astype(np.int64),
        filtered=filtered,
        replaced_invalid=0,
        pair_hashes=hashes,
        reference=None,
    )


class EncodePool:
    """Encodes chunks in order, on ``workers`` processes or in a background thread (``--encoder``).

    ``processes`` (the default): forked workers do all of a chunk's work (decoding, SentencePiece,
    filtering, hashing) with one thread each; this process reads and writes. ``threads``: one
    background thread encodes a chunk with SentencePiece's own ``workers`` threads (they release the
    GIL) while this thread reads the next chunk and writes the previous one; the rest of a chunk's
    work stays on one core. ``benchmarks/preprocess.py`` compares them: on 2 cores, 2M pairs,
    processes were 1.27x and 1.73x faster at load 2-4 (46,800 against 36,800 pairs/s); only on a
    machine loaded 7-9 were threads faster. At most two chunks per executor slot are in flight:
    memory stays bounded however fast the text is read.
    """

    def __init__(self, workers: int, *, kind: str = "processes") -> None:
        self.workers = workers
        self.kind = kind
        self._executor: concurrent.futures.Executor
        if kind == "processes" and workers > 1:
            # Forked now (the first task forks them all), before this process has any other thread or a lock file open.
            self._executor = concurrent.futures.ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("fork"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
            self._executor.submit(os.getpid).result()
            self._slots, self._threads_per_chunk = workers, 1
        else:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="encode")
            self._slots, self._threads_per_chunk = 1, workers if kind == "threads" else 1

    def map(
        self, options: EncodeOptions, chunks: Iterable[tuple[int, list[bytes], list[bytes]]]
    ) -> Iterator[EncodedChunk]:
        options = EncodeOptions(**{**vars(options), "num_threads": self._threads_per_chunk})
        pending: collections.deque[concurrent.futures.Future[EncodedChunk]] = collections.deque()
        try:
            for first_line, src_lines, tgt_lines in chunks:
                pending.append(
                    self._executor.submit(encode_chunk, options, first_line, src_lines, tgt_lines)
                )
                if len(pending) >= 2 * self._slots:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise OSError("an encoding worker process died (killed, or out of memory)") from None
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- SentencePiece sample
class Reservoir:
    """A uniform sample of ``size`` items from a stream of unknown length (Algorithm R), in one pass.

    The random draws are vectorised per offered batch; they depend only on ``seed`` and the batch
    sizes, which are fixed chunks, so the sample is the same in every run. ``sample()`` returns the
    items in stream order.
    """

    def __init__(self, size: int, *, seed: int | list[int]) -> None:
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.items: list[str] = []
        self.positions: list[int] = []  # stream position of each item
        self.seen = 0

    def offer(self, items: list[str]) -> None:
        fill = min(len(items), self.size - len(self.items))
        self.items.extend(items[:fill])
        self.positions.extend(range(self.seen, self.seen + fill))
        if fill < len(items):
            positions = np.arange(self.seen + fill, self.seen + len(items), dtype=np.int64)
            slots = self.rng.integers(
                0, positions + 1
            )  # item at position p replaces slot j < size with prob size/(p+1)
            for index in np.flatnonzero(slots < self.size):
                slot = int(slots[index])
                self.items[slot] = items[fill + int(index)]
                self.positions[slot] = int(positions[index])
        self.seen += len(items)

    def sample(self) -> list[str]:
        order = np.argsort(np.asarray(self.positions, dtype=np.int64), kind="stable")
        return [self.items[i] for i in order]


@dataclass
class SplitPlan:
    name: str
    role: str  # train | valid | test
    prefix: str
    src_path: str
    tgt_path: str


def split_names(role: str, prefixes: list[str]) -> list[str]:
    """fairseq's naming: train, train1, train2, ... (valid, valid1, ...)."""
    return [role if k == 0 else f"{role}{k}" for k in range(len(prefixes))]


def make_plans(
    cfg: PreprocessConfig, *, roles: tuple[str, ...] = ("train", "valid", "test")
) -> list[SplitPlan]:
    """Every input file resolved before anything is read or written (a missing file fails first)."""
    plans = []
    for role, prefixes in (
        ("train", cfg.trainpref),
        ("valid", cfg.validpref),
        ("test", cfg.testpref),
    ):
        for name, prefix in zip(split_names(role, prefixes), prefixes):
            src_path, tgt_path = (resolve_text_file(prefix, lang) for lang in cfg.languages)
            if role in roles:
                plans.append(
                    SplitPlan(
                        name=name, role=role, prefix=prefix, src_path=src_path, tgt_path=tgt_path
                    )
                )
    return plans


def sample_training_text(
    cfg: PreprocessConfig, plans: list[SplitPlan]
) -> tuple[list[str], list[str] | None]:
    """Reservoir samples of the training sentences in one streaming pass over every training corpus:
    one joint sample of both sides, or (``--separate-vocab``) one per side. Blank lines and pairs
    with invalid UTF-8 (under ``--skip-invalid``) are left out; without it, invalid UTF-8 fails here."""
    reservoirs = [
        Reservoir(cfg.spm_sample_size, seed=[cfg.seed, side])
        for side in range(2 if cfg.separate_vocab else 1)
    ]
    with tqdm(
        unit="pairs", desc="sample for SentencePiece", dynamic_ncols=True, mininterval=1.0
    ) as progress:
        for plan in plans:
            if plan.role != "train":
                continue
            for first_line, src_raw, tgt_raw in iter_parallel_chunks(
                plan.src_path, plan.tgt_path, chunk_lines=CHUNK_LINES
            ):
                src = decode_lines(
                    src_raw,
                    path=plan.src_path,
                    replace_invalid=cfg.skip_invalid,
                    first_line=first_line,
                )
                tgt = decode_lines(
                    tgt_raw,
                    path=plan.tgt_path,
                    replace_invalid=cfg.skip_invalid,
                    first_line=first_line,
                )
                invalid = set(src.invalid) | set(tgt.invalid)
                sides = [
                    [line for i, line in enumerate(lines) if line.strip() and i not in invalid]
                    for lines in (src.lines, tgt.lines)
                ]
                if cfg.separate_vocab:
                    reservoirs[0].offer(sides[0])
                    reservoirs[1].offer(sides[1])
                else:
                    reservoirs[0].offer(sides[0] + sides[1])
                progress.update(len(src_raw))
    samples = [reservoir.sample() for reservoir in reservoirs]
    return samples[0], samples[1] if cfg.separate_vocab else None


def _drain(items: list[str]) -> Iterator[str]:
    """The items in order, each dropped from ``items`` as it is taken."""
    items.reverse()
    while items:
        yield items.pop()


def train_spm_models(cfg: PreprocessConfig, plans: list[SplitPlan]) -> list[bytes]:
    """Serialized SentencePiece models: one (joint), or source and target (``--separate-vocab``).

    Training is single-threaded on purpose: SentencePiece's multi-threaded trainer yields
    different pieces for different thread counts, and the dataset must not depend on --workers.
    """
    joint, target = sample_training_text(cfg, plans)
    labelled = [
        (joint, f"{cfg.source_lang}+{cfg.target_lang}" if target is None else cfg.source_lang)
    ]
    if target is not None:
        labelled.append((target, cfg.target_lang))
    protos = []
    while labelled:
        sample, label = labelled.pop(0)
        num_sentences = len(sample)
        if not num_sentences:
            raise DataError(f"no non-empty training sentences to train SentencePiece on ({label})")
        started = time.perf_counter()
        proto = train_model(
            _drain(
                sample
            ),  # SentencePiece copies each sentence: ours go as it takes them, not at the end
            vocab_size=cfg.spm_vocab_size,
            model_type=cfg.spm_model_type,
            character_coverage=cfg.spm_character_coverage,
            num_threads=1,
            tags=reserved_tags([cfg.source_lang, cfg.target_lang]),
            label=f"a sample of {num_sentences} training sentences ({label})",
        )
        vocab_size = SentencePieceModel(proto).vocab_size
        logger.info(
            "trained SentencePiece %s (%s, vocab %d) on %d sampled sentences in %.1fs",
            label,
            cfg.spm_model_type,
            vocab_size,
            num_sentences,
            time.perf_counter() - started,
        )
        if vocab_size < cfg.spm_vocab_size:
            logger.warning(
                "--spm-vocab-size %d: the training text (%s) yields only %d pieces, so the "
                "vocabulary has %d",
                cfg.spm_vocab_size,
                label,
                vocab_size,
                vocab_size,
            )
        protos.append(proto)
    return protos


# ----------------------------------------------------------------------------- writing one split
@dataclass
class SplitStats:
    name: str
    role: str
    num_lines: int = 0
    num_samples: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    src_unk: int = 0
    tgt_unk: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    replaced_invalid_utf8: int = 0


class LineNumbersWriter:
    """An int64 ``.npy`` written as it comes: the values go to a temporary file, the header
    (which holds the count) and the values are put together at the end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._raw_path = path + ".raw.tmp"
        self._raw = open_for_writing(self._raw_path)

    def add(self, values: np.ndarray) -> None:
        write_all(self._raw, np.asarray(values, dtype="<i8").data)
        self.count += int(values.shape[0])

    def finish(self) -> None:
        try:
            self._raw.close()
            with open(self.path, "wb") as out, open(self._raw_path, "rb") as raw:
                header = np.lib.format.header_data_from_array_1_0(np.zeros(0, dtype="<i8"))
                header["shape"] = (self.count,)
                np.lib.format.write_array_header_1_0(out, header)
                shutil.copyfileobj(raw, out, 1 << 20)
            os.remove(self._raw_path)
        except OSError as error:
            raise describe_os_error(error, error.filename or self.path) from None


def reference_name(split: str, lang: str) -> str:
    return f"{split}.ref.{lang}.gz"


class SplitWriter:
    """Appends encoded chunks of one split to its files, in order, and keeps its statistics."""

    def __init__(
        self,
        plan: SplitPlan,
        *,
        cfg: PreprocessConfig,
        workdir: str,
        dtypes: tuple[np.dtype, np.dtype],
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.stats = SplitStats(
            name=plan.name, role=plan.role, filtered={reason: 0 for reason in FILTER_REASONS}
        )
        if plan.role == "train" and cfg.dedup:
            self.stats.filtered[DUPLICATE] = 0
        self.first_line: int | None = None
        self.prefixes = tuple(f"{plan.name}.{lang}" for lang in cfg.languages)
        # --only-source: one token file, which both sides of the manifest name
        self.writers = [
            IndexedWriter(os.path.join(workdir, prefix), dtype=dtype)
            for prefix, dtype in list(zip(self.prefixes, dtypes))[: 1 if cfg.only_source else 2]
        ]
        self.line_numbers_file = f"{plan.name}.line_numbers.npy" if plan.role == "train" else None
        self.line_numbers = (
            LineNumbersWriter(os.path.join(workdir, self.line_numbers_file))
            if self.line_numbers_file
            else None
        )
        self.reference_file = (
            None if plan.role == "train" else reference_name(plan.name, cfg.target_lang)
        )
        self.reference = None
        if self.reference_file:
            # mtime 0 and no file name in the header: the same text always gives the same bytes
            self._reference_raw = open_for_writing(os.path.join(workdir, self.reference_file))
            self.reference = gzip.GzipFile(
                filename="", mode="wb", fileobj=self._reference_raw, mtime=0
            )
        self.seen: HashSet64 | None = HashSet64() if plan.role == "train" and cfg.dedup else None

    def append(self, chunk: EncodedChunk) -> None:
        if self.first_line is None:
            self.first_line = chunk.first_line
        stats = self.stats
        stats.num_lines += chunk.num_lines
        for reason, count in zip(FILTER_REASONS, chunk.filtered.tolist()):
            stats.filtered[reason] += count
        stats.replaced_invalid_utf8 += chunk.replaced_invalid
        src_tokens, src_lengths, tgt_tokens, tgt_lengths = (
            chunk.src_tokens,
            chunk.src_lengths,
            chunk.tgt_tokens,
            chunk.tgt_lengths,
        )
        line_numbers = chunk.line_numbers
        if self.seen is not None:
            assert chunk.pair_hashes is not None
            new = self.seen.add(chunk.pair_hashes)
            stats.filtered[DUPLICATE] += int((~new).sum())
            src_tokens, tgt_tokens = (
                src_tokens[np.repeat(new, src_lengths)],
                tgt_tokens[np.repeat(new, tgt_lengths)],
            )
            src_lengths, tgt_lengths, line_numbers = (
                src_lengths[new],
                tgt_lengths[new],
                line_numbers[new],
            )
        self.writers[0].add_many(src_tokens, src_lengths)
        if len(self.writers) == 2:
            self.writers[1].add_many(tgt_tokens, tgt_lengths)
        stats.src_unk += int(np.count_nonzero(src_tokens == UNK_ID))
        stats.tgt_unk += int(np.count_nonzero(tgt_tokens == UNK_ID))
        stats.num_samples += int(src_lengths.shape[0])
        if self.line_numbers is not None:
            self.line_numbers.add(line_numbers)
        if self.reference is not None:
            assert chunk.reference is not None
            try:
                self.reference.write(chunk.reference)
            except OSError as error:
                raise describe_os_error(error, self._reference_raw.name) from None

    def finish(self, *, input_prefix: str) -> SplitEntry:
        sides = []
        for writer, prefix in zip(self.writers, self.prefixes):
            sides.append(writer.finish_entry(prefix))
        if len(sides) == 1:  # --only-source
            sides.append(sides[0])
        self.stats.src_tokens, self.stats.tgt_tokens = sides[0].num_tokens, sides[1].num_tokens
        if self.line_numbers is not None:
            self.line_numbers.finish()
        if self.reference is not None:
            try:
                self.reference.close()
                self._reference_raw.close()
            except OSError as error:
                raise describe_os_error(error, self._reference_raw.name) from None
        part = PartEntry(
            src=sides[0],
            tgt=sides[1],
            num_lines=self.stats.num_lines,
            num_samples=self.stats.num_samples,
            first_line=self.first_line or 0,
            line_numbers=self.line_numbers_file,
        )
        return SplitEntry(
            name=self.plan.name,
            role=self.plan.role,
            num_lines=self.stats.num_lines,
            num_samples=self.stats.num_samples,
            parts=(part,),
            input_prefix=input_prefix,
            filtered=dict(self.stats.filtered) if self.plan.role == "train" else {},
            replaced_invalid_utf8=self.stats.replaced_invalid_utf8,
            reference=self.reference_file,
        )


def write_split(
    plan: SplitPlan,
    *,
    cfg: PreprocessConfig,
    options: EncodeOptions,
    pool: EncodePool,
    workdir: str,
    dtypes: tuple[np.dtype, np.dtype],
    line_range: tuple[int, int | None],
    progress: tqdm,
) -> tuple[SplitEntry, SplitStats]:
    writer = SplitWriter(plan, cfg=cfg, workdir=workdir, dtypes=dtypes)
    start, stop = line_range
    chunks = iter_parallel_chunks(
        plan.src_path, plan.tgt_path, chunk_lines=CHUNK_LINES, start=start, stop=stop
    )
    for encoded in pool.map(options, chunks):
        writer.append(encoded)
        progress.update(encoded.num_lines)
    if writer.first_line is None:
        writer.first_line = start
    return writer.finish(input_prefix=plan.prefix), writer.stats


# ----------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1
    torchrun: bool = False

    @property
    def name(self) -> str:
        return part_name(self.index, self.count)


def part_name(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def shard_of(cfg: PreprocessConfig) -> Shard:
    """``--num-shards/--shard-id``, or torchrun's RANK/WORLD_SIZE (then the options must agree or be left alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        rank = int(os.environ.get("RANK", "0"))
        if cfg.num_shards not in (1, world_size) or (
            cfg.num_shards == world_size and cfg.shard_id != rank
        ):
            raise ValueError(
                f"--num-shards/--shard-id: under torchrun each of the {world_size} ranks is one shard; leave them out"
            )
        return Shard(index=rank, count=world_size, torchrun=True)
    return Shard(index=cfg.shard_id, count=cfg.num_shards)


def input_files(cfg: PreprocessConfig) -> list[tuple[str, str]]:
    """(option, path) of every file the run reads: the raw text of each split, --spm-model."""
    inputs = [
        (f"--{plan.role}pref", path)
        for plan in make_plans(cfg)
        for path in (plan.src_path, plan.tgt_path)
    ]
    return inputs + ([("--spm-model", cfg.spm_model)] if cfg.spm_model else [])


def destination(cfg: PreprocessConfig, destdir: str) -> Destination:
    return Destination(
        destdir,
        option="--destdir",
        replace_flag="--overwrite",
        made_by="nmt-preprocess",
        replace=cfg.overwrite,
        inputs=input_files(cfg),
    )


@contextlib.contextmanager
def building_dataset(destdir: str, target: Destination) -> Iterator[str]:
    """A fresh work directory beside ``destdir`` (``make_workdir``), installed as ``target`` when the
    block ends, removed when it fails: no reader ever sees a half-written dataset."""
    workdir = make_workdir(destdir)
    try:
        yield workdir
        with signals_deferred():  # stopped between its two renames, it would lose the old dataset
            install_directory(workdir, target)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def make_workdir(destdir: str) -> str:
    parent, name = os.path.split(destdir)
    try:
        os.makedirs(parent, exist_ok=True)
        # What killed runs into this --destdir left. The lock (held) says none of them still runs,
        # on this machine or another one sharing the file system, where a PID would prove nothing.
        for leftover in os.listdir(parent):
            if leftover.startswith(f".{name}.tmp-"):
                shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
        workdir = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
        os.makedirs(workdir)
    except OSError as error:
        raise describe_os_error(error, destdir) from None
    return workdir


def _spm_files(cfg: PreprocessConfig, joint: bool) -> list[str]:
    return (
        ["spm.model"] if joint else [f"spm.{cfg.source_lang}.model", f"spm.{cfg.target_lang}.model"]
    )


def _vocabulary(cfg: PreprocessConfig, shard: Shard, plans: list[SplitPlan]) -> list[bytes]:
    """The SentencePiece model(s), the same for every shard: given, trained here, or (under torchrun)
    trained by rank 0 and sent to the others. Shards run by hand train the same model each (the sample
    and the training are deterministic); the last one to finish checks that they agree."""
    if cfg.spm_model:  # one joint model, or source,target
        return [SentencePieceModel.load(path).proto for path in cfg.spm_model.split(",")]
    if not shard.torchrun:
        return train_spm_models(cfg, plans)
    from nmt import dist

    protos = train_spm_models(cfg, plans) if shard.index == 0 else None
    return dist.broadcast_object(protos)  # type: ignore[return-value]


def _shard_range(plan: SplitPlan, shard: Shard) -> tuple[int, int | None]:
    if shard.count == 1:
        return 0, None
    src_lines, tgt_lines = count_lines(plan.src_path), count_lines(plan.tgt_path)
    if src_lines != tgt_lines:
        raise line_count_mismatch(plan.src_path, src_lines, plan.tgt_path, tgt_lines)
    return shard.index * src_lines // shard.count, (shard.index + 1) * src_lines // shard.count


def build_dataset(
    cfg: PreprocessConfig, destdir: str, *, shard: Shard, pool: EncodePool
) -> tuple[Manifest, list[SplitStats]]:
    """One complete dataset (or one shard's part) at ``destdir``; the caller holds its lock."""
    plans = make_plans(cfg, roles=("train", "valid", "test") if shard.index == 0 else ("train",))
    target = destination(cfg, destdir)
    check_destination(target)
    line_ranges = {
        plan.name: _shard_range(plan, shard) if plan.role == "train" else (0, None)
        for plan in plans
    }
    # The directory first: an unwritable --destdir fails before hours of work.
    with building_dataset(destdir, target) as workdir:
        protos = _vocabulary(cfg, shard, plans)
        models = [
            SentencePieceModel(proto, name=cfg.spm_model or "trained SentencePiece model")
            for proto in protos
        ]
        joint = len(models) == 1
        spm_files = _spm_files(cfg, joint)
        for name, model in zip(spm_files, models):
            with open_for_writing(os.path.join(workdir, name)) as handle:
                write_all(handle, model.proto)
        src_model, tgt_model = models[0], models[-1]
        dtypes = (token_dtype(src_model.vocab_size), token_dtype(tgt_model.vocab_size))

        splits: dict[str, SplitEntry] = {}
        all_stats: list[SplitStats] = []
        started = time.perf_counter()
        known = [stop - start for start, stop in line_ranges.values() if stop is not None]
        with tqdm(
            total=sum(known) if len(known) == len(plans) else None,
            unit="pairs",
            desc="encode",
            dynamic_ncols=True,
            mininterval=1.0,
        ) as progress:
            for plan in plans:
                options = EncodeOptions(
                    role=plan.role,
                    src_path=plan.src_path,
                    tgt_path=plan.tgt_path,
                    src_model=os.path.join(workdir, spm_files[0]),
                    tgt_model=os.path.join(workdir, spm_files[-1]),
                    src_dtype=dtypes[0].str,
                    tgt_dtype=dtypes[1].str,
                    skip_invalid=cfg.skip_invalid,
                    min_len=cfg.min_len,
                    max_len=cfg.max_len,
                    max_len_ratio=cfg.max_len_ratio,
                    dedup=cfg.dedup,
                    monolingual=cfg.only_source,
                )
                entry, stats = write_split(
                    plan,
                    cfg=cfg,
                    options=options,
                    pool=pool,
                    workdir=workdir,
                    dtypes=dtypes,
                    line_range=line_ranges[plan.name],
                    progress=progress,
                )
                splits[plan.name] = entry
                all_stats.append(stats)
        elapsed = time.perf_counter() - started
        num_pairs = sum(s.num_lines for s in all_stats)
        logger.info(
            "encoded %d pairs in %.2fs (%.0f pairs/s)",
            num_pairs,
            elapsed,
            num_pairs / max(elapsed, 1e-9),
        )

        for stats in all_stats:
            if stats.role == "train" and stats.num_samples == 0:
                raise DataError(
                    f"{splits[stats.name].input_prefix}: training set is empty after filtering "
                    f"({', '.join(f'{k}={v}' for k, v in stats.filtered.items() if v) or 'no lines in this shard'})"
                )
        config = to_dict(cfg)
        config["num_shards"], config["shard_id"] = shard.count, shard.index
        manifest = Manifest(
            directory=destdir,
            source_lang=cfg.source_lang,
            target_lang=cfg.languages[1],
            special_ids=dict(SPECIAL_IDS),
            spm=SpmEntry(
                joint=joint,
                src_model=spm_files[0],
                tgt_model=spm_files[-1],
                src_vocab_size=src_model.vocab_size,
                tgt_vocab_size=tgt_model.vocab_size,
                given_model=cfg.spm_model,
            ),
            splits=splits,
            checksums=sha256_files(workdir, sorted(os.listdir(workdir))),
            config=config,
        )
        # The manifest goes last: a directory with a manifest is a complete one.
        manifest.write(workdir)
    return manifest, all_stats


def preprocess(cfg: PreprocessConfig) -> tuple[Manifest, list[SplitStats]]:
    """Run the whole pipeline; returns (manifest, per-split statistics).

    Sharded, the manifest is the whole dataset's once every part is done, else this part's.
    ``--lang-pairs`` datasets are ``nmt.data.multilingual.preprocess_multilingual``'s (it builds
    on this module).
    """
    if cfg.lang_pairs is not None:
        raise ValueError("--lang-pairs: a multilingual dataset (nmt.data.multilingual)")
    shard = shard_of(cfg)
    pool = EncodePool(cfg.workers or os.cpu_count() or 1, kind=cfg.encoder)
    destdir = os.path.abspath(cfg.destdir)
    what = f"--destdir {destdir}"
    try:
        if shard.count == 1:
            with exclusive_lock(lock_path_beside(destdir), what=what):
                return build_dataset(cfg, destdir, shard=shard, pool=pool)
        return _preprocess_shard(cfg, destdir, shard=shard, pool=pool)
    finally:
        pool.close()


def _preprocess_shard(
    cfg: PreprocessConfig, destdir: str, *, shard: Shard, pool: EncodePool
) -> tuple[Manifest, list[SplitStats]]:
    from nmt import dist

    if shard.torchrun:
        dist.init_distributed("cpu", timeout_minutes=VOCABULARY_WAIT_MINUTES)
    try:
        check_apart([("--destdir", destdir)], input_files(cfg))
        try:
            # Marked as ours only when new (or empty): --overwrite may then replace it whole later.
            new = not os.path.isdir(destdir) or not os.listdir(destdir)
            os.makedirs(destdir, exist_ok=True)
            if new:
                mark_directory(destdir, "nmt-preprocess")
        except OSError as error:
            raise describe_os_error(error, destdir) from None
        what = f"--destdir {destdir}"
        # Shared by the parts (an unsharded run into the same directory needs it exclusively).
        with exclusive_lock(lock_path_beside(destdir), what=what, shared=True):
            with _finalize_lock(destdir):
                if os.path.exists(os.path.join(destdir, MANIFEST_NAME)):
                    if not cfg.overwrite:
                        raise DataError(
                            f"{destdir}: holds a complete dataset; pass --overwrite to replace its part {shard.index} (--destdir)"
                        )
                    os.remove(
                        os.path.join(destdir, MANIFEST_NAME)
                    )  # it no longer describes the parts
            part_dir = os.path.join(destdir, shard.name)
            with exclusive_lock(
                lock_path_beside(part_dir), what=f"{what} (part {shard.index} of {shard.count})"
            ):
                manifest, stats = build_dataset(cfg, part_dir, shard=shard, pool=pool)
            if shard.torchrun:
                dist.barrier()
            complete = finalize_parts(destdir, shard.count)
            if shard.torchrun:
                dist.barrier()  # every rank returns once the whole dataset is there
        return complete or manifest, stats
    finally:
        if shard.torchrun:
            dist.destroy()


@contextlib.contextmanager
def _finalize_lock(destdir: str) -> Iterator[None]:
    with exclusive_lock(
        os.path.join(destdir, ".finalize.lock"), what=f"--destdir {destdir}", wait=True
    ):
        yield


def finalize_parts(destdir: str, num_shards: int) -> Manifest | None:
    """Once all ``num_shards`` parts exist: ``destdir/manifest.json`` over them (else None).

    The parts must come from the same options and vocabulary and cover consecutive lines; the
    manifest lists each training split's parts in order, and valid/test from part 0.
    """
    with _finalize_lock(destdir):
        parts = []
        for index in range(num_shards):
            part_dir = os.path.join(destdir, part_name(index, num_shards))
            if not os.path.exists(os.path.join(part_dir, MANIFEST_NAME)):
                logger.info(
                    "part %d of %d is not done yet: %s gets its manifest when the last part finishes",
                    index,
                    num_shards,
                    destdir,
                )
                return None
            parts.append(load_manifest(part_dir))
        first = parts[0]
        options = identity(first.config, "data", declared_by=PreprocessConfig)
        for part in parts:
            differing = differences(
                options,
                identity(part.config, "data", declared_by=PreprocessConfig),
                absent=defaults(PreprocessConfig, "data"),
                labels=("in part 0", "here"),
            )
            if differing:
                raise DataError(
                    f"{part.directory}: made with other options than part 0 ({'; '.join(differing)})"
                )
            for model in {part.spm.src_model, part.spm.tgt_model}:
                if part.checksums.get(model) != first.checksums.get(model):
                    raise DataError(
                        f"{part.path(model)}: differs from part 0's vocabulary; give every shard the same --spm-model"
                    )

        def moved(index: int, name: str) -> str:
            return f"{part_name(index, num_shards)}/{name}"

        def side(index: int, entry: SideEntry) -> SideEntry:
            return SideEntry(
                prefix=moved(index, entry.prefix),
                num_tokens=entry.num_tokens,
                token_dtype=entry.token_dtype,
                max_token_id=entry.max_token_id,
            )

        def part_entry(index: int, entry: PartEntry) -> PartEntry:
            return PartEntry(
                src=side(index, entry.src),
                tgt=side(index, entry.tgt),
                num_lines=entry.num_lines,
                num_samples=entry.num_samples,
                first_line=entry.first_line,
                line_numbers=entry.line_numbers and moved(index, entry.line_numbers),
            )

        splits = {}
        for name, entry in first.splits.items():
            if entry.role != "train":
                splits[name] = SplitEntry(
                    **{
                        **vars(entry),
                        "parts": tuple(part_entry(0, p) for p in entry.parts),
                        "reference": entry.reference and moved(0, entry.reference),
                    }
                )
                continue
            entries = [part.split(name) for part in parts]
            pieces = [part_entry(index, p) for index, e in enumerate(entries) for p in e.parts]
            for before, after in zip(pieces, pieces[1:]):
                if after.first_line != before.first_line + before.num_lines:
                    raise DataError(
                        f"{destdir}: the parts of split {name!r} do not cover consecutive lines; rerun the shards with the same input"
                    )
            filtered = collections.Counter[str]()
            for e in entries:
                filtered.update(e.filtered)
            splits[name] = SplitEntry(
                name=name,
                role="train",
                num_lines=sum(e.num_lines for e in entries),
                num_samples=sum(e.num_samples for e in entries),
                parts=tuple(pieces),
                input_prefix=entry.input_prefix,
                filtered=dict(filtered),
                replaced_invalid_utf8=sum(e.replaced_invalid_utf8 for e in entries),
            )
        manifest = Manifest(
            directory=destdir,
            source_lang=first.source_lang,
            target_lang=first.target_lang,
            special_ids=first.special_ids,
            spm=SpmEntry(
                **{
                    **vars(first.spm),
                    "src_model": moved(0, first.spm.src_model),
                    "tgt_model": moved(0, first.spm.tgt_model),
                }
            ),
            splits=splits,
            checksums={
                moved(index, name): checksum
                for index, part in enumerate(parts)
                for name, checksum in part.checksums.items()
            },
            # the options of the data (not --shard-id, --workers...: those of each part's run)
            config={
                **{k: v for k, v in first.config.items() if option_name(k) in options},
                "num_shards": num_shards,
            },
        )
        manifest.write(destdir)
        logger.info("all %d parts done: wrote %s", num_shards, os.path.join(destdir, MANIFEST_NAME))
        return (
            merge_parts(manifest)
            if any(part.config.get("merge_parts") for part in parts)
            else manifest
        )


MERGE_BLOCK_SAMPLES = 1 << 20


def merge_parts(manifest: Manifest) -> Manifest:
    """Concatenate each split's parts into one token file per side, streamed a block of samples at a
    time, and rewrite the manifest to them (atomically: until then the parts stay the dataset);
    the parts' files go last. Optional: training reads the parts as one corpus without it."""
    from nmt.data.corpus import ParallelCorpus

    directory = manifest.directory
    splits = dict(manifest.splits)
    written: list[str] = []
    replaced: list[str] = []
    for name, entry in manifest.splits.items():
        if len(entry.parts) == 1:
            continue
        corpus = ParallelCorpus(directory, name, manifest=manifest, check_token_ids=False)
        sides = []
        for lang, parted in (
            (manifest.source_lang, corpus.src),
            (manifest.target_lang, corpus.tgt),
        ):
            prefix = f"{name}.{lang}"
            writer = IndexedWriter(os.path.join(directory, prefix), dtype=parted.parts[0].dtype)
            for dataset in parted.parts:
                for start in range(0, len(dataset), MERGE_BLOCK_SAMPLES):
                    stop = min(start + MERGE_BLOCK_SAMPLES, len(dataset))
                    tokens = dataset.tokens[
                        int(dataset.offsets[start]) : int(dataset.offsets[stop])
                    ]
                    writer.add_many(tokens, dataset.lengths[start:stop])
            sides.append(writer.finish_entry(prefix))
            written += [prefix + ".bin", prefix + ".idx"]
        line_numbers = None
        if all(part.line_numbers for part in entry.parts):
            line_numbers = f"{name}.line_numbers.npy"
            numbers = LineNumbersWriter(os.path.join(directory, line_numbers))
            for part in entry.parts:
                values = np.load(manifest.path(part.line_numbers), mmap_mode="r")
                for start in range(0, values.shape[0], MERGE_BLOCK_SAMPLES):
                    numbers.add(values[start : start + MERGE_BLOCK_SAMPLES])
            numbers.finish()
            written.append(line_numbers)
        for part in entry.parts:
            replaced += [
                part.src.prefix + ".bin",
                part.src.prefix + ".idx",
                part.tgt.prefix + ".bin",
                part.tgt.prefix + ".idx",
            ]
            replaced += [part.line_numbers] if part.line_numbers else []
        merged = PartEntry(
            src=sides[0],
            tgt=sides[1],
            num_lines=entry.num_lines,
            num_samples=entry.num_samples,
            first_line=entry.parts[0].first_line,
            line_numbers=line_numbers,
        )
        splits[name] = SplitEntry(**{**vars(entry), "parts": (merged,)})
    checksums = {k: v for k, v in manifest.checksums.items() if k not in replaced}
    checksums.update(sha256_files(directory, written))
    result = Manifest(**{**vars(manifest), "splits": splits, "checksums": checksums})
    result.write(directory)
    for name in replaced:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))
    for part_dir in {
        os.path.dirname(name) for name in replaced
    }:  # a part without its training files is no dataset
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, part_dir, MANIFEST_NAME))
    logger.info("merged the parts of %s into one file per split and side", directory)
    return result


def summary_table(stats: list[SplitStats]) -> str:
    header = ("split", "lines", "kept", "filtered", "src tokens", "tgt tokens", "unk %")
    rows = [header]
    for s in stats:
        filtered = ", ".join(f"{k}={v}" for k, v in s.filtered.items() if v) or "-"
        if s.replaced_invalid_utf8:
            filtered = f"invalid_utf8_replaced={s.replaced_invalid_utf8}"
        unk = 100.0 * (s.src_unk + s.tgt_unk) / max(1, s.src_tokens + s.tgt_tokens)
        rows.append(
            (
                s.name,
                str(s.num_lines),
                str(s.num_samples),
                filtered,
                str(s.src_tokens),
                str(s.tgt_tokens),
                f"{unk:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )
