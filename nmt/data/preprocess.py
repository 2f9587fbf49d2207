"""Raw parallel text -> SentencePiece ids -> filtered, memory-mapped dataset with a manifest.

The output directory appears only when complete: everything is written into a hidden temporary
sibling directory that is renamed into place at the end, so an interrupted or failed run leaves no
dataset that looks finished (and a stale temporary directory is never mistaken for one).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from nmt.config import PreprocessConfig, to_dict
from nmt.data.manifest import Manifest, SideEntry, SplitEntry, SpmEntry
from nmt.data.indexed import IndexedWriter
from nmt.data.spm import SPECIAL_IDS, SentencePieceModel, ids_with_eos, token_dtype, train_model
from nmt.data.text import DataError, ParallelText, read_parallel_text

logger = logging.getLogger(__name__)

# Order matters: a pair is counted under the first reason that applies.
FILTER_REASONS = ("invalid_utf8", "blank_line", "too_short", "too_long", "length_ratio")
KEEP = -1
ENCODE_CHUNK_LINES = 20_000


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


@dataclass
class SplitPlan:
    name: str
    role: str  # train | valid | test
    prefix: str
    text: ParallelText


@dataclass
class SplitStats:
    name: str
    role: str
    num_lines: int
    num_samples: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    src_unk: int = 0
    tgt_unk: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    replaced_invalid_utf8: int = 0


def split_names(role: str, prefixes: list[str]) -> list[str]:
    """fairseq's naming: train, train1, train2, ... (valid, valid1, ...)."""
    return [role if k == 0 else f"{role}{k}" for k in range(len(prefixes))]


def _check_destdir(destdir: str, *, overwrite: bool) -> None:
    if os.path.exists(destdir) and not os.path.isdir(destdir):
        raise DataError(f"{destdir}: exists and is not a directory (--destdir)")
    if os.path.isdir(destdir) and os.listdir(destdir) and not overwrite:
        raise DataError(f"{destdir}: exists and is not empty; pass --overwrite to replace it (--destdir)")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _sample_for_spm(sentences: list[str], *, sample_size: int, seed: int) -> list[str]:
    """Deterministic subsample (in corpus order) so the model does not depend on thread timing."""
    non_empty = [s for s in sentences if s.strip()]
    if len(non_empty) <= sample_size:
        return non_empty
    chosen = np.sort(np.random.default_rng(seed).choice(len(non_empty), size=sample_size, replace=False))
    return [non_empty[i] for i in chosen]


def _train_sentences(plans: list[SplitPlan], side: str) -> list[str]:
    invalid_pairs = {(id(plan), i) for plan in plans for i in plan.text.invalid}
    return [
        line
        for plan in plans
        if plan.role == "train"
        for i, line in enumerate(getattr(plan.text, side))
        if (id(plan), i) not in invalid_pairs
    ]


def build_spm_models(cfg: PreprocessConfig, plans: list[SplitPlan]) -> tuple[SentencePieceModel, SentencePieceModel]:
    """(source model, target model): the same object when the vocabulary is joint.

    Training is single-threaded on purpose: SentencePiece's multi-threaded trainer yields
    different pieces for different thread counts, and the dataset must not depend on --workers.
    """
    if cfg.spm_model:
        model = SentencePieceModel.load(cfg.spm_model)
        return model, model

    def train(sentences: list[str], label: str) -> SentencePieceModel:
        sample = _sample_for_spm(sentences, sample_size=cfg.spm_sample_size, seed=cfg.seed)
        if not sample:
            raise DataError(f"no non-empty training sentences to train SentencePiece on ({label})")
        started = time.perf_counter()
        proto = train_model(
            sample,
            vocab_size=cfg.spm_vocab_size,
            model_type=cfg.spm_model_type,
            character_coverage=cfg.spm_character_coverage,
            num_threads=1,
        )
        model = SentencePieceModel(proto, name=f"spm ({label})")
        logger.info(
            "trained SentencePiece %s (%s, vocab %d) on %d sentences in %.1fs",
            label, cfg.spm_model_type, model.vocab_size, len(sample), time.perf_counter() - started,
        )
        return model

    src_sentences = _train_sentences(plans, "src")
    tgt_sentences = _train_sentences(plans, "tgt")
    if cfg.separate_vocab:
        return train(src_sentences, cfg.source_lang), train(tgt_sentences, cfg.target_lang)
    joint = train(src_sentences + tgt_sentences, f"{cfg.source_lang}+{cfg.target_lang}")
    return joint, joint


