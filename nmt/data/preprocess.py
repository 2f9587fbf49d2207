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
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from nmt.config import PreprocessConfig, option_name, to_dict
from nmt.data.dedup import HashSet64
from nmt.data.groups import TextGroup, given_model, language_shares, resolve_groups
from nmt.data.indexed import IndexedWriter
from nmt.data.manifest import (
    MANIFEST_NAME,
    Manifest,
    PartEntry,
    SideEntry,
    SplitEntry,
    SpmEntry,
    direction_split,
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
    iter_aligned_chunks,
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
from nmt.languages import Pair
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


def direction_filter_codes(
    lengths: dict[str, np.ndarray],
    invalid: np.ndarray,
    directions: Sequence[tuple[str, str]],
    *,
    min_len: int,
    max_len: int,
    max_len_ratio: float,
) -> np.ndarray:
    """Per line of a group: KEEP, or the first reason any of its ``directions`` drops it for (so
    every language file of the group keeps the same lines and stays aligned)."""
    codes = np.stack(
        [
            filter_codes(
                lengths[src],
                lengths[tgt],
                invalid,
                min_len=min_len,
                max_len=max_len,
                max_len_ratio=max_len_ratio,
            )
            for src, tgt in directions
        ]
    )
    worst = np.where(codes == KEEP, len(FILTER_REASONS), codes).min(axis=0)
    return np.where(worst == len(FILTER_REASONS), KEEP, worst).astype(np.int8)


# ----------------------------------------------------------------------------- encoding one chunk
@dataclass(frozen=True)
class EncodeOptions:
    """What a worker needs to encode a chunk of one text group (models by path: loaded once per
    process). A language's side is encoded once, whatever the number of its directions."""

    role: str  # train | valid | test
    paths: dict[str, str]  # language -> its text file, in the group's order
    models: dict[str, str]  # language -> its SentencePiece model file
    dtypes: dict[str, str]  # language -> its token dtype
    directions: tuple[tuple[str, str], ...]  # (source, target) languages read from the group
    skip_invalid: bool
    min_len: int
    max_len: int
    max_len_ratio: float
    dedup: bool
    num_threads: int = 1  # SentencePiece's own threads (the in-process mode)

    @property
    def references(self) -> list[str]:
        """The languages whose text valid/test keep as the reference: the directions' targets."""
        return sorted({tgt for _, tgt in self.directions})


@dataclass
class EncodedChunk:
    first_line: int
    num_lines: int
    tokens: dict[str, np.ndarray]  # language -> (S,) kept lines' ids, EOS after each
    lengths: dict[str, np.ndarray]  # language -> (K,)
    line_numbers: np.ndarray  # (K,) raw line of each kept line
    filtered: np.ndarray  # (len(FILTER_REASONS),) lines dropped per reason
    replaced_invalid: int  # valid/test lines repaired (U+FFFD) under --skip-invalid
    line_hashes: np.ndarray | None  # (K,) uint64, with --dedup
    references: dict[str, bytes]  # valid/test: each target's lines as decoded, each ending in "\n"


_LOADED_MODELS: dict[str, SentencePieceModel] = {}


def _model(path: str) -> SentencePieceModel:
    if path not in _LOADED_MODELS:
        _LOADED_MODELS[path] = SentencePieceModel.load(path)
    return _LOADED_MODELS[path]


def line_hashes(lines: dict[str, list[bytes]], indices: np.ndarray) -> np.ndarray:
    """64-bit hash of each raw line ``indices`` of a group, its languages' lines joined by "\\n"
    (lines never contain one, so it separates them unambiguously)."""
    digests = b"".join(
        hashlib.blake2b(b"\n".join(side[i] for side in lines.values()), digest_size=8).digest()
        for i in indices
    )
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def encode_chunk(
    options: EncodeOptions, first_line: int, lines: dict[str, list[bytes]]
) -> EncodedChunk:
    """Decode, encode and (training splits) filter one chunk of a group's aligned lines."""
    num_lines = len(next(iter(lines.values())))
    decoded = {
        lang: decode_lines(
            raw,
            path=options.paths[lang],
            replace_invalid=options.skip_invalid,
            first_line=first_line,
        )
        for lang, raw in lines.items()
    }
    invalid = np.zeros(num_lines, dtype=bool)
    for side in decoded.values():
        invalid[side.invalid] = True
    encoded = {
        lang: _model(options.models[lang]).encode_with_eos(
            side.lines, dtype=np.dtype(options.dtypes[lang]), num_threads=options.num_threads
        )
        for lang, side in decoded.items()
    }
    filtered = np.zeros(len(FILTER_REASONS), dtype=np.int64)
    if options.role != "train":  # valid and test keep every line, repaired if need be
        return EncodedChunk(
            first_line=first_line,
            num_lines=num_lines,
            tokens={lang: tokens for lang, (tokens, _) in encoded.items()},
            lengths={lang: lengths for lang, (_, lengths) in encoded.items()},
            line_numbers=np.arange(first_line, first_line + num_lines, dtype=np.int64),
            filtered=filtered,
            replaced_invalid=int(invalid.sum()),
            line_hashes=None,
            references={
                lang: "".join(line + "\n" for line in decoded[lang].lines).encode("utf-8")
                for lang in options.references
            },
        )
    codes = direction_filter_codes(
        {lang: lengths for lang, (_, lengths) in encoded.items()},
        invalid,
        options.directions,
        min_len=options.min_len,
        max_len=options.max_len,
        max_len_ratio=options.max_len_ratio,
    )
    filtered += np.bincount(codes[codes != KEEP], minlength=len(FILTER_REASONS))
    keep = codes == KEEP
    kept = np.flatnonzero(keep)
    return EncodedChunk(
        first_line=first_line,
        num_lines=num_lines,
        tokens={
            lang: tokens[np.repeat(keep, lengths)] for lang, (tokens, lengths) in encoded.items()
        },
        lengths={lang: lengths[keep] for lang, (_, lengths) in encoded.items()},
        line_numbers=first_line + kept.astype(np.int64),
        filtered=filtered,
        replaced_invalid=0,
        line_hashes=line_hashes(lines, kept) if options.dedup else None,
        references={},
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
        self, options: EncodeOptions, chunks: Iterable[tuple[int, dict[str, list[bytes]]]]
    ) -> Iterator[EncodedChunk]:
        options = EncodeOptions(**{**vars(options), "num_threads": self._threads_per_chunk})
        pending: collections.deque[concurrent.futures.Future[EncodedChunk]] = collections.deque()
        try:
            for first_line, lines in chunks:
                pending.append(self._executor.submit(encode_chunk, options, first_line, lines))
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
    """One text group of a split: its files and the directions read from them."""

    name: str
    role: str  # train | valid | test
    prefix: str
    group: TextGroup


def split_names(role: str, prefixes: list[str]) -> list[str]:
    """fairseq's naming: train, train1, train2, ... (valid, valid1, ...)."""
    return [role if k == 0 else f"{role}{k}" for k in range(len(prefixes))]


def text_groups(cfg: PreprocessConfig, prefix: str, *, option: str) -> list[TextGroup]:
    """The groups of one split prefix: ``--lang-pairs`` finds multi-way or per-pair files
    (``nmt.data.groups``); ``-s/-t`` reads ``P.SRC``/``P.TGT`` (``--only-source``: ``P.SRC``)."""
    if cfg.lang_pairs is not None:
        return resolve_groups(prefix, [(p.source, p.target) for p in cfg.pairs], option=option)
    paths = {lang: resolve_text_file(prefix, lang) for lang in dict.fromkeys(cfg.languages)}
    return [TextGroup(stem="", paths=paths, directions=[cfg.languages])]


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
            groups = text_groups(cfg, prefix, option=f"--{role}pref")
            if role in roles:
                plans += [SplitPlan(name, role, prefix, group) for group in groups]
    return plans


def sample_training_text(
    plans: list[SplitPlan], reservoirs: dict[str, Reservoir], *, skip_invalid: bool
) -> None:
    """Offers every training sentence to its language's reservoir, in one streaming pass over every
    training group; languages sharing a reservoir offer a chunk's lines together, in the group's
    order. Blank lines and lines with invalid UTF-8 in any language (under ``--skip-invalid``) are
    left out; without it, invalid UTF-8 fails here."""
    with tqdm(
        unit="lines", desc="sample for SentencePiece", dynamic_ncols=True, mininterval=1.0
    ) as progress:
        for plan in plans:
            if plan.role != "train":
                continue
            paths = plan.group.paths
            for first_line, chunk in iter_aligned_chunks(paths, chunk_lines=CHUNK_LINES):
                decoded = {
                    lang: decode_lines(
                        raw, path=paths[lang], replace_invalid=skip_invalid, first_line=first_line
                    )
                    for lang, raw in chunk.items()
                }
                invalid = {i for side in decoded.values() for i in side.invalid}
                offers: dict[int, tuple[Reservoir, list[str]]] = {}
                for lang, side in decoded.items():
                    reservoir = reservoirs[lang]
                    offers.setdefault(id(reservoir), (reservoir, []))[1].extend(
                        line
                        for i, line in enumerate(side.lines)
                        if line.strip() and i not in invalid
                    )
                for reservoir, lines in offers.values():
                    reservoir.offer(lines)
                progress.update(len(next(iter(chunk.values()))))


def language_sample(cfg: PreprocessConfig, reservoirs: dict[str, Reservoir]) -> list[str]:
    """``--lang-pairs``: one sample of every language, each taking its share of
    ``--spm-sample-size`` by ``--spm-lang-temperature`` (``nmt.data.groups.language_shares``)."""
    shares = language_shares(
        {lang: reservoir.seen for lang, reservoir in reservoirs.items()}, cfg.spm_lang_temperature
    )
    sample: list[str] = []
    for lang, share in shares.items():
        taken = reservoirs[lang].sample()[: max(1, round(share * cfg.spm_sample_size))]
        sample.extend(taken)
        logger.info("SentencePiece sample: %d %s sentences (share %.3f)", len(taken), lang, share)
    return sample


def _drain(items: list[str]) -> Iterator[str]:
    """The items in order, each dropped from ``items`` as it is taken."""
    items.reverse()
    while items:
        yield items.pop()


def train_spm_models(cfg: PreprocessConfig, plans: list[SplitPlan]) -> list[bytes]:
    """Serialized SentencePiece models: one (joint), or source and target (``--separate-vocab``),
    each reserving the tags of the dataset's languages. A joint model samples the sentences of all
    languages together (``-s/-t``) or each language apart, weighted (``--lang-pairs``).

    Training is single-threaded on purpose: SentencePiece's multi-threaded trainer yields
    different pieces for different thread counts, and the dataset must not depend on --workers.
    """
    languages = cfg.all_languages
    if cfg.lang_pairs is not None:
        reservoirs = {
            lang: Reservoir(cfg.spm_sample_size, seed=[cfg.seed, index])
            for index, lang in enumerate(languages)
        }
    elif cfg.separate_vocab:
        reservoirs = {
            lang: Reservoir(cfg.spm_sample_size, seed=[cfg.seed, side])
            for side, lang in enumerate(cfg.languages)
        }
    else:
        joint = Reservoir(cfg.spm_sample_size, seed=[cfg.seed, 0])
        reservoirs = dict.fromkeys(cfg.languages, joint)
    sample_training_text(plans, reservoirs, skip_invalid=cfg.skip_invalid)
    labelled = (
        [(language_sample(cfg, reservoirs), "+".join(languages))]
        if cfg.lang_pairs is not None
        else [(reservoirs[lang].sample(), lang) for lang in cfg.languages]
        if cfg.separate_vocab
        else [(joint.sample(), "+".join(cfg.languages))]
    )
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
            tags=reserved_tags(languages),
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


class GroupWriter:
    """Appends encoded chunks of one text group of a split to its files (one per language), in
    order, and keeps its statistics."""

    def __init__(
        self, plan: SplitPlan, *, cfg: PreprocessConfig, workdir: str, dtypes: dict[str, np.dtype]
    ) -> None:
        self.plan = plan
        self.group = plan.group
        self.workdir = workdir
        self.num_lines = self.num_samples = self.replaced_invalid_utf8 = 0
        self.filtered = {reason: 0 for reason in FILTER_REASONS}
        if plan.role == "train" and cfg.dedup:
            self.filtered[DUPLICATE] = 0
        self.unk = dict.fromkeys(self.group.paths, 0)
        self.first_line: int | None = None
        self.writers = {
            lang: IndexedWriter(
                os.path.join(workdir, self.group.prefix(plan.name, lang)), dtype=dtypes[lang]
            )
            for lang in self.group.paths
        }
        self.line_numbers_file = (
            f"{self.group.prefix(plan.name, 'line_numbers')}.npy" if plan.role == "train" else None
        )
        self.line_numbers = (
            LineNumbersWriter(os.path.join(workdir, self.line_numbers_file))
            if self.line_numbers_file
            else None
        )
        stem = f"{plan.name}.{self.group.stem}" if self.group.stem else plan.name
        self.reference_files = (
            {}
            if plan.role == "train"
            else {lang: reference_name(stem, lang) for lang in self.group.targets}
        )
        # mtime 0 and no file name in the header: the same text always gives the same bytes
        self._reference_raw = {
            lang: open_for_writing(os.path.join(workdir, name))
            for lang, name in self.reference_files.items()
        }
        self.references = {
            lang: gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
            for lang, raw in self._reference_raw.items()
        }
        self.seen: HashSet64 | None = HashSet64() if plan.role == "train" and cfg.dedup else None

    def append(self, chunk: EncodedChunk) -> None:
        if self.first_line is None:
            self.first_line = chunk.first_line
        self.num_lines += chunk.num_lines
        for reason, count in zip(FILTER_REASONS, chunk.filtered.tolist()):
            self.filtered[reason] += count
        self.replaced_invalid_utf8 += chunk.replaced_invalid
        tokens, lengths, line_numbers = chunk.tokens, chunk.lengths, chunk.line_numbers
        if self.seen is not None:
            assert chunk.line_hashes is not None
            new = self.seen.add(chunk.line_hashes)
            self.filtered[DUPLICATE] += int((~new).sum())
            tokens = {lang: ids[np.repeat(new, lengths[lang])] for lang, ids in tokens.items()}
            lengths = {lang: counts[new] for lang, counts in lengths.items()}
            line_numbers = line_numbers[new]
        for lang, writer in self.writers.items():
            writer.add_many(tokens[lang], lengths[lang])
            self.unk[lang] += int(np.count_nonzero(tokens[lang] == UNK_ID))
        self.num_samples += int(line_numbers.shape[0])
        if self.line_numbers is not None:
            self.line_numbers.add(line_numbers)
        for lang, reference in self.references.items():
            try:
                reference.write(chunk.references[lang])
            except OSError as error:
                raise describe_os_error(error, self._reference_raw[lang].name) from None

    def finish(self, names: dict[tuple[str, str], str]) -> list[tuple[SplitEntry, SplitStats]]:
        """Each direction's split (named by ``names``) over the group's files, and its statistics."""
        sides = {
            lang: writer.finish_entry(self.group.prefix(self.plan.name, lang))
            for lang, writer in self.writers.items()
        }
        if self.line_numbers is not None:
            self.line_numbers.finish()
        for lang, reference in self.references.items():
            try:
                reference.close()
                self._reference_raw[lang].close()
            except OSError as error:
                raise describe_os_error(error, self._reference_raw[lang].name) from None
        filtered = dict(self.filtered) if self.plan.role == "train" else {}
        results = []
        for src, tgt in self.group.directions:
            name = names[src, tgt]
            part = PartEntry(
                src=sides[src],
                tgt=sides[tgt],
                num_lines=self.num_lines,
                num_samples=self.num_samples,
                first_line=self.first_line or 0,
                line_numbers=self.line_numbers_file,
            )
            entry = SplitEntry(
                name=name,
                role=self.plan.role,
                num_lines=self.num_lines,
                num_samples=self.num_samples,
                parts=(part,),
                input_prefix=self.plan.prefix,
                filtered=dict(filtered),
                replaced_invalid_utf8=self.replaced_invalid_utf8,
                reference=self.reference_files.get(tgt),
            )
            stats = SplitStats(
                name=name,
                role=self.plan.role,
                num_lines=self.num_lines,
                num_samples=self.num_samples,
                src_tokens=sides[src].num_tokens,
                tgt_tokens=sides[tgt].num_tokens,
                src_unk=self.unk[src],
                tgt_unk=self.unk[tgt],
                filtered=dict(self.filtered),
                replaced_invalid_utf8=self.replaced_invalid_utf8,
            )
            results.append((entry, stats))
        return results


def write_split(
    plan: SplitPlan,
    *,
    cfg: PreprocessConfig,
    options: EncodeOptions,
    pool: EncodePool,
    workdir: str,
    dtypes: dict[str, np.dtype],
    line_range: tuple[int, int | None],
    progress: tqdm,
) -> GroupWriter:
    """One text group of a split encoded into its files (``finish`` makes its entries)."""
    writer = GroupWriter(plan, cfg=cfg, workdir=workdir, dtypes=dtypes)
    start, stop = line_range
    chunks = iter_aligned_chunks(plan.group.paths, chunk_lines=CHUNK_LINES, start=start, stop=stop)
    for encoded in pool.map(options, chunks):
        writer.append(encoded)
        progress.update(encoded.num_lines)
    if writer.first_line is None:
        writer.first_line = start
    return writer


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
        for path in plan.group.paths.values()
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
    if cfg.spm_model:  # one joint model, or source,target; a tagged dataset's reserves its tags
        tagged = cfg.all_languages if cfg.lang_pairs is not None else []
        return [given_model(path, tagged) for path in cfg.spm_model.split(",")]
    if not shard.torchrun:
        return train_spm_models(cfg, plans)
    from nmt import dist

    protos = train_spm_models(cfg, plans) if shard.index == 0 else None
    return dist.broadcast_object(protos)  # type: ignore[return-value]


def _shard_range(plan: SplitPlan, shard: Shard) -> tuple[int, int | None]:
    if shard.count == 1:
        return 0, None
    paths = plan.group.paths
    counts = {lang: count_lines(path) for lang, path in paths.items()}
    first = next(iter(counts))
    for lang, count in counts.items():
        if count != counts[first]:
            raise line_count_mismatch(paths[first], counts[first], paths[lang], count)
    num_lines = counts[first]
    return shard.index * num_lines // shard.count, (shard.index + 1) * num_lines // shard.count


def _stored_split(cfg: PreprocessConfig, split: str, pair: Pair) -> str:
    """A direction's split as the manifest names it: ``train.en-de`` (``train`` without a tag)."""
    return direction_split(split, pair.name) if cfg.lang_pairs is not None else split


def build_dataset(
    cfg: PreprocessConfig, destdir: str, *, shard: Shard, pool: EncodePool
) -> tuple[Manifest, list[SplitStats]]:
    """One complete dataset (or one shard's part) at ``destdir``; the caller holds its lock."""
    plans = make_plans(cfg, roles=("train", "valid", "test") if shard.index == 0 else ("train",))
    target = destination(cfg, destdir)
    check_destination(target)
    line_ranges = [
        _shard_range(plan, shard) if plan.role == "train" else (0, None) for plan in plans
    ]
    languages = cfg.all_languages
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
        # Each language's model: the joint one, or (--separate-vocab) its side's.
        side = dict.fromkeys(languages, 0) if joint else {cfg.source_lang: 0, cfg.target_lang: 1}
        model_files = {lang: os.path.join(workdir, spm_files[k]) for lang, k in side.items()}
        dtypes = {lang: token_dtype(models[k].vocab_size) for lang, k in side.items()}

        results: list[tuple[SplitEntry, SplitStats]] = []
        started = time.perf_counter()
        known = [stop - start for start, stop in line_ranges if stop is not None]
        with tqdm(
            total=sum(known) if len(known) == len(plans) else None,
            unit="lines",
            desc="encode",
            dynamic_ncols=True,
            mininterval=1.0,
        ) as progress:
            for plan, line_range in zip(plans, line_ranges):
                group = plan.group
                options = EncodeOptions(
                    role=plan.role,
                    paths=group.paths,
                    models={lang: model_files[lang] for lang in group.paths},
                    dtypes={lang: dtypes[lang].str for lang in group.paths},
                    directions=tuple(group.directions),
                    skip_invalid=cfg.skip_invalid,
                    min_len=cfg.min_len,
                    max_len=cfg.max_len,
                    max_len_ratio=cfg.max_len_ratio,
                    dedup=cfg.dedup,
                )
                writer = write_split(
                    plan,
                    cfg=cfg,
                    options=options,
                    pool=pool,
                    workdir=workdir,
                    dtypes={lang: dtypes[lang] for lang in group.paths},
                    line_range=line_range,
                    progress=progress,
                )
                if plan.role == "train" and writer.num_samples == 0:
                    reasons = ", ".join(f"{k}={v}" for k, v in writer.filtered.items() if v)
                    raise DataError(
                        f"{plan.prefix}: training set is empty after filtering "
                        f"({reasons or 'no lines in this shard'})"
                    )
                names = {
                    (src, tgt): _stored_split(cfg, plan.name, Pair(src, tgt))
                    for src, tgt in group.directions
                }
                results += writer.finish(names)
        elapsed = time.perf_counter() - started
        num_lines = sum(stats.num_lines for _, stats in results)
        logger.info(
            "encoded %d lines in %.2fs (%.0f lines/s)",
            num_lines,
            elapsed,
            num_lines / max(elapsed, 1e-9),
        )
        # Splits in the order given, each one's directions in --lang-pairs order.
        order = [
            _stored_split(cfg, name, pair)
            for name in dict.fromkeys(plan.name for plan in plans)
            for pair in cfg.pairs
        ]
        results.sort(key=lambda result: order.index(result[0].name))
        config = to_dict(cfg)
        config["num_shards"], config["shard_id"] = shard.count, shard.index
        tagged = cfg.lang_pairs is not None
        manifest = Manifest(
            directory=destdir,
            source_lang=",".join(sorted({pair.source for pair in cfg.pairs})),
            target_lang=",".join(sorted({pair.target for pair in cfg.pairs})),
            special_ids=dict(SPECIAL_IDS),
            spm=SpmEntry(
                joint=joint,
                src_model=spm_files[0],
                tgt_model=spm_files[-1],
                src_vocab_size=models[0].vocab_size,
                tgt_vocab_size=models[-1].vocab_size,
                given_model=cfg.spm_model,
            ),
            splits={entry.name: entry for entry, _ in results},
            checksums=sha256_files(workdir, sorted(os.listdir(workdir))),
            config=config,
            lang_pairs=tuple(pair.name for pair in cfg.pairs) if tagged else (),
            # (a given model made before a tag was added to reserved_tags lacks that one)
            tags={
                tag: models[0].tags[tag]
                for tag in reserved_tags(languages)
                if tag in models[0].tags
            }
            if tagged
            else {},
        )
        # The manifest goes last: a directory with a manifest is a complete one.
        manifest.write(workdir)
    return manifest, [stats for _, stats in results]


def preprocess(cfg: PreprocessConfig) -> tuple[Manifest, list[SplitStats]]:
    """Run the whole pipeline, for a dataset of any number of directions; returns (manifest,
    per-split statistics).

    Sharded, the manifest is the whole dataset's once every part is done, else this part's.
    """
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

    with dist.session("cpu", timeout_minutes=VOCABULARY_WAIT_MINUTES):
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
            lang_pairs=first.lang_pairs,
            tags=first.tags,
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
    # A language's files serve every direction of its group: each is merged once, named as in a part.
    merged_sides: dict[str, SideEntry] = {}
    for name, entry in manifest.splits.items():
        if len(entry.parts) == 1:
            continue
        corpus = ParallelCorpus(directory, name, manifest=manifest, check_token_ids=False)
        sides = []
        for parted, first_side in (
            (corpus.src, entry.parts[0].src),
            (corpus.tgt, entry.parts[0].tgt),
        ):
            prefix = os.path.basename(first_side.prefix)
            if prefix not in merged_sides:
                writer = IndexedWriter(os.path.join(directory, prefix), dtype=parted.parts[0].dtype)
                for dataset in parted.parts:
                    for start in range(0, len(dataset), MERGE_BLOCK_SAMPLES):
                        stop = min(start + MERGE_BLOCK_SAMPLES, len(dataset))
                        tokens = dataset.tokens[
                            int(dataset.offsets[start]) : int(dataset.offsets[stop])
                        ]
                        writer.add_many(tokens, dataset.lengths[start:stop])
                merged_sides[prefix] = writer.finish_entry(prefix)
                written += [prefix + ".bin", prefix + ".idx"]
            sides.append(merged_sides[prefix])
        line_numbers = None
        if all(part.line_numbers for part in entry.parts):
            line_numbers = os.path.basename(entry.parts[0].line_numbers or "")
        if line_numbers and line_numbers not in written:
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
