"""A model exported by ``nmt-export`` to CTranslate2, which :class:`~nmt.eval.translate.Translator`
uses in place of our PyTorch model: CTranslate2 then runs the whole search of each batch.

The directory holds CTranslate2's files (``model.bin``, ``config.json``, the vocabularies) plus
ours: the SentencePiece model(s) and ``nmt_export.json`` (written last, so a directory that has it
is complete). The Translator encodes, batches, detokenizes and scores exactly as for a checkpoint;
:meth:`CT2Model.generate_batch` asks CTranslate2 for fairseq's conventions:

- the source is pieces + EOS (``add_source_eos`` in the model's config), the decoder starts from BOS;
- PAD and BOS are never generated, EOS not before ``--min-len`` tokens;
- scores are log-probability sums over the tokens *and* EOS divided by ``(tokens + 1) ** lenpen``
  (``return_end_token``: CTranslate2 then counts EOS in the length, as fairseq does);
- ``--max-len-a/b`` is a limit per sentence, while CTranslate2 takes one per call: a batch runs under
  its longest sentence's limit, and the few sentences that ran past their own are decoded again
  under theirs. At that limit CTranslate2 ends a hypothesis without scoring a forced EOS (ours
  scores it), so only such sentences may rank their beams differently.

Sampling draws from CTranslate2's generator (seeded from ``--seed`` once per process), so samples
differ from the PyTorch path's; greedy and beam search give the same outputs up to float rounding.
n-best lists may differ in their tails: at the step where a sentence completes its beam, CTranslate2
keeps every hypothesis that ended there and returns the best, where ours fills the free slots in
score order (fairseq's rule); the best hypothesis is the same.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from nmt.config import EvalConfig, ModelConfig, from_dict
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, SentencePieceModel
from nmt.eval.hypothesis import Hypothesis, max_target_lengths
from nmt.languages import Languages

EXPORT_MANIFEST = "nmt_export.json"
EXPORT_FORMAT = "nmt-ctranslate2"
EXPORT_VERSION = 1


def import_ctranslate2(what: str) -> Any:
    """The ``ctranslate2`` module, or a one-line ValueError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ValueError(f"{what} needs the ctranslate2 package: pip install 'nmt[ct2]'") from None
    return ctranslate2


def pieces(spm: SentencePieceModel) -> list[str]:
    """Id -> piece string: the vocabulary CTranslate2 is given (SentencePiece pieces are unique)."""
    return [spm.processor.id_to_piece(index) for index in range(spm.vocab_size)]