def _encode(model: SentencePieceModel, lines: list[str], *, num_threads: int, progress: tqdm) -> list[list[int]]:
    ids: list[list[int]] = []
    for start in range(0, len(lines), ENCODE_CHUNK_LINES):
        chunk = lines[start : start + ENCODE_CHUNK_LINES]
        ids.extend(model.encode(chunk, num_threads=num_threads))
        progress.update(len(chunk))
    return ids


def _write_split(
    plan: SplitPlan,
    *,
    cfg: PreprocessConfig,
    models: tuple[SentencePieceModel, SentencePieceModel],
    workdir: str,
    num_threads: int,
    progress: tqdm,
) -> tuple[SplitEntry, SplitStats]:
    text = plan.text
    stats = SplitStats(name=plan.name, role=plan.role, num_lines=len(text.src))
    dtypes = [token_dtype(m.vocab_size) for m in models]
    src_tokens, src_lengths = ids_with_eos(_encode(models[0], text.src, num_threads=num_threads, progress=progress), dtype=dtypes[0])
    tgt_tokens, tgt_lengths = ids_with_eos(_encode(models[1], text.tgt, num_threads=num_threads, progress=progress), dtype=dtypes[1])
    line_numbers_file = None
    if plan.role == "train":
        invalid = np.zeros(stats.num_lines, dtype=bool)
        invalid[text.invalid] = True
        codes = filter_codes(
            src_lengths, tgt_lengths, invalid, min_len=cfg.min_len, max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio
        )
        stats.filtered = {reason: int((codes == k).sum()) for k, reason in enumerate(FILTER_REASONS)}
        keep = codes == KEEP
        src_tokens = src_tokens[np.repeat(keep, src_lengths)]
        tgt_tokens = tgt_tokens[np.repeat(keep, tgt_lengths)]
        src_lengths, tgt_lengths = src_lengths[keep], tgt_lengths[keep]
        line_numbers_file = f"{plan.name}.line_numbers.npy"
        np.save(os.path.join(workdir, line_numbers_file), np.flatnonzero(keep).astype(np.int64))
    else:
        stats.replaced_invalid_utf8 = len(text.invalid)
    stats.num_samples = int(src_lengths.shape[0])
    sides = {}
    for side, lang, tokens, lengths, dtype in (
        ("src", cfg.source_lang, src_tokens, src_lengths, dtypes[0]),
        ("tgt", cfg.target_lang, tgt_tokens, tgt_lengths, dtypes[1]),
    ):
        prefix = f"{plan.name}.{lang}"
        writer = IndexedWriter(os.path.join(workdir, prefix), dtype=dtype)
        writer.add_many(tokens, lengths)
        sides[side] = SideEntry(prefix=prefix, num_tokens=writer.finish(), token_dtype=str(np.dtype(dtype)))
    stats.src_tokens, stats.tgt_tokens = sides["src"].num_tokens, sides["tgt"].num_tokens
    stats.src_unk = int((src_tokens == SPECIAL_IDS["unk"]).sum())
    stats.tgt_unk = int((tgt_tokens == SPECIAL_IDS["unk"]).sum())
    entry = SplitEntry(
        name=plan.name, role=plan.role, num_lines=stats.num_lines, num_samples=stats.num_samples,
        src=sides["src"], tgt=sides["tgt"], line_numbers=line_numbers_file, input_prefix=plan.prefix,
        filtered=stats.filtered, replaced_invalid_utf8=stats.replaced_invalid_utf8,
    )
    return entry, stats


