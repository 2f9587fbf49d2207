"""Evaluation, as nmt-eval runs it and as training's ``--eval-bleu`` validates: a dataset's split,
a file or stdin translated with checkpoint(s) or an export, written out and scored with sacreBLEU;
every direction of a multilingual dataset in one table; a monolingual dataset translated into a
parallel one (``--output-dataset``).

The per-direction decode-and-score loop (``score_directions``) is the one both nmt-eval's table and
the training validator run. torch is imported only where a checkpoint needs it: an exported model
evaluates without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import numpy as np

from nmt.config import EvalConfig, EvalIOConfig
from nmt.data.manifest import Manifest, load_manifest
from nmt.data.spm import SentencePieceModel
from nmt.data.terminology import Glossary
from nmt.data.text import count_lines, open_binary
from nmt.eval.constraint_input import split_line
from nmt.eval.hypothesis import LengthLimitError
from nmt.eval.output import FairseqLines, base2, plain_lines
from nmt.eval.score import Score
from nmt.eval.translate import (
    Split,
    Translation,
    Translator,
    iter_line_chunks,
    load_split,
    read_references,
)
from nmt.fileio import write_output
from nmt.languages import Direction, Pair

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("nmt.eval")

DEFAULT_BUFFER_SIZE = 4096


def checkpoint_paths(io: EvalIOConfig) -> list[str]:
    """The checkpoints --path names (``:`` separates them; --average-last: the newest of a save dir)."""
    if io.average_last is not None:
        from nmt.checkpoint_io import (
            last_checkpoints,  # here: torch, which an exported model does without
        )

        return last_checkpoints(io.path, io.average_last)
    paths = io.checkpoint_paths
    for path in paths:
        parts = path.split(",")
        if (
            not os.path.exists(path)
            and len(parts) > 1
            and all(os.path.isfile(part) for part in parts)
        ):
            raise ValueError(
                f"--path {path}: no such file; a comma does not separate checkpoints: "
                f"{':'.join(parts)} ensembles them, --average --path {':'.join(parts)} averages their weights"
            )
    return paths


def load_translator(io: EvalIOConfig, cfg: EvalConfig, paths: list[str]) -> Translator:
    """The one place nmt-eval turns the checkpoints of --path (``checkpoint_paths``) into a
    Translator (an ensemble, or averaged weights)."""
    dtype = "float16" if io.fp16 else "bfloat16" if io.bf16 else None
    average = io.average or io.average_last is not None
    return Translator.from_checkpoint(
        paths, device=io.device, config=cfg, average=average, dtype=dtype
    )


# ----------------------------------------------------------------------------- every direction
@dataclass
class DirectionSet:
    """One direction's sentences of a dataset's split and their reference lines."""

    pair: str  # "en-de"
    split: Split
    references: list[str]


def direction_sets(
    manifest: Manifest,
    split: str,
    *,
    src_spm: SentencePieceModel,
    pairs: Sequence[str],
    option: str,
) -> list[DirectionSet]:
    """``split`` of each direction in ``pairs``, with its raw reference text; ``option`` names what
    needs them in the error when the manifest has none."""
    sets = []
    for pair in pairs:
        name = manifest.direction_split(split, pair)
        data = load_split(manifest.directory, name, src_spm=src_spm, manifest=manifest)
        if data.reference_path is None:
            raise ValueError(
                f"{option}: the manifest of {manifest.directory} names no raw reference text for split {name!r}"
            )
        references = read_references(
            data.reference_path, num_lines=data.num_lines, line_numbers=data.line_numbers
        )
        sets.append(DirectionSet(pair, data, references))
    return sets


@dataclass
class DirectionResult:
    pair: str
    hypotheses: list[str]
    scores: list[Score]  # cased sacreBLEU BLEU, then chrF2


def score_directions(
    translator: Translator, sets: Sequence[DirectionSet], *, progress: bool = False
) -> Iterator[DirectionResult]:
    """Each direction's split decoded (its target tag asked for) and scored against its references."""
    for item in sets:
        wanted = Pair.parse(item.pair, codes=False)
        direction = translator.direction(wanted.source, wanted.target)
        sources = direction.prefixed(item.split.sources)
        found = translator.generate(
            sources,
            progress=progress,
            first_tokens=translator.first_tokens(direction, len(sources)),
        )
        hypotheses = [nbest[0].text for nbest in translator.detokenize(found)]
        yield DirectionResult(item.pair, hypotheses, translator.score(hypotheses, item.references))


