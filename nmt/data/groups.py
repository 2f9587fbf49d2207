"""Multilingual datasets (``nmt-preprocess --lang-pairs``): many directions over a few languages.

Each language side of a text group is encoded once: a group is the multi-way files ``P.LANG`` (line
i of every language is the same sentence) or one pair's files ``P.SRC-TGT.LANG`` (fairseq's naming,
for corpora that are not multi-way; ``de-en`` reads ``P.en-de.*`` when only those exist). A
direction in two groups, or half a pair's files beside a complete group, is refused: one of them is
never chosen silently. A direction's split ``SPLIT.src-tgt`` points at its group's per-language
token files: 6 directions over 4 multi-way languages store 4 token files per split, not 12 (and
encode each sentence once).

Training lines are filtered per group: a line is dropped when any direction of the group would drop
it (so every language file of the group keeps the same lines and stays aligned), counted under
the first reason that applies. One joint SentencePiece model is trained over all languages, its
sample drawn from each language in proportion to ``sentences^(1/T)`` (``--spm-lang-temperature``):
a small language still gets its pieces. The language tags ``<2xx>`` are reserved in it.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from nmt.config import PreprocessConfig, to_dict
from nmt.data.dedup import HashSet64
from nmt.data.indexed import IndexedWriter
from nmt.data.manifest import (
    Manifest,
    PartEntry,
    SideEntry,
    SplitEntry,
    SpmEntry,
    direction_split,
    sha256_files,
)
from nmt.data.preprocess import (
    CHUNK_LINES,
    DUPLICATE,
    FILTER_REASONS,
    KEEP,
    LineNumbersWriter,
    Reservoir,
    SplitStats,
    building_dataset,
    filter_codes,
    reference_name,
    split_names,
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
    LineReader,
    decode_lines,
    line_count_mismatch,
    resolve_text_file,
)
from nmt.fileio import (
    Destination,
    check_destination,
    describe_os_error,
    exclusive_lock,
    lock_path_beside,
    open_for_writing,
    write_all,
)
from nmt.languages import language_tag, parse_pairs

logger = logging.getLogger(__name__)


def pair_name(src: str, tgt: str) -> str:
    return f"{src}-{tgt}"


@dataclass
class TextGroup:
    """Aligned files of some languages: the multi-way ``P.LANG`` (``stem`` "") or one pair's
    ``P.A-B.LANG`` (``stem`` "A-B"), and the directions read from them."""

    stem: str
    paths: dict[str, str] = field(default_factory=dict)  # language -> file
    directions: list[tuple[str, str]] = field(default_factory=list)

    def prefix(self, split: str, lang: str) -> str:
        """The token files of one language side in the dataset."""
        return f"{split}.{self.stem}.{lang}" if self.stem else f"{split}.{lang}"


def _exists(prefix: str, lang: str) -> str | None:
    try:
        return resolve_text_file(prefix, lang)
    except DataError:
        return None


def _file_sets(prefix: str, src: str, tgt: str) -> dict[str, dict[str, str | None]]:
    """Per stem ("SRC-TGT", "TGT-SRC", "" for the multi-way files): each language's file, or None."""
    return {
        stem: {lang: _exists(f"{prefix}.{stem}" if stem else prefix, lang) for lang in (src, tgt)}
        for stem in (pair_name(src, tgt), pair_name(tgt, src), "")
    }