def read_plans(cfg: PreprocessConfig) -> list[SplitPlan]:
    """Read and check every input before anything is written (missing files, line counts, UTF-8)."""
    plans = []
    for role, prefixes in (("train", cfg.trainpref), ("valid", cfg.validpref), ("test", cfg.testpref)):
        for name, prefix in zip(split_names(role, prefixes), prefixes):
            text = read_parallel_text(prefix, cfg.source_lang, cfg.target_lang, replace_invalid=cfg.skip_invalid)
            plans.append(SplitPlan(name=name, role=role, prefix=prefix, text=text))
    return plans


def _install(workdir: str, destdir: str) -> None:
    """Move the finished dataset into place; an old one (with --overwrite) goes only after that."""
    previous = None
    if os.path.isdir(destdir):
        previous = workdir + ".old"
        os.rename(destdir, previous)
    os.rename(workdir, destdir)
    if previous:
        shutil.rmtree(previous, ignore_errors=True)


def preprocess(cfg: PreprocessConfig) -> tuple[Manifest, list[SplitStats]]:
    """Run the whole pipeline; returns (manifest, per-split statistics)."""
    destdir = os.path.abspath(cfg.destdir)
    _check_destdir(destdir, overwrite=cfg.overwrite)
    num_threads = cfg.workers or os.cpu_count() or 1
    plans = read_plans(cfg)
    models = build_spm_models(cfg, plans)

    parent = os.path.dirname(destdir)
    os.makedirs(parent, exist_ok=True)
    workdir = os.path.join(parent, f".{os.path.basename(destdir)}.tmp-{os.getpid()}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    try:
        joint = models[0] is models[1]
        spm_files = ["spm.model"] if joint else [f"spm.{cfg.source_lang}.model", f"spm.{cfg.target_lang}.model"]
        for name, model in zip(spm_files, models):
            with open(os.path.join(workdir, name), "wb") as handle:
                handle.write(model.proto)

        total_lines = 2 * sum(len(plan.text.src) for plan in plans)
        started = time.perf_counter()
        splits: dict[str, SplitEntry] = {}
        all_stats: list[SplitStats] = []
        with tqdm(total=total_lines, unit="sent", desc="encode", dynamic_ncols=True, mininterval=1.0) as progress:
            for plan in plans:
                entry, stats = _write_split(
                    plan, cfg=cfg, models=models, workdir=workdir, num_threads=num_threads, progress=progress
                )
                splits[plan.name] = entry
                all_stats.append(stats)
        elapsed = time.perf_counter() - started
        logger.info("encoded %d sentences in %.2fs (%.0f sentences/s)", total_lines, elapsed, total_lines / max(elapsed, 1e-9))

        for stats in all_stats:
            if stats.role == "train" and stats.num_samples == 0:
                raise DataError(
                    f"{splits[stats.name].input_prefix}: training set is empty after filtering "
                    f"({', '.join(f'{k}={v}' for k, v in stats.filtered.items() if v)})"
                )

        manifest = Manifest(
            directory=destdir,
            source_lang=cfg.source_lang,
            target_lang=cfg.target_lang,
            special_ids=dict(SPECIAL_IDS),
            spm=SpmEntry(
                joint=joint, src_model=spm_files[0], tgt_model=spm_files[-1], src_vocab_size=models[0].vocab_size,
                tgt_vocab_size=models[1].vocab_size, given_model=cfg.spm_model,
            ),
            splits=splits,
            checksums={name: _sha256(os.path.join(workdir, name)) for name in sorted(os.listdir(workdir))},
            config=to_dict(cfg),
        )
        # The manifest goes last: a directory with a manifest is a complete one.
        manifest.write(workdir)
        _install(workdir, destdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return manifest, all_stats


def summary_table(stats: list[SplitStats]) -> str:
    header = ("split", "lines", "kept", "filtered", "src tokens", "tgt tokens", "unk %")
    rows = [header]
    for s in stats:
        filtered = ", ".join(f"{k}={v}" for k, v in s.filtered.items() if v) or "-"
        if s.replaced_invalid_utf8:
            filtered = f"invalid_utf8_replaced={s.replaced_invalid_utf8}"
        unk = 100.0 * (s.src_unk + s.tgt_unk) / max(1, s.src_tokens + s.tgt_tokens)
        rows.append((s.name, str(s.num_lines), str(s.num_samples), filtered, str(s.src_tokens), str(s.tgt_tokens), f"{unk:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
