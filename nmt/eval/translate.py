"""Translator: checkpoint(s) -> text in, text out. Also the Python API.

    translator = nmt.Translator.from_checkpoint("runs/ckpt/checkpoint_best.pt", device="cpu")
    translator.translate(["A man is riding a bike."], beam=5)   # -> ["Ein Mann fährt Fahrrad."]
    translator.translate("A man is riding a bike.")             # one sentence -> one str
    translator.translate("A man is riding a bike.", constraints=["Rad"])  # lexical constraints
    translator.translate("A man is riding a bike.", constraints=["Rad"], constraints_mode="annotate")
    translator.translate("A man is riding a bike.", glossary={"bike": "Rad"})  # terms (nmt.data.terminology)
    translator.score(hypotheses, references)                    # -> [BLEU, chrF2] with signatures
    Translator.from_checkpoint(["a.pt", "b.pt"])                 # an ensemble (mean of probabilities)
    Translator.from_checkpoint(["a.pt", "b.pt"], average=True)   # one model, weights averaged

The checkpoint carries its SentencePiece models, so raw text needs no data directory. Sentences are
decoded in batches of similar source length (sorted, so little padding) and returned in input
order; an empty line (no pieces) gives an empty translation without reaching the model. Forced
decoding (``score_targets``) gives per-token scores and alignments of given targets: fairseq's
P- and A- lines and ``--score-reference``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, overload

import numpy as np
from tqdm import tqdm

from nmt.config import GLOSSARY_MODES, EvalConfig
from nmt.data.batching import greedy_offsets
from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import Manifest
from nmt.data.spm import EOS_ID, PAD_ID, TERM_TAG, SentencePieceModel
from nmt.data.terminology import Glossary, append_terms
from nmt.data.text import decode_lines, read_raw_lines, resolve_text_file
from nmt.eval.constraint_input import check_phrases
from nmt.eval.ct2_model import CT2Model, read_export_manifest
from nmt.eval.hypothesis import Hypothesis, LengthLimitError, check_min_len
from nmt.eval.score import Score, score
from nmt.languages import BILINGUAL, Direction, Languages

if TYPE_CHECKING:  # torch is imported for checkpoints only: an exported model translates without it
    import torch

    from nmt.eval.torch_model import TorchModels
    from nmt.model import TransformerModel

logger = logging.getLogger(__name__)
UNLIMITED = np.iinfo(np.int64).max  # no token budget: --batch-size alone caps a batch


def iter_line_chunks(stream: BinaryIO, *, size: int, name: str) -> Iterator[list[str]]:
    """Lines of ``stream`` in chunks of ``size``, split on ``\\n`` only (as ``nmt.data.text`` does)."""
    chunk: list[str] = []
    lines = iter(stream)  # binary iteration splits on b"\n" only
    for number in itertools.count(1):
        try:
            raw = next(lines)
        except StopIteration:
            break
        except Exception as error:  # a truncated or corrupt .gz/.xz/.zst
            raise ValueError(
                f"{name}: cannot read line {number} ({number - 1} lines decoded before it): {error}"
            ) from None
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            chunk.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{name}:{number}: invalid UTF-8 ({error.reason} at byte {error.start})"
            ) from None
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class Translation:
    text: str  # detokenized
    score: float  # natural log: sum of the token log-probabilities (EOS included) / (len(tokens) + 1) ** lenpen
    tokens: list[int]  # piece ids, EOS excluded
    # Filled by ``Translator.add_token_scores`` (fairseq's P- and A- lines), else None:
    positional_scores: list[float] | None = None  # natural log, one per token and one for EOS
    alignment: list[tuple[int, int]] | None = (
        None  # (source position, target position), EOS excluded
    )


@dataclass
class TargetScore:
    """Forced decoding of one given target."""

    token_scores: np.ndarray  # (T,) float, natural log, EOS included
    attention: (
        np.ndarray | None
    )  # (T, S) cross-attention of each target token over the source (EOS included)


def hard_alignment(
    attention: np.ndarray, *, num_source_tokens: int, num_target_tokens: int
) -> list[tuple[int, int]]:
    """fairseq's hard alignment: each target token (EOS excluded) to the source token (EOS excluded)
    it attends to most; ``attention`` (T, S) rows are target positions, columns source positions."""
    if num_source_tokens == 0:
        return []
    best = attention[:num_target_tokens, :num_source_tokens].argmax(axis=1)
    return [(int(source), target) for target, source in enumerate(best)]


def _sentences(lines: str | Sequence[str]) -> tuple[list[str], bool]:
    """The sentences to translate and whether one ``str`` was given (one sentence, never its characters)."""
    if isinstance(lines, str):
        sentence = lines[:-1] if lines.endswith("\n") else lines
        if "\n" in sentence:
            raise ValueError(
                "translate: a str is one sentence, without '\\n' inside (pass text.split('\\n') for several)"
            )
        return [sentence], True
    sentences = list(lines)
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(
                f"translate: expected a str or a sequence of str, got a sequence holding {type(sentence).__name__}"
            )
    return sentences, False


def language_pair(path: str) -> tuple[str, str]:
    """(source, target) language of a checkpoint or an exported directory."""
    if os.path.isdir(path):
        manifest = read_export_manifest(path)
        return manifest["source_lang"], manifest["target_lang"]
    from nmt.checkpoint_io import (
        load_checkpoint,  # here: torch, which an exported model does without
    )

    vocab = load_checkpoint(path).get("vocab", {})
    return vocab.get("source_lang", "src"), vocab.get("target_lang", "tgt")


# The languages of a model given without them (built in Python): one direction, checkpoints' names.
UNNAMED = Languages.one_direction("src", "tgt")


class Translator:
    """Text in, text out, with one model or an ensemble of several (the mean of their probabilities)."""

    def __init__(
        self,
        model: TransformerModel | Sequence[TransformerModel] | CT2Model,
        *,
        src_spm: SentencePieceModel,
        tgt_spm: SentencePieceModel,
        config: EvalConfig | None = None,
        languages: Languages = UNNAMED,
    ) -> None:
        """``languages``: the model's directions and how each is asked for (the checkpoint's; an
        export carries its own)."""
        self.backend: TorchModels | CT2Model
        if isinstance(
            model, CT2Model
        ):  # an nmt-export directory: CTranslate2 runs the whole search
            self.backend = self.model = model
        else:
            from nmt.eval import torch_model  # here: the CTranslate2 path never imports torch

            self.backend = torch_model.TorchModels(
                model if isinstance(model, Sequence) else [model], banned=tgt_spm.tags.values()
            )
            self.model = self.backend.models[0]
        self.src_spm = src_spm
        self.tgt_spm = tgt_spm
        self.languages = model.languages if isinstance(model, CT2Model) else languages
        self.config = EvalConfig() if config is None else config
        self.check_sources([], self.config)  # a --min-len no output can meet fails here, at once

    def check_sources(
        self, sources: Sequence[np.ndarray], config: EvalConfig, *, truncate: bool = True
    ) -> None:
        """ValueError unless every source (ids, EOS last) can be translated under ``config``: a
        ``LengthLimitError`` names the first whose length limit is under --min-len, or without
        ``truncate`` the first longer than the model reads (which ``generate`` would cut)."""
        max_positions = self.backend.max_source_positions
        if not truncate:
            for index, source in enumerate(sources):
                if len(source) > max_positions:
                    raise LengthLimitError(
                        index,
                        f"{len(source) - 1} pieces long, over the {max_positions - 1} this model "
                        "reads; split it into shorter sentences",
                    )
        lengths = self._source_lengths(sources, warn=False)
        todo = np.flatnonzero(lengths > 1)  # empty lines are not decoded
        try:
            check_min_len(
                lengths[todo],
                config,
                max_source_positions=self.backend.max_source_positions,
                max_positions=self.backend.max_target_positions,
            )
        except LengthLimitError as error:
            raise LengthLimitError(int(todo[error.index]), error.reason) from None

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Sequence[str],
        *,
        device: str | torch.device = "cpu",
        config: EvalConfig | None = None,
        average: bool = False,
        dtype: str | torch.dtype | None = None,
    ) -> Translator:
        """One checkpoint, or several: an ensemble (fairseq's ``--path a.pt:b.pt``), or with
        ``average`` one model with their weights averaged. ``device``: also "auto" (CUDA when
        available). ``dtype``: e.g. "float16" weights on CUDA (ignored with a warning on the CPU). A
        directory written by ``nmt-export --format ctranslate2`` gives a Translator that decodes
        with CTranslate2 (the type it was exported with)."""
        paths = [path] if isinstance(path, str) else list(path)
        if not paths:
            raise ValueError("--path: no checkpoint given")
        directories = [p for p in paths if os.path.isdir(p)]
        if directories and len(paths) > 1:
            raise ValueError(
                f"--path {directories[0]}: an exported directory decodes alone (no ensemble, no average); pass checkpoint files"
            )
        if directories:
            if dtype is not None:
                logger.warning(
                    "%s: an export runs the type it was exported with; %s ignored", paths[0], dtype
                )
            exported = CT2Model.load(paths[0], device=str(device))
            return cls(exported, src_spm=exported.src_spm, tgt_spm=exported.tgt_spm, config=config)
        from nmt.eval import torch_model

        models, src_spm, tgt_spm, languages = torch_model.load_models(
            paths, device=device, average=average, dtype=dtype
        )
        return cls(models, src_spm=src_spm, tgt_spm=tgt_spm, config=config, languages=languages)

    def direction(
        self,
        source_lang: str | None = None,
        target_lang: str | None = None,
        *,
        zero_shot: bool = False,
    ) -> Direction:
        """How to ask for ``source_lang``-``target_lang``: a model of several directions needs both
        (one line naming its directions otherwise); one of one direction neither (given, they are
        checked)."""
        return self.languages.direction(source_lang, target_lang, zero_shot=zero_shot)

    @overload
    def translate(self, lines: str, *, progress: bool = False, **options: Any) -> str: ...
    @overload
    def translate(
        self, lines: Sequence[str], *, progress: bool = False, **options: Any
    ) -> list[str]: ...

    def translate(
        self,
        lines: str | Sequence[str],
        *,
        progress: bool = False,
        source_lang: str | None = None,
        target_lang: str | None = None,
        constraints: Sequence[str] | Sequence[Sequence[str]] | None = None,
        ordered_constraints: bool = False,
        constraints_mode: str = "constrain",
        glossary: Glossary | Mapping[str, str] | None = None,
        glossary_mode: str = "annotate",
        **options: Any,
    ) -> str | list[str]:
        """Best translation of each line (of the one sentence, given a ``str``); ``options`` override
        ``EvalConfig`` fields (beam=5, lenpen=...); a multilingual model needs the direction.

        ``constraints``: per line, phrases its translation must contain (given one ``str`` line:
        its phrases); ``ordered_constraints``: in that order (``nmt.eval.constraints``).
        ``constraints_mode``: ``constrain`` (the beam search), ``annotate`` (the phrases after
        ``<term>``, as --term-annotation-rate trains: any decoder) or ``both``.
        ``glossary``: source term -> target term, applied to each line where its source term
        occurs (``apply_terms`` says how ``glossary_mode`` applies it)."""
        sentences, single = _sentences(lines)
        best = [
            nbest[0].text
            for nbest in self.translate_nbest(
                lines if single else sentences,  # the str itself: its constraints are one list
                progress=progress,
                source_lang=source_lang,
                target_lang=target_lang,
                constraints=constraints,
                ordered_constraints=ordered_constraints,
                constraints_mode=constraints_mode,
                glossary=glossary,
                glossary_mode=glossary_mode,
                **options,
            )
        ]
        return best[0] if single else best

    def translate_nbest(
        self,
        lines: str | Sequence[str],
        *,
        progress: bool = False,
        source_lang: str | None = None,
        target_lang: str | None = None,
        constraints: Sequence[str] | Sequence[Sequence[str]] | None = None,
        ordered_constraints: bool = False,
        constraints_mode: str = "constrain",
        glossary: Glossary | Mapping[str, str] | None = None,
        glossary_mode: str = "annotate",
        **options: Any,
    ) -> list[list[Translation]]:
        """Per line, ``nbest`` translations, best first (a ``str`` is one line); ``constraints``
        and ``glossary`` as ``translate`` takes them."""
        sentences, single = _sentences(lines)
        direction = self.direction(source_lang, target_lang)
        sources = self.encode(sentences, direction=direction)
        phrases = None
        if constraints is not None:
            lines_phrases = [constraints] if single else constraints
            phrases = self.encode_constraints(lines_phrases)  # also checks each phrase
            if constraints_mode != "constrain":
                sources, phrases = self.apply_target_terms(
                    sources, lines_phrases, mode=constraints_mode, what="constraints"
                )
        if glossary is not None:
            found = Glossary(glossary) if not isinstance(glossary, Glossary) else glossary
            sources, phrases = self.apply_terms(
                sources,
                [found.matches(sentence) for sentence in sentences],
                mode=glossary_mode,
                constraints=phrases,
            )
        return self.detokenize(
            self.generate(
                sources,
                progress=progress,
                first_tokens=self.first_tokens(direction, len(sources)),
                constraints=phrases,
                ordered_constraints=ordered_constraints,
                **options,
            )
        )

    def encode_constraints(
        self, phrases: Sequence[Sequence[str]], *, where: Callable[[int], str] | None = None
    ) -> list[list[list[int]]]:
        """Per sentence, its constraint phrases as target pieces; a phrase with none is a ValueError
        naming ``where(index)`` (default: "constraints of sentence N")."""
        encoded = []
        for index, sentence_phrases in enumerate(phrases):
            if isinstance(sentence_phrases, str):
                raise TypeError(
                    "constraints: per sentence, a sequence of phrases (a str alone would be its characters)"
                )
            pieces = self.tgt_spm.encode(list(sentence_phrases))
            check_phrases(
                pieces,
                where=f"constraints of sentence {index + 1}" if where is None else where(index),
            )
            encoded.append(pieces)
        return encoded

    def check_glossary_mode(self, mode: str, *, option: str = "glossary mode") -> None:
        """ValueError (one line, naming ``option``) unless this model can apply glossary terms in
        ``mode`` (``apply_terms``): ``annotate`` needs the ``<term>`` tag in the vocabulary,
        ``constrain`` the beam search of a PyTorch checkpoint."""
        if mode not in GLOSSARY_MODES:
            raise ValueError(f"{option}: must be one of {', '.join(GLOSSARY_MODES)}, got {mode!r}")
        if mode != "constrain" and TERM_TAG not in self.src_spm.tags:
            raise ValueError(
                f"{option} {mode}: this model's vocabulary has no {TERM_TAG} tag (its data was "
                "preprocessed by an older nmt), so it cannot read annotated terms; apply the "
                "terms as constraints (mode constrain) instead"
            )
        if mode != "annotate":
            self.check_constraints(option=f"{option} {mode}")

    def apply_terms(
        self,
        sources: Sequence[np.ndarray],
        terms: Sequence[Sequence[tuple[str, str]]],
        *,
        mode: str = "annotate",
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> tuple[list[np.ndarray], list[list[list[int]]] | None]:
        """Each source (ids, EOS last) with its sentence's glossary ``terms`` ((source term, target
        term) found by ``Glossary.matches``) applied: ``annotate``: the target terms after the
        ``<term>`` tag (a model trained with --term-annotation-rate follows them, in any decoder);
        ``constrain``: as lexical constraints (beam search, PyTorch only), added to
        ``constraints``; ``both``. Returns the sources and the constraints (None if none)."""
        return self.apply_target_terms(
            sources,
            [[target for _, target in found] for found in terms],
            mode=mode,
            constraints=constraints,
        )

    def apply_target_terms(
        self,
        sources: Sequence[np.ndarray],
        targets: Sequence[Sequence[str]],
        *,
        mode: str = "annotate",
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
        what: str = "glossary",
    ) -> tuple[list[np.ndarray], list[list[list[int]]] | None]:
        """``apply_terms`` given each sentence's target terms alone (``translate``'s constraints,
        the terms a benchmark draws from references); errors name ``what``."""
        self.check_glossary_mode(mode, option=f"{what} mode")
        if len(targets) != len(sources):
            raise ValueError(f"{what}: {len(targets)} term lists for {len(sources)} sentences")
        annotated = list(sources)
        if mode != "constrain":
            tag = self.src_spm.tags[TERM_TAG]
            annotated = [
                append_terms(source, self.src_spm.encode(found), tag=tag) if found else source
                for source, found in zip(sources, targets)
            ]
        if mode == "annotate":
            return annotated, None if constraints is None else [list(c) for c in constraints]
        added = [self.tgt_spm.encode(found) if found else [] for found in targets]
        previous = constraints or [[] for _ in sources]
        return annotated, [[*map(list, old), *new] for old, new in zip(previous, added)]

    def encode(self, lines: Sequence[str], *, direction: Direction = BILINGUAL) -> list[np.ndarray]:
        """Source token ids of raw lines, EOS included, as ``generate`` takes them; a multilingual
        direction's source tag first. Text never encodes to a tag (they are control symbols)."""
        return list(
            direction.prefixed(
                [np.array(ids + [EOS_ID], dtype=np.int64) for ids in self.src_spm.encode(lines)]
            )
        )

    @staticmethod
    def first_tokens(direction: Direction, count: int) -> list[int] | None:
        """``generate``'s ``first_tokens`` for ``count`` sources of one direction."""
        return None if direction.first_token is None else [direction.first_token] * count

    def detokenize(self, hypotheses: list[list[Hypothesis]]) -> list[list[Translation]]:
        texts = iter(self.tgt_spm.decode([hyp.tokens for nbest in hypotheses for hyp in nbest]))
        return [
            [Translation(text=next(texts), score=hyp.score, tokens=hyp.tokens) for hyp in nbest]
            for nbest in hypotheses
        ]

    def generate(
        self,
        sources: Sequence[np.ndarray],
        *,
        progress: bool = False,
        first_tokens: Sequence[int] | None = None,
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
        ordered_constraints: bool = False,
        **options: Any,
    ) -> list[list[Hypothesis]]:
        """Token ids (each ending with EOS) -> ``nbest`` hypotheses per source, in input order.
        ``first_tokens``: per source, its forced first output token (a decoder-side language tag,
        left out of the hypotheses); sources of different directions may share a call.
        ``constraints``: per source, phrases (target piece ids) every hypothesis must contain
        (lexically constrained beam search, ``nmt.eval.constraints``)."""
        cfg = dataclasses.replace(self.config, **options)
        if constraints is not None:
            self.check_constraints(cfg)
            if len(constraints) != len(sources):
                raise ValueError(
                    f"constraints: {len(constraints)} lists for {len(sources)} sentences; one per sentence"
                )
        self.check_sources(sources, cfg)
        lengths = self._source_lengths(sources)
        results: list[list[Hypothesis]] = [[Hypothesis(tokens=[], score=0.0)] for _ in sources]
        # EOS alone: an empty line translates to an empty line, unless it has constraints to meet.
        decoded = lengths > 1
        if constraints is not None:
            decoded |= np.array([len(phrases) > 0 for phrases in constraints], dtype=bool)
        todo = np.flatnonzero(decoded)
        search = (
            self.backend.searcher(cfg)
            if constraints is None
            else self.backend.searcher(cfg, ordered_constraints=ordered_constraints)
        )
        with tqdm(
            total=len(todo),
            unit="sent",
            desc="decode",
            disable=not progress,
            mininterval=1.0,
            leave=False,
        ) as bar:
            for indices in _batches(todo, lengths, lengths, cfg):
                batch = [sources[i] for i in indices]
                batch_first_tokens = (
                    None if first_tokens is None else [first_tokens[i] for i in indices]
                )
                found = (
                    search(batch, lengths[indices], batch_first_tokens)
                    if constraints is None
                    else search(
                        batch,
                        lengths[indices],
                        batch_first_tokens,
                        [list(constraints[i]) for i in indices],
                    )
                )
                for index, nbest in zip(indices, found):
                    results[index] = nbest
                bar.update(len(indices))
        return results

    def check_constraints(
        self, cfg: EvalConfig | None = None, *, option: str = "--constraints"
    ) -> None:
        """ValueError (one line, naming ``option``) unless this backend can search lexical
        constraints under ``cfg`` (default: the Translator's own)."""
        if isinstance(self.backend, CT2Model):
            raise ValueError(
                f"{option}: {self.backend.name} is a CTranslate2 export, which has no lexical "
                "constraints; decode with the PyTorch checkpoint"
            )
        if (cfg or self.config).sampling:
            raise ValueError(f"{option}: beam search only, not with --sampling")

    def require_forced_decoding(self) -> None:
        """Raise (one line) unless the backend can score given targets: fairseq's P-/A- lines and
        --score-reference need it, and an export only translates."""
        if not self.backend.forced_decoding:
            raise ValueError(
                f"{self.model.name}: scoring given targets (--format fairseq, --print-alignment, --score-reference) "
                "needs the PyTorch checkpoint; an exported directory only translates"
            )

    def score_targets(
        self,
        sources: Sequence[np.ndarray],
        targets: Sequence[Sequence[int]],
        *,
        need_attention: bool = False,
        progress: bool = False,
        first_tokens: Sequence[int] | None = None,
    ) -> list[TargetScore]:
        """Forced decoding: the log-probability of every token of each target (ids, EOS included)
        given its source, from the ensemble, batched like ``generate``; with ``need_attention``
        also the last decoder layer's cross-attention. Targets longer than the model's positions
        are scored on their first positions only (counted in a warning). ``first_tokens``: per
        target, the decoder-side language tag the model reads before it, left out of the scores
        as ``generate`` leaves it out of the hypotheses."""
        self.require_forced_decoding()
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets: they must align")
        forced = 0
        if first_tokens is not None:
            forced = 1
            targets = [
                [first, *target] for first, target in zip(first_tokens, targets, strict=True)
            ]
        cfg = self.config
        src_lengths = self._source_lengths(sources)
        max_target = self.backend.max_target_positions
        tgt_lengths = np.fromiter(
            (len(target) for target in targets), dtype=np.int64, count=len(targets)
        )
        num_truncated = int((tgt_lengths > max_target).sum())
        if num_truncated:
            logger.warning(
                "%d targets longer than %d tokens are scored on their first %d tokens",
                num_truncated,
                max_target,
                max_target,
            )
            tgt_lengths = np.minimum(tgt_lengths, max_target)
        results = [TargetScore(np.zeros(0, dtype=np.float32), None) for _ in targets]
        with tqdm(
            total=len(targets),
            unit="sent",
            desc="score",
            disable=not progress,
            mininterval=1.0,
            leave=False,
        ) as bar:
            for indices in _batches(np.flatnonzero(tgt_lengths > 0), src_lengths, tgt_lengths, cfg):
                target = np.full(
                    (len(indices), int(tgt_lengths[indices].max())), PAD_ID, dtype=np.int64
                )
                for row, index in enumerate(indices):
                    target[row, : tgt_lengths[index]] = targets[index][: tgt_lengths[index]]
                scores_np, attention_np = self.backend.score_batch(
                    [sources[i] for i in indices],
                    src_lengths[indices],
                    target,
                    temperature=cfg.temperature,
                    need_attention=need_attention,
                )
                for row, index in enumerate(indices):
                    length, source_length = int(tgt_lengths[index]), int(src_lengths[index])
                    results[index] = TargetScore(
                        token_scores=scores_np[row, forced:length],
                        attention=None
                        if attention_np is None
                        else attention_np[row, forced:length, :source_length],
                    )
                bar.update(len(indices))
        return results

    def add_token_scores(
        self,
        sources: Sequence[np.ndarray],
        translations: Sequence[Sequence[Translation]],
        *,
        alignment: bool = False,
        first_tokens: Sequence[int] | None = None,
    ) -> None:
        """Fill each translation's ``positional_scores`` (and ``alignment``) by forced decoding of its
        tokens, as fairseq-generate prints them; translations of empty sources (not decoded) get none.
        ``first_tokens``: per source, as ``generate`` took them."""
        pairs = [
            (index, translation)
            for index, nbest in enumerate(translations)
            if len(sources[index]) > 1
            for translation in nbest
        ]
        scored = self.score_targets(
            [sources[index] for index, _ in pairs],
            [t.tokens + [EOS_ID] for _, t in pairs],
            need_attention=alignment,
            first_tokens=None if first_tokens is None else [first_tokens[i] for i, _ in pairs],
        )
        for nbest in translations:
            for translation in nbest:
                translation.positional_scores, translation.alignment = (
                    [],
                    ([] if alignment else None),
                )
        for (index, translation), result in zip(pairs, scored):
            translation.positional_scores = result.token_scores.tolist()
            if alignment:
                assert result.attention is not None
                translation.alignment = hard_alignment(
                    result.attention,
                    num_source_tokens=len(sources[index]) - 1,
                    num_target_tokens=len(translation.tokens),
                )

    def score_references(
        self,
        sources: Sequence[np.ndarray],
        references: Sequence[str],
        *,
        alignment: bool = False,
        first_tokens: Sequence[int] | None = None,
    ) -> list[Translation]:
        """fairseq's ``--score-reference``: each raw reference line scored as the translation of its
        source (forced decoding), with the hypotheses' score rule (sum / length ** lenpen);
        ``first_tokens`` as ``generate`` takes them."""
        targets = [ids + [EOS_ID] for ids in self.tgt_spm.encode(references)]
        scores = self.score_targets(
            sources, targets, need_attention=alignment, first_tokens=first_tokens
        )
        results = []
        for index, (reference, target, scored) in enumerate(zip(references, targets, scores)):
            length = len(scored.token_scores)
            results.append(
                Translation(
                    text=reference,
                    score=float(scored.token_scores.sum()) / length**self.config.lenpen,
                    tokens=target[:-1],
                    positional_scores=scored.token_scores.tolist(),
                    alignment=None
                    if scored.attention is None
                    else hard_alignment(
                        scored.attention,
                        num_source_tokens=len(sources[index]) - 1,
                        num_target_tokens=length - 1,
                    ),
                )
            )
        return results

    def _source_lengths(self, sources: Sequence[np.ndarray], *, warn: bool = True) -> np.ndarray:
        """Source lengths (EOS included), cut to the models' positions (counted in a warning)."""
        max_positions = self.backend.max_source_positions
        lengths = np.fromiter(
            (len(source) for source in sources), dtype=np.int64, count=len(sources)
        )
        num_truncated = int((lengths > max_positions).sum())
        if num_truncated and warn:
            logger.warning(
                "%d source sentences longer than %d tokens are truncated",
                num_truncated,
                max_positions,
            )
        return np.minimum(lengths, max_positions)

    def score(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        *,
        tokenized_lowercase: bool = False,
    ) -> list[Score]:
        """sacreBLEU BLEU and chrF (cased, detokenized), with signatures."""
        return score(hypotheses, references, tokenized_lowercase=tokenized_lowercase)