def resolve_groups(prefix: str, pairs: list[tuple[str, str]], *, option: str) -> list[TextGroup]:
    """The text groups of one split prefix (given as ``option``), every file resolved. A missing
    file, a direction in two sets of files, or half a per-pair set beside a complete set is one line
    naming them: reading one set silently could train or score on other text than was meant."""
    groups: dict[str, TextGroup] = {}
    for src, tgt in pairs:
        direction = pair_name(src, tgt)
        sets = _file_sets(prefix, src, tgt)
        complete = {stem: found for stem, found in sets.items() if all(found.values())}
        named = {stem: " + ".join(filter(None, found.values())) for stem, found in sets.items()}
        if len(complete) > 1:
            first, second = [named[stem] for stem in complete][:2]
            raise DataError(
                f"{option} {prefix}: direction {direction} is in two sets of files, {first}, and "
                f"{second}; keep one set (move the other away, or give {option} a prefix with "
                "only one)"
            )
        halves = [
            stem
            for stem, found in sets.items()
            if stem and stem not in complete and any(found.values())
        ]
        if complete and halves:
            lang = next(lang for lang, path in sets[halves[0]].items() if path is None)
            raise DataError(
                f"{option} {prefix}: direction {direction} has {named[halves[0]]} without "
                f"{prefix}.{halves[0]}.{lang} (nor .gz/.xz/.zst) beside the complete "
                f"{named[next(iter(complete))]}; complete the per-pair set or move it away"
            )
        if not complete:
            lang = next(lang for lang, path in sets[""].items() if path is None)
            raise DataError(
                f"{prefix}.{lang}: no such file (nor .gz/.xz/.zst, nor the per-pair "
                f"{prefix}.{direction}.{lang}) for direction {direction}"
            )
        stem, found = next(iter(complete.items()))
        group = groups.setdefault(stem, TextGroup(stem=stem))
        group.paths.update({lang: path for lang, path in found.items() if path is not None})
        group.directions.append((src, tgt))
    return list(groups.values())


def iter_aligned_chunks(
    paths: dict[str, str], *, chunk_lines: int
) -> Iterator[tuple[int, dict[str, list[bytes]]]]:
    """``(first line, lines per language)`` in chunks of aligned lines; a line-count mismatch is
    one error naming two of the files and their counts."""
    readers = {lang: LineReader(path) for lang, path in paths.items()}
    try:
        first = 0
        while True:
            chunk = {lang: reader.read(chunk_lines) for lang, reader in readers.items()}
            sizes = {len(lines) for lines in chunk.values()}
            if len(sizes) > 1:
                totals = {
                    lang: reader.line_number + reader.count_rest()
                    for lang, reader in readers.items()
                }
                most, fewest = (
                    max(totals, key=totals.__getitem__),
                    min(totals, key=totals.__getitem__),
                )
                raise line_count_mismatch(paths[most], totals[most], paths[fewest], totals[fewest])
            if not sizes or sizes == {0}:
                return
            yield first, chunk
            first += sizes.pop()
    finally:
        for reader in readers.values():
            reader.close()