def _every_direction(io: EvalIOConfig, translator: Translator, manifest: Manifest) -> int:
    """A multilingual DATA_DIR without -s/-t: every direction the dataset and the model share, one
    table (cased sacreBLEU, chrF2, off-target %) and the mean."""
    from nmt.eval.language_id import off_target_rate

    languages = translator.languages.codes
    pairs = [pair for pair in manifest.languages().pairs if pair in translator.languages.pairs]
    if not pairs:
        raise ValueError(
            f"{io.data_dir}: none of its directions ({', '.join(manifest.languages().pairs)}) is "
            f"the model's ({', '.join(translator.languages.pairs)}): give -s/-t"
        )
    sets = direction_sets(
        manifest, io.split, src_spm=translator.src_spm, pairs=pairs, option="DATA_DIR"
    )
    rows = []
    signatures: list[str] = []
    for result in score_directions(translator, sets, progress=True):
        bleu, chrf = result.scores[:2]
        target = Pair.parse(result.pair, codes=False).target
        off = off_target_rate(result.hypotheses, target, languages=languages)
        rows.append((result.pair, bleu.score, chrf.score, off))
        signatures = [f"{bleu.name}: {bleu.signature}", f"{chrf.name}: {chrf.signature}"]
        logger.info(
            "%s: BLEU %.2f chrF2 %.2f off-target %.2f%%", result.pair, bleu.score, chrf.score, off
        )
    print(f"{io.split} ({len(rows)} directions, {io.data_dir})")
    print(direction_table(rows))
    for line in signatures:
        print(f"  {line}")
    return 0


def direction_table(rows: list[tuple[str, float, float, float]]) -> str:
    """Markdown: one row per direction (BLEU, chrF2, off-target %) and their mean."""
    lines = ["| direction | BLEU | chrF2 | off-target % |", "| --- | ---: | ---: | ---: |"]
    for pair, bleu, chrf, off in rows:
        lines.append(f"| {pair} | {bleu:.2f} | {chrf:.2f} | {off:.2f} |")
    means = [sum(row[k] for row in rows) / len(rows) for k in (1, 2, 3)]
    lines.append(f"| mean | {means[0]:.2f} | {means[1]:.2f} | {means[2]:.2f} |")
    return "\n".join(lines)