def read_export_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, EXPORT_MANIFEST)
    if not os.path.isfile(path):
        raise ValueError(
            f"{directory}: a directory, but not one written by nmt-export (no {EXPORT_MANIFEST})"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: unreadable export manifest ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: not an nmt export manifest (no '{EXPORT_FORMAT}' marker)")
    if manifest.get("version") != EXPORT_VERSION:
        raise ValueError(
            f"{path}: export version {manifest.get('version')}, this nmt reads version {EXPORT_VERSION}"
        )
    if manifest.get("special_ids") != SPECIAL_IDS:
        raise ValueError(
            f"{path}: special ids {manifest.get('special_ids')} differ from the toolkit's {SPECIAL_IDS}"
        )
    return manifest


def _device_and_index(device: str, ctranslate2: Any) -> tuple[str, int]:
    """``--device`` as CTranslate2 names it: auto, cpu, cuda, ``cuda:1`` -> ("cuda", 1)."""
    count = ctranslate2.get_cuda_device_count()
    if device == "auto":
        return ("cuda" if count > 0 else "cpu"), 0
    match = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", device)
    if match is None:
        raise ValueError(f"--device {device}: CTranslate2 runs on cpu or cuda")
    device_type, index = match.group(1), int(match.group(2) or 0)
    if device_type == "cuda" and index >= count:
        available = (
            f"only {count} CUDA device(s) here"
            if count
            else "no CUDA device is available (use --device auto or cpu)"
        )
        raise ValueError(f"--device {device}: {available}")
    return device_type, index


class CT2Model:
    """The Translator's backend for an export: CTranslate2 runs the search of each whole batch."""

    forced_decoding = (
        False  # a teacher-forced forward (given targets scored) is what the export leaves out
    )

    def __init__(
        self,
        translator: Any,
        *,
        cfg: ModelConfig,
        src_spm: SentencePieceModel,
        tgt_spm: SentencePieceModel,
        name: str = "<ctranslate2 model>",
        languages: Languages,
    ) -> None:
        self.translator = translator  # a ctranslate2.Translator
        self.languages = languages
        self.cfg = cfg
        self.src_spm = src_spm
        self.tgt_spm = tgt_spm
        self.name = name
        self._src_pieces = pieces(src_spm)
        tgt_pieces = self._tgt_pieces = pieces(tgt_spm)
        self._tgt_ids = {piece: index for index, piece in enumerate(tgt_pieces)}
        # one-token sequences: always suppressed (the tags too: never in any output)
        self._banned = [
            [tgt_pieces[PAD_ID]],
            [tgt_pieces[BOS_ID]],
            *([tag] for tag in tgt_spm.tags),
        ]

    @classmethod
    def load(
        cls, directory: str, *, device: str = "cpu", compute_type: str = "default", threads: int = 0
    ) -> CT2Model:
        """Load an exported directory; ``compute_type`` "default" runs the type it was exported with.
        ``threads`` 0: OMP_NUM_THREADS when set, else one per core this process may run on."""
        manifest = read_export_manifest(directory)
        ctranslate2 = import_ctranslate2(f"{directory} (a CTranslate2 export)")
        src_spm = SentencePieceModel.load(os.path.join(directory, manifest["src_spm"]))
        tgt_spm = SentencePieceModel.load(os.path.join(directory, manifest["tgt_spm"]))
        device_type, device_index = _device_and_index(device, ctranslate2)
        if not threads and "OMP_NUM_THREADS" not in os.environ:
            # CTranslate2's own default is 4 threads whatever the machine: on 2 cores, OpenMP threads
            # spinning against each other (as torch, one per core).
            threads = len(os.sched_getaffinity(0))
        try:
            translator = ctranslate2.Translator(
                directory,
                device=device_type,
                device_index=device_index,
                compute_type=compute_type,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError) as error:
            raise ValueError(
                f"{directory}: CTranslate2 cannot load this model ({str(error).strip().splitlines()[0]})"
            ) from None
        cfg = from_dict(ModelConfig, manifest["model_config"])
        logging.getLogger("nmt.eval").info(
            "decoding on %s with CTranslate2 (%s)", device_type, translator.compute_type
        )
        return cls(
            translator,
            cfg=cfg,
            src_spm=src_spm,
            tgt_spm=tgt_spm,
            name=directory,
            languages=Languages.from_vocab({**manifest, **manifest.get("languages", {})}),
        )

    @property
    def max_source_positions(self) -> int:
        return self.cfg.max_source_positions

    @property
    def max_target_positions(self) -> int:
        return self.cfg.max_target_positions

    def searcher(
        self, cfg: EvalConfig
    ) -> Callable[[list[np.ndarray], np.ndarray], list[list[Hypothesis]]]:
        """The search of one batch (sources, EOS last, cut to lengths) under ``cfg``."""
        return functools.partial(self.generate_batch, cfg=cfg)

    def generate_batch(
        self,
        sources: list[np.ndarray],
        lengths: np.ndarray,
        first_tokens: list[int] | None = None,
        *,
        cfg: EvalConfig,
    ) -> list[list[Hypothesis]]:
        """Sources (EOS last) cut to ``lengths`` -> n-best hypotheses each; sentences that ran past their
        own length limit go again under it. ``first_tokens``: each output's forced first token
        (CTranslate2's ``target_prefix``: a decoder-side language tag), left out of the output."""
        tokens = [
            [self._src_pieces[i] for i in source[: length - 1]]
            for source, length in zip(sources, lengths)
        ]
        prefixes = None if first_tokens is None else [[self._tgt_pieces[i]] for i in first_tokens]
        # The forced first token (if any) is CTranslate2's target_prefix: it counts towards
        # CTranslate2's length limit, not towards ours (as in the PyTorch search).
        forced = 0 if prefixes is None else 1
        max_len = max_target_lengths(
            lengths, cfg, max_positions=self.cfg.max_target_positions - forced
        )
        # CTranslate2's limit counts EOS; ours counts the tokens before the EOS that ends them.
        results = self._search(
            tokens, cfg, max_decoding_length=int(max_len.max()) + 1 + forced, target_prefix=prefixes
        )
        results = [[(ids[forced:], score) for ids, score in nbest] for nbest in results]
        # A hypothesis of n tokens ended at step n (EOS) or was cut there: still running at step max_len.
        overran = [
            i for i, nbest in enumerate(results) if max(len(ids) for ids, _ in nbest) >= max_len[i]
        ]
        for limit in sorted({int(max_len[i]) for i in overran}):
            again = [i for i in overran if max_len[i] == limit]
            # Under a limit of `limit` steps, hypotheses still running are cut at `limit` tokens, where
            # ours end with a forced EOS.
            redone = self._search(
                [tokens[i] for i in again],
                cfg,
                max_decoding_length=max(limit, 1) + forced,
                target_prefix=None if prefixes is None else [prefixes[i] for i in again],
            )
            for i, nbest in zip(again, redone):
                results[i] = [(ids[forced:][:limit], score) for ids, score in nbest]
        return [
            [Hypothesis(tokens=ids, score=score) for ids, score in nbest[: cfg.nbest]]
            for nbest in results
        ]

    def _search(
        self,
        tokens: list[list[str]],
        cfg: EvalConfig,
        *,
        max_decoding_length: int,
        target_prefix: list[list[str]] | None = None,
    ) -> list[list[tuple[list[int], float]]]:
        """Per sentence, every hypothesis CTranslate2 returns as (ids without EOS, score), best first.

        The length of a hypothesis counts its EOS (it is the number of decoding steps it took).
        """
        sampling_topk = (cfg.topk or 0) if cfg.sampling else 1
        if cfg.sampling:
            # CTranslate2 seeds each decoding thread's generator once, at its first draw: --seed makes
            # a process's sampling reproducible, but a later call continues that thread's stream.
            import ctranslate2

            ctranslate2.set_random_seed(cfg.seed)
        try:
            outputs = self.translator.translate_batch(
                tokens,
                **({} if target_prefix is None else {"target_prefix": target_prefix}),
                beam_size=1 if cfg.sampling else cfg.beam,
                # All beams (or samples): the caller keeps nbest, and needs them all to see overruns.
                num_hypotheses=1 if cfg.sampling and sampling_topk == 1 else cfg.beam,
                length_penalty=cfg.lenpen,
                no_repeat_ngram_size=cfg.no_repeat_ngram_size,
                suppress_sequences=self._banned,
                return_end_token=True,
                max_input_length=0,  # the caller truncated to the model's positions
                max_decoding_length=max_decoding_length,
                min_decoding_length=min(cfg.min_len, max_decoding_length),
                return_scores=True,
                sampling_topk=sampling_topk,
                sampling_topp=cfg.topp,
                sampling_temperature=cfg.temperature,
            )
        except (RuntimeError, ValueError) as error:
            raise ValueError(
                f"{self.name}: CTranslate2 decoding failed ({str(error).strip().splitlines()[0]})"
            ) from None
        results = []
        for output in outputs:
            nbest = []
            for hypothesis, score in zip(output.hypotheses, output.scores):
                ids = [self._tgt_ids[piece] for piece in hypothesis]
                nbest.append((ids[:-1] if ids and ids[-1] == EOS_ID else ids, float(score)))
            results.append(nbest)
        return results