# ----------------------------------------------------------------------------- SentencePiece
def language_shares(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """Each language's share of the SentencePiece sample: proportional to ``count^(1/T)``."""
    weights = {lang: count ** (1.0 / temperature) for lang, count in counts.items() if count}
    total = sum(weights.values())
    return {lang: weight / total for lang, weight in weights.items()}


def train_joint_model(
    cfg: PreprocessConfig, groups: list[TextGroup], languages: list[str]
) -> bytes:
    """One SentencePiece model over every language, from a temperature-weighted sample."""
    reservoirs = {
        lang: Reservoir(cfg.spm_sample_size, seed=[cfg.seed, index])
        for index, lang in enumerate(languages)
    }
    with tqdm(unit="lines", desc="sample for SentencePiece", mininterval=1.0) as progress:
        for group in groups:
            for first_line, chunk in iter_aligned_chunks(group.paths, chunk_lines=CHUNK_LINES):
                for lang, raw in chunk.items():
                    decoded = decode_lines(
                        raw,
                        path=group.paths[lang],
                        replace_invalid=cfg.skip_invalid,
                        first_line=first_line,
                    )
                    bad = set(decoded.invalid)
                    reservoirs[lang].offer(
                        [
                            line
                            for i, line in enumerate(decoded.lines)
                            if line.strip() and i not in bad
                        ]
                    )
                progress.update(len(next(iter(chunk.values()))))
    shares = language_shares(
        {lang: reservoir.seen for lang, reservoir in reservoirs.items()}, cfg.spm_lang_temperature
    )
    sample: list[str] = []
    for lang, share in shares.items():
        taken = reservoirs[lang].sample()[: max(1, round(share * cfg.spm_sample_size))]
        sample.extend(taken)
        logger.info("SentencePiece sample: %d %s sentences (share %.3f)", len(taken), lang, share)
    if not sample:
        raise DataError("no non-empty training sentences to train SentencePiece on")
    started = time.perf_counter()
    proto = train_model(
        sample,
        vocab_size=cfg.spm_vocab_size,
        model_type=cfg.spm_model_type,
        character_coverage=cfg.spm_character_coverage,
        num_threads=1,  # the pieces must not depend on the thread count
        tags=reserved_tags(languages),
        label=f"a sample of {len(sample)} training sentences ({'+'.join(languages)})",
    )
    logger.info(
        "trained joint SentencePiece (vocab %d) in %.1fs",
        SentencePieceModel(proto).vocab_size,
        time.perf_counter() - started,
    )
    return proto


def _given_model(path: str, languages: list[str]) -> bytes:
    model = SentencePieceModel.load(path)
    missing = [language_tag(lang) for lang in languages if language_tag(lang) not in model.tags]
    if missing:
        raise ValueError(
            f"--spm-model {path}: has no reserved tag {missing[0]} (train it with nmt-preprocess "
            "--lang-pairs naming that language)"
        )
    return model.proto


# ----------------------------------------------------------------------------- encoding a group
def combined_filter_codes(
    lengths: dict[str, np.ndarray],
    invalid: np.ndarray,
    directions: list[tuple[str, str]],
    cfg: PreprocessConfig,
) -> np.ndarray:
    """Per line: KEEP, or the first reason any direction of the group drops it for."""
    codes = np.stack(
        [
            filter_codes(
                lengths[src],
                lengths[tgt],
                invalid,
                min_len=cfg.min_len,
                max_len=cfg.max_len,
                max_len_ratio=cfg.max_len_ratio,
            )
            for src, tgt in directions
        ]
    )
    worst = np.where(codes == KEEP, len(FILTER_REASONS), codes).min(axis=0)
    return np.where(worst == len(FILTER_REASONS), KEEP, worst).astype(np.int8)


@dataclass
class GroupOutput:
    sides: dict[str, SideEntry]
    num_lines: int
    num_samples: int
    line_numbers: str | None
    filtered: dict[str, int]
    replaced_invalid_utf8: int
    references: dict[str, str]  # language -> reference file (valid/test)
    unk: dict[str, int]


def encode_group(
    group: TextGroup,
    *,
    split: str,
    role: str,
    model: SentencePieceModel,
    cfg: PreprocessConfig,
    workdir: str,
    progress: tqdm,
) -> GroupOutput:
    """Every language of the group encoded once into ``SPLIT[.A-B].LANG.bin/.idx``, streamed."""
    dtype = token_dtype(model.vocab_size)
    langs = sorted(group.paths)
    writers = {
        lang: IndexedWriter(os.path.join(workdir, group.prefix(split, lang)), dtype=dtype)
        for lang in langs
    }
    numbers_name = f"{group.prefix(split, 'line_numbers')}.npy" if role == "train" else None
    numbers = LineNumbersWriter(os.path.join(workdir, numbers_name)) if numbers_name else None
    stem = f"{split}.{group.stem}" if group.stem else split
    references = {} if role == "train" else {lang: reference_name(stem, lang) for lang in langs}
    raw_refs = {
        lang: open_for_writing(os.path.join(workdir, name)) for lang, name in references.items()
    }
    # mtime 0 and no file name in the header: the same text always gives the same bytes
    gz_refs = {
        lang: gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0)
        for lang, handle in raw_refs.items()
    }
    filtered = {reason: 0 for reason in FILTER_REASONS}
    seen = HashSet64() if role == "train" and cfg.dedup else None
    if seen is not None:
        filtered[DUPLICATE] = 0
    unk = dict.fromkeys(langs, 0)
    num_lines = num_samples = replaced = 0
    threads = cfg.workers or os.cpu_count() or 1
    for first_line, chunk in iter_aligned_chunks(group.paths, chunk_lines=CHUNK_LINES):
        count = len(chunk[langs[0]])
        invalid = np.zeros(count, dtype=bool)
        decoded: dict[str, list[str]] = {}
        encoded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for lang in langs:
            lines = decode_lines(
                chunk[lang],
                path=group.paths[lang],
                replace_invalid=cfg.skip_invalid,
                first_line=first_line,
            )
            invalid[lines.invalid] = True
            decoded[lang] = lines.lines
            encoded[lang] = model.encode_with_eos(lines.lines, dtype=dtype, num_threads=threads)
        keep = np.ones(count, dtype=bool)
        if role == "train":
            codes = combined_filter_codes(
                {lang: lengths for lang, (_, lengths) in encoded.items()},
                invalid,
                group.directions,
                cfg,
            )
            for reason, dropped in zip(
                FILTER_REASONS, np.bincount(codes[codes != KEEP], minlength=len(FILTER_REASONS))
            ):
                filtered[reason] += int(dropped)
            keep = codes == KEEP
            if seen is not None:
                kept = np.flatnonzero(keep)
                digests = b"".join(
                    hashlib.blake2b(
                        b"\n".join(chunk[lang][i] for lang in langs), digest_size=8
                    ).digest()
                    for i in kept
                )
                new = seen.add(np.frombuffer(digests, dtype="<u8").astype(np.uint64))
                filtered[DUPLICATE] += int((~new).sum())
                keep[kept[~new]] = False
        else:
            replaced += int(invalid.sum())
        for lang in langs:
            tokens, lengths = encoded[lang]
            tokens, lengths = tokens[np.repeat(keep, lengths)], lengths[keep]
            writers[lang].add_many(tokens, lengths)
            unk[lang] += int(np.count_nonzero(tokens == UNK_ID))
            if lang in gz_refs:
                try:
                    gz_refs[lang].write("".join(line + "\n" for line in decoded[lang]).encode())
                except OSError as error:
                    raise describe_os_error(error, raw_refs[lang].name) from None
        if numbers is not None:
            numbers.add(first_line + np.flatnonzero(keep).astype(np.int64))
        num_lines += count
        num_samples += int(keep.sum())
        progress.update(count)
    sides = {}
    for lang, writer in writers.items():
        sides[lang] = writer.finish_entry(group.prefix(split, lang))
    if numbers is not None:
        numbers.finish()
    for lang in gz_refs:
        try:
            gz_refs[lang].close()
            raw_refs[lang].close()
        except OSError as error:
            raise describe_os_error(error, raw_refs[lang].name) from None
    return GroupOutput(
        sides=sides,
        num_lines=num_lines,
        num_samples=num_samples,
        line_numbers=numbers_name,
        filtered=filtered if role == "train" else {},
        replaced_invalid_utf8=replaced,
        references=references,
        unk=unk,
    )