def make_bleu_validator(
    manifest: Manifest,
    split: str,
    *,
    search: dict[str, object],
    print_samples: bool = False,
    lang_tok: str = "encoder",
) -> Callable[[torch.nn.Module, torch.device], dict[str, float]]:
    """nmt-train --eval-bleu: the model being trained decoded on ``split`` (batched, greedy or a
    small beam) and scored with sacreBLEU as nmt-eval scores (``score_directions``): each
    direction's, scored apart (a dict by direction). nmt.train does not
    import nmt.eval: the trainer only sees this callback."""
    src_spm = SentencePieceModel.load(manifest.path(manifest.spm.src_model))
    tgt_spm = SentencePieceModel.load(manifest.path(manifest.spm.tgt_model))
    languages = manifest.languages(lang_tok)
    sets = direction_sets(
        manifest,
        split,
        src_spm=src_spm,
        pairs=list(manifest.direction_splits(split)),
        option="--eval-bleu",
    )

    def validate(model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        translator = Translator(
            model,
            src_spm=src_spm,
            tgt_spm=tgt_spm,
            config=EvalConfig(**search),
            languages=languages,
        )
        scores = {}
        for item, result in zip(sets, score_directions(translator, sets)):
            if print_samples:
                for hypothesis, reference in list(zip(result.hypotheses, item.references))[:3]:
                    logging.getLogger("nmt.train").info(
                        "example hypothesis%s: %s\nexample reference: %s",
                        f" ({result.pair})" if len(sets) > 1 else "",
                        hypothesis,
                        reference,
                    )
            scores[result.pair] = result.scores[0].score
        return scores

    return validate


# ----------------------------------------------------------------------------- one input
@dataclass
class Chunk:
    start: int  # index of the first sentence in the whole input
    sources: list[np.ndarray]  # token ids, EOS included
    constraints: list[list[list[int]]] | None = None  # --constraints: per source, target pieces


@dataclass
class Job:
    chunks: Iterator[Chunk]
    references: list[str] | None
    reference_name: str | None
    name: str  # the split, or the input file ("stdin")
    interactive: bool  # print each chunk as soon as it is translated; no progress bars


def _split_name(io: EvalIOConfig, manifest: Manifest) -> str:
    """--split of the -s/-t direction (of the dataset's only one, without -s/-t)."""
    pairs = manifest.languages().pairs
    if io.source_lang is None and len(pairs) > 1:
        raise ValueError(
            f"{io.data_dir}: a multilingual dataset: give -s/-t for one direction "
            f"({', '.join(pairs)}), or neither for all of them"
        )
    pair = pairs[0] if io.source_lang is None else f"{io.source_lang}-{io.target_lang}"
    if pair not in pairs:
        raise ValueError(
            f"-s {io.source_lang} -t {io.target_lang}: {io.data_dir} has no direction {pair} "
            f"(it has {', '.join(pairs)})"
        )
    return manifest.direction_split(io.split, pair)


def open_job(
    io: EvalIOConfig, cfg: EvalConfig, translator: Translator, direction: Direction
) -> Job:
    """What nmt-eval translates: DATA_DIR's split (one chunk), or --input / stdin read in chunks of
    --buffer-size lines (line by line at a terminal), with the references that score it."""
    if io.data_dir is not None:
        manifest = load_manifest(io.data_dir)
        name = _split_name(io, manifest)
        split = load_split(io.data_dir, name, src_spm=translator.src_spm, manifest=manifest)
        reference_path = io.reference or split.reference_path
        if reference_path is None:
            raise ValueError(
                f"{io.data_dir}: the manifest names no raw text for split {io.split!r}; pass --reference"
            )
        references = read_references(
            reference_path, num_lines=split.num_lines, line_numbers=split.line_numbers
        )
        return Job(
            iter([Chunk(0, direction.prefixed(split.sources))]),
            references,
            reference_path,
            name,
            interactive=False,
        )

    from_stdin = io.input in (None, "-")
    references = None
    if io.reference is not None:
        num_lines = None if from_stdin else count_lines(io.input)  # stdin is counted as it streams
        references = read_references(io.reference, num_lines=num_lines)
    buffer_size = cfg.buffer_size or (
        1 if from_stdin and sys.stdin.isatty() else DEFAULT_BUFFER_SIZE
    )

    glossary = None if io.glossary is None else Glossary.read(io.glossary)

    def chunks() -> Iterator[Chunk]:
        with contextlib.ExitStack() as stack:
            handle, name = (
                (sys.stdin.buffer, "<stdin>")
                if from_stdin
                else (stack.enter_context(open_binary(io.input)), io.input)
            )
            start = 0
            for lines in iter_line_chunks(handle, size=buffer_size, name=name):
                if references is not None and start + len(lines) > len(references):
                    raise ValueError(
                        f"{io.reference}: the reference has {len(references)} lines but {name} has more"
                    )
                texts, phrases = lines, None
                if io.constraints is not None:
                    texts, lists = zip(*map(split_line, lines))
                    phrases = translator.encode_constraints(
                        lists, where=lambda index, first=start + 1: f"{name}:{first + index}"
                    )
                sources = translator.encode(texts, direction=direction)
                if glossary is not None:
                    sources, phrases = translator.apply_terms(
                        sources,
                        [glossary.matches(text) for text in texts],
                        mode=io.glossary_mode,
                        constraints=phrases,
                    )
                yield Chunk(start, sources, phrases)
                start += len(lines)

    return Job(
        chunks(),
        references,
        io.reference,
        "stdin" if from_stdin else io.input,
        interactive=buffer_size == 1,
    )


@contextlib.contextmanager
def _open_output(path: str | None) -> Iterator[TextIO]:
    """stdout, or ``path``: a file written atomically (never half a file), or streamed to a FIFO,
    a terminal or stdout (``write_output``)."""
    if path is None:
        yield sys.stdout
        return
    with write_output(path, "w", encoding="utf-8", newline="\n") as handle:
        yield handle


def _decode(
    translator: Translator,
    io: EvalIOConfig,
    chunk: Chunk,
    references: list[str] | None,
    *,
    progress: bool,
    direction: Direction,
) -> list[list[Translation]]:
    """The chunk's n-best translations (with per-token scores for --format fairseq), or with
    --score-reference its references scored by forced decoding."""
    first_tokens = translator.first_tokens(direction, len(chunk.sources))
    if io.score_reference:
        assert references is not None
        return [
            [t]
            for t in translator.score_references(
                chunk.sources, references, alignment=io.print_alignment, first_tokens=first_tokens
            )
        ]
    results = translator.detokenize(
        translator.generate(
            chunk.sources,
            progress=progress,
            first_tokens=first_tokens,
            constraints=chunk.constraints,
            ordered_constraints=io.constraints == "ordered",
        )
    )
    if io.format == "fairseq":
        translator.add_token_scores(
            chunk.sources, results, alignment=io.print_alignment, first_tokens=first_tokens
        )
    return results


def evaluate(io: EvalIOConfig, cfg: EvalConfig) -> int:
    """nmt-eval: translate, write, score (or ``generate`` a dataset with --output-dataset)."""
    if io.constraints is not None and io.data_dir is not None:
        raise ValueError(
            "--constraints: they follow each source line after a tab, so give --input text (or "
            "stdin), not DATA_DIR"
        )
    if io.glossary is not None and io.data_dir is not None:
        raise ValueError(
            "--glossary: its terms are found in the text of each line, so give --input text (or "
            "stdin), not DATA_DIR"
        )
    if io.output_dataset is not None:
        return generate(io, cfg)
    paths = checkpoint_paths(io)
    translator = load_translator(io, cfg, paths)
    if io.format == "fairseq" or io.score_reference:
        translator.require_forced_decoding()  # before any decoding, not after the whole input
    if io.glossary is not None:
        translator.check_glossary_mode(io.glossary_mode, option="--glossary-mode")
    if io.constraints is not None:
        if io.score_reference:
            raise ValueError("--constraints: nothing is searched with --score-reference")
        translator.check_constraints()
    if io.data_dir is not None and io.source_lang is None:
        manifest = load_manifest(io.data_dir)
        if len(manifest.languages().pairs) > 1:
            return _every_direction(io, translator, manifest)
    direction = translator.direction(io.source_lang, io.target_lang, zero_shot=io.zero_shot)
    job = open_job(io, cfg, translator, direction)
    fairseq_lines = (
        FairseqLines(
            translator.src_spm, translator.tgt_spm, post_process=io.post_process is not None
        )
        if io.format == "fairseq"
        else None
    )
    if fairseq_lines is not None:
        logger.info("hypothesis and token scores are output in base 2")
    best: list[str] = []
    num_sentences = num_tokens = num_scored_tokens = 0
    log_prob_sum = 0.0  # --score-reference: natural log, over all scored reference tokens
    started = time.perf_counter()
    with _open_output(io.output_path) as out:
        for chunk in job.chunks:
            references = (
                None
                if job.references is None
                else job.references[chunk.start : chunk.start + len(chunk.sources)]
            )
            try:
                results = _decode(
                    translator,
                    io,
                    chunk,
                    references,
                    progress=not job.interactive,
                    direction=direction,
                )
            except LengthLimitError as error:
                raise ValueError(
                    f"{job.name}:{chunk.start + error.index + 1}: {error.reason}"
                ) from None
            for offset, nbest in enumerate(results):
                if not io.quiet:
                    if fairseq_lines is not None:
                        reference = None if references is None else references[offset]
                        out.writelines(
                            fairseq_lines(
                                chunk.start + offset, chunk.sources[offset], reference, nbest
                            )
                        )
                    else:
                        out.writelines(plain_lines(nbest, score_reference=io.score_reference))
                num_tokens += len(nbest[0].tokens) + 1  # EOS counted, as fairseq-generate does
                if io.score_reference:
                    log_prob_sum += sum(nbest[0].positional_scores or [])
                    num_scored_tokens += len(nbest[0].positional_scores or [])
                elif (
                    job.references is not None or io.off_target
                ):  # only kept when scoring: plain translation streams
                    best.append(nbest[0].text)
            num_sentences += len(results)
            out.flush()  # interactive: this chunk's output now, before the next line is read
        elapsed = time.perf_counter() - started
        if job.references is not None and num_sentences != len(job.references):
            raise ValueError(
                f"{job.reference_name}: the reference has {len(job.references)} lines but the input has {num_sentences}"
            )
        if job.references is not None and num_sentences == 0:
            raise ValueError(
                f"{job.reference_name}: no lines, and {job.name} none: nothing to score "
                "(BLEU, chrF and perplexity are undefined on no sentences)"
            )
        verb = "scored" if io.score_reference else "translated"
        print(
            f"{verb} {num_sentences} sentences ({num_tokens} tokens) in {elapsed:.1f}s: "
            f"{num_sentences / max(elapsed, 1e-9):.1f} sentences/s, {num_tokens / max(elapsed, 1e-9):.1f} tokens/s",
            file=sys.stderr,
        )
        if io.score_reference:
            per_token = base2(log_prob_sum) / max(num_scored_tokens, 1)
            results_text = [
                f"reference log-probability per token {per_token:.4f} (base 2), perplexity {2**-per_token:.2f}"
            ]
        elif job.references is not None:
            scores = translator.score(
                best, job.references, tokenized_lowercase=io.score_tokenized_lowercase
            )
            prefix = (
                f"Generate {job.name} with beam={cfg.beam}: " if fairseq_lines is not None else ""
            )
            results_text = [prefix + str(result) for result in scores]
        else:
            results_text = []
        if io.off_target and not io.score_reference:
            results_text.append(_off_target_line(translator, best, io.target_lang))
        if fairseq_lines is not None:
            out.writelines(
                line + "\n" for line in results_text
            )  # fairseq-generate ends its output with them
    if fairseq_lines is None or io.output_path is not None:  # else they are on stdout already
        report = sys.stdout if io.output_path is not None or io.quiet else sys.stderr
        for line in results_text:
            print(line, file=report)
    return 0


def _off_target_line(translator: Translator, hypotheses: list[str], target: str | None) -> str:
    from nmt.eval.language_id import off_target_rate

    target = target or translator.languages.first.target
    languages = translator.languages.codes
    rate = off_target_rate(hypotheses, target, languages=languages)
    return f"off-target {rate:.2f}% (langid among {','.join(languages)})"


# ----------------------------------------------------------------------------- --output-dataset
def generate(io: EvalIOConfig, cfg: EvalConfig) -> int:
    """--output-dataset: back-translation of a monolingual dataset into a parallel one, shared by
    torchrun's ranks (``nmt.eval.generate_dataset``)."""
    from nmt import dist  # here: torch, which evaluating an export does without
    from nmt.eval.generate_dataset import (
        GenerationOptions,
        ModelInfo,
        generate_dataset,
        model_sha256,
    )

    assert io.output_dataset is not None and io.data_dir is not None
    path = io.path
    if cfg.sampling and os.path.isdir(path):
        raise ValueError(
            f"--sampling: {path} is an export, whose CTranslate2 sampler continues one stream per "
            "thread, so a resumed run would sample otherwise; sample with the checkpoint (beam works with both)"
        )
    # The group only synchronises the ranks' files (gloo); the model decodes on --device.
    with dist.session("cpu") as this_process:
        translator = load_translator(io, cfg, [path])
        # -s/-t: the direction (check_model holds -s to the monolingual text's language)
        direction = translator.direction(io.source_lang, io.target_lang, zero_shot=io.zero_shot)
        source_lang = io.source_lang or translator.languages.first.source
        target_lang = io.target_lang or translator.languages.first.target
        model = ModelInfo(
            path=path,
            source_lang=source_lang,
            target_lang=target_lang,
            sha256=model_sha256(path),
            direction=direction,
        )
        options = GenerationOptions(
            split=io.split,
            chunk_sentences=io.chunk_sentences,
            max_len_ratio=io.max_len_ratio,
            tag_source=io.tag_source,
            source_noise=io.source_noise,
            synthetic_side=io.synthetic_side,
        )
        manifest = generate_dataset(
            translator,
            model=model,
            data_dir=io.data_dir,
            destdir=io.output_dataset,
            cfg=cfg,
            options=options,
            overwrite=io.overwrite,
            rank=this_process.rank,
            world_size=this_process.world_size,
            barrier=dist.barrier if this_process.world_size > 1 else None,
        )
    if manifest is not None:
        entry = manifest.split("train")
        dropped = ", ".join(f"{k}={v}" for k, v in entry.filtered.items())
        print(
            f"wrote {manifest.directory}: {entry.num_samples} {manifest.source_lang}-{manifest.target_lang} "
            f"pairs from {entry.num_lines} lines (left out: {dropped})"
        )
    return 0