def _batches(
    indices: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, cfg: EvalConfig
) -> Iterator[np.ndarray]:
    """``indices`` in batches, longest first (similar lengths share a batch, so a batch's padded cost
    is its size x its first length), cut under --max-tokens and --batch-size by the training batcher."""
    longest = np.maximum(src_lengths, tgt_lengths)
    order = indices[np.argsort(-longest[indices], kind="stable")]
    offsets = greedy_offsets(
        src_lengths[order],
        tgt_lengths[order],
        cfg.max_tokens or UNLIMITED,
        packed=False,
        max_sentences=cfg.batch_size,
    )
    for start, stop in zip(offsets[:-1], offsets[1:]):
        yield order[start:stop]


@dataclass
class Split:
    sources: list[np.ndarray]  # token ids, EOS included, in line order
    line_numbers: np.ndarray  # (N,) line of each source in the raw text (for the references)
    reference_path: (
        str | None
    )  # the raw target text: the dataset's own copy, or (older datasets) the file it was made from
    num_lines: int  # lines of the raw text the split was made from: a reference must have as many


def load_split(
    data_dir: str, split: str, *, src_spm: SentencePieceModel, manifest: Manifest | None = None
) -> Split:
    """The binarized sources of a split, checked to be encoded with the checkpoint's SentencePiece model
    (otherwise the ids would mean other pieces), and where its raw reference text lies. ``manifest``:
    the dataset's, when the caller has read it already."""
    corpus = ParallelCorpus(data_dir, split, manifest=manifest)
    manifest = corpus.manifest
    spm_path = manifest.path(manifest.spm.src_model)
    with open(spm_path, "rb") as handle:
        if handle.read() != src_spm.proto:
            raise ValueError(
                f"{spm_path}: not the checkpoint's source SentencePiece model; this data was encoded for "
                "another model (translate its raw text with --input instead)"
            )
    entry = corpus.entry
    if entry.reference:  # carried inside the dataset: it scores wherever the directory is
        reference_path: str | None = manifest.path(entry.reference)
    else:  # a dataset from before references were stored
        reference_path = (
            None
            if entry.input_prefix is None
            else resolve_text_file(entry.input_prefix, manifest.target_lang)
        )
    return Split(
        sources=[np.asarray(corpus.src[i], dtype=np.int64) for i in range(len(corpus))],
        line_numbers=np.asarray(corpus.line_numbers),
        reference_path=reference_path,
        num_lines=corpus.entry.num_lines,
    )


def read_references(
    path: str, *, num_lines: int | None = None, line_numbers: np.ndarray | None = None
) -> list[str]:
    """Raw reference lines (split on ``\\n`` only, ``.gz`` allowed), optionally the given lines only.

    ``num_lines``: the line count of the source text; a reference with another count is refused (a
    longer or shorter file is the wrong file, whose score would be silently meaningless).
    """
    references = decode_lines(read_raw_lines(path), path=path, replace_invalid=True).lines
    if num_lines is not None and len(references) != num_lines:
        raise ValueError(
            f"{path}: the reference has {len(references)} lines but the source has {num_lines}; they must align line for line"
        )
    if line_numbers is None:
        return references
    if len(line_numbers) and int(line_numbers.max()) >= len(references):
        raise ValueError(
            f"{path}: {len(references)} lines, but the split has a sentence from line {int(line_numbers.max()) + 1}"
        )
    return [references[i] for i in line_numbers]