def direction_entry(
    name: str, role: str, prefix: str, output: GroupOutput, src: str, tgt: str
) -> SplitEntry:
    """One direction's split over its group's shared token files."""
    part = PartEntry(
        src=output.sides[src],
        tgt=output.sides[tgt],
        num_lines=output.num_lines,
        num_samples=output.num_samples,
        line_numbers=output.line_numbers,
    )
    return SplitEntry(
        name=name,
        role=role,
        num_lines=output.num_lines,
        num_samples=output.num_samples,
        parts=(part,),
        input_prefix=prefix,
        filtered=dict(output.filtered),
        replaced_invalid_utf8=output.replaced_invalid_utf8,
        reference=output.references.get(tgt),
    )


# ----------------------------------------------------------------------------- the run
def preprocess_multilingual(cfg: PreprocessConfig) -> tuple[Manifest, list[SplitStats]]:
    """A multilingual dataset at ``cfg.destdir``: resolved, encoded and installed whole."""
    pairs = [(pair.source, pair.target) for pair in parse_pairs(cfg.lang_pairs or "")]
    languages = sorted({lang for pair in pairs for lang in pair})
    splits = [
        (name, role, prefix, resolve_groups(prefix, pairs, option=f"--{role}pref"))
        for role, prefixes in (
            ("train", cfg.trainpref),
            ("valid", cfg.validpref),
            ("test", cfg.testpref),
        )
        for name, prefix in zip(split_names(role, prefixes), prefixes)
    ]
    destdir = os.path.abspath(cfg.destdir)
    target = Destination(
        destdir,
        option="--destdir",
        replace_flag="--overwrite",
        made_by="nmt-preprocess",
        replace=cfg.overwrite,
        inputs=[
            (f"--{role}pref", path)
            for _, role, _, groups in splits
            for group in groups
            for path in group.paths.values()
        ]
        + ([("--spm-model", cfg.spm_model)] if cfg.spm_model else []),
    )
    with exclusive_lock(lock_path_beside(destdir), what=f"--destdir {destdir}"):
        check_destination(target)
        with building_dataset(destdir, target) as workdir:
            manifest, stats = _build(cfg, pairs, languages, splits, destdir, workdir)
    return manifest, stats


def _build(
    cfg: PreprocessConfig,
    pairs: list[tuple[str, str]],
    languages: list[str],
    splits: list[tuple[str, str, str, list[TextGroup]]],
    destdir: str,
    workdir: str,
) -> tuple[Manifest, list[SplitStats]]:
    train_groups = [group for _, role, _, groups in splits if role == "train" for group in groups]
    proto = (
        _given_model(cfg.spm_model, languages)
        if cfg.spm_model
        else train_joint_model(cfg, train_groups, languages)
    )
    model = SentencePieceModel(proto, name=cfg.spm_model or "trained SentencePiece model")
    with open_for_writing(os.path.join(workdir, "spm.model")) as handle:
        write_all(handle, proto)
    entries: dict[str, SplitEntry] = {}
    all_stats: list[SplitStats] = []
    started = time.perf_counter()
    num_lines = 0
    with tqdm(unit="lines", desc="encode", mininterval=1.0) as progress:
        for name, role, prefix, groups in splits:
            for group in groups:
                output = encode_group(
                    group,
                    split=name,
                    role=role,
                    model=model,
                    cfg=cfg,
                    workdir=workdir,
                    progress=progress,
                )
                num_lines += output.num_lines * len(group.paths)
                if role == "train" and output.num_samples == 0:
                    reasons = ", ".join(f"{k}={v}" for k, v in output.filtered.items() if v)
                    raise DataError(
                        f"{prefix}: training set is empty after filtering ({reasons or 'no lines'})"
                    )
                for src, tgt in group.directions:
                    split = direction_split(name, pair_name(src, tgt))
                    entries[split] = direction_entry(split, role, prefix, output, src, tgt)
                    all_stats.append(
                        SplitStats(
                            name=split,
                            role=role,
                            num_lines=output.num_lines,
                            num_samples=output.num_samples,
                            src_tokens=output.sides[src].num_tokens,
                            tgt_tokens=output.sides[tgt].num_tokens,
                            src_unk=output.unk[src],
                            tgt_unk=output.unk[tgt],
                            filtered=dict(output.filtered),
                            replaced_invalid_utf8=output.replaced_invalid_utf8,
                        )
                    )
    elapsed = time.perf_counter() - started
    logger.info(
        "encoded %d sentences (each language side once) in %.2fs (%.0f sentences/s)",
        num_lines,
        elapsed,
        num_lines / max(elapsed, 1e-9),
    )
    # Entries in direction order (as --lang-pairs lists them) within each split.
    order = {pair_name(*pair): index for index, pair in enumerate(pairs)}
    ordered = dict(
        sorted(
            entries.items(),
            key=lambda item: (
                [name for name, *_ in splits].index(item[0].rsplit(".", 1)[0]),
                order[item[0].rsplit(".", 1)[1]],
            ),
        )
    )
    manifest = Manifest(
        directory=destdir,
        source_lang=",".join(sorted({src for src, _ in pairs})),
        target_lang=",".join(sorted({tgt for _, tgt in pairs})),
        special_ids=dict(SPECIAL_IDS),
        spm=SpmEntry(
            joint=True,
            src_model="spm.model",
            tgt_model="spm.model",
            src_vocab_size=model.vocab_size,
            tgt_vocab_size=model.vocab_size,
            given_model=cfg.spm_model,
        ),
        splits=ordered,
        checksums=sha256_files(workdir, sorted(os.listdir(workdir))),
        config=to_dict(cfg),
        lang_pairs=tuple(pair_name(*pair) for pair in pairs),
        tags={tag: model.tags[tag] for tag in reserved_tags(languages)},
    )
    manifest.write(workdir)  # last: a directory with a manifest is a complete one
    return manifest, sorted(all_stats, key=lambda s: list(ordered).index(s.name))
