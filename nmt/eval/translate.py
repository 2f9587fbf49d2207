"""Translator: a checkpoint (or an average of several) -> text in, text out. Also the Python API.

    translator = nmt.Translator.from_checkpoint("runs/ckpt/checkpoint_best.pt", device="cpu")
    translator.translate(["A man is riding a bike."], beam=5)   # -> ["Ein Mann fährt Fahrrad."]
    translator.score(hypotheses, references)                    # -> [BLEU, chrF2] with signatures

The checkpoint carries its SentencePiece models, so raw text needs no data directory. Sentences are
decoded in batches of similar source length (sorted, so little padding) and returned in input
order; an empty line (no pieces) gives an empty translation without reaching the model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import torch
from tqdm import tqdm

from nmt.checkpoint_io import load_averaged_checkpoint, tensor_to_bytes
from nmt.config import EvalConfig, ModelConfig, from_dict
from nmt.data.batching import greedy_offsets
from nmt.data.corpus import ParallelCorpus
from nmt.data.spm import EOS_ID, PAD_ID, SPECIAL_IDS, SentencePieceModel
from nmt.data.text import decode_lines, read_raw_lines, resolve_text_file
from nmt.eval.score import Score, score
from nmt.eval.search import Hypothesis, generate
from nmt.model import TransformerModel, build_model

if TYPE_CHECKING:
    from nmt.eval.ct2_model import CT2Model

logger = logging.getLogger(__name__)
UNLIMITED = np.iinfo(np.int64).max  # no token budget: --batch-size alone caps a batch

def iter_line_chunks(stream: BinaryIO, *, size: int, name: str) -> Iterator[list[str]]:
    """Lines of ``stream`` in chunks of ``size``, split on ``\\n`` only (as ``nmt.data.text`` does)."""
    chunk: list[str] = []
    for number, raw in enumerate(stream, start=1):  # binary iteration splits on b"\n" only
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            chunk.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(f"{name}:{number}: invalid UTF-8 ({error.reason} at byte {error.start})") from None
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class Translation:
    text: str  # detokenized
    score: float
    tokens: list[int]  # generated piece ids, EOS excluded


class Translator:
    def __init__(
        self,
        model: TransformerModel | CT2Model,
        *,
        src_spm: SentencePieceModel,
        tgt_spm: SentencePieceModel,
        config: EvalConfig | None = None,
    ) -> None:
        self.model = model.eval()
        # A CT2Model (an nmt-export directory) runs its own search; the host device then only holds
        # the sampling generator, which CTranslate2 does not use.
        self.device = next(model.parameters()).device if isinstance(model, TransformerModel) else torch.device("cpu")
        self.src_spm = src_spm
        self.tgt_spm = tgt_spm
        self.config = EvalConfig() if config is None else config

    @classmethod
    def from_checkpoint(
        cls, path: str | Sequence[str], *, device: str | torch.device = "cpu", config: EvalConfig | None = None
    ) -> Translator:
        """Load one checkpoint, or average several (a list of paths); a directory written by
        ``nmt-export --format ctranslate2`` gives a Translator that decodes with CTranslate2."""
        paths = [path] if isinstance(path, str) else list(path)
        if len(paths) == 1 and os.path.isdir(paths[0]):
            from nmt.eval.ct2_model import CT2Model  # lazy: ctranslate2 is an optional extra

            exported = CT2Model.load(paths[0], device=device)
            return cls(exported, src_spm=exported.src_spm, tgt_spm=exported.tgt_spm, config=config)
        state = load_averaged_checkpoint(paths)
        # Incremental decoding runs on the padded layout; let the device pick its backend (a model
        # trained with --attention varlen or xformers on GPU must still decode on a CPU).
        model_cfg = dataclasses.replace(from_dict(ModelConfig, state["model_config"]), attention="auto")
        model = build_model(model_cfg)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as error:
            raise ValueError(f"{paths[0]}: weights do not match the checkpoint's model config ({str(error).splitlines()[0]})") from None
        vocab = state["vocab"]
        if vocab.get("special_ids") != SPECIAL_IDS:
            raise ValueError(f"{paths[0]}: special ids {vocab.get('special_ids')} differ from the toolkit's {SPECIAL_IDS}")
        src_spm = SentencePieceModel(tensor_to_bytes(vocab["src_spm"]), name=f"{paths[0]} (source SentencePiece model)")
        tgt_spm = SentencePieceModel(tensor_to_bytes(vocab["tgt_spm"]), name=f"{paths[0]} (target SentencePiece model)")
        return cls(model.to(device), src_spm=src_spm, tgt_spm=tgt_spm, config=config)

    def translate(self, lines: Sequence[str], *, progress: bool = False, **options: Any) -> list[str]:
        """Best translation of each line; ``options`` override ``EvalConfig`` fields (beam=5, lenpen=...)."""
        return [nbest[0].text for nbest in self.translate_nbest(lines, progress=progress, **options)]

    def translate_nbest(self, lines: Sequence[str], *, progress: bool = False, **options: Any) -> list[list[Translation]]:
        """Per line, ``nbest`` translations, best first."""
        sources = [np.array(ids + [EOS_ID], dtype=np.int64) for ids in self.src_spm.encode(lines)]
        return self.detokenize(self.generate(sources, progress=progress, **options))

    def detokenize(self, hypotheses: list[list[Hypothesis]]) -> list[list[Translation]]:
        texts = iter(self.tgt_spm.decode([hyp.tokens for nbest in hypotheses for hyp in nbest]))
        return [[Translation(text=next(texts), score=hyp.score, tokens=hyp.tokens) for hyp in nbest] for nbest in hypotheses]

    def generate(self, sources: Sequence[np.ndarray], *, progress: bool = False, **options: Any) -> list[list[Hypothesis]]:
        """Token ids (each ending with EOS) -> ``nbest`` hypotheses per source, in input order."""
        cfg = dataclasses.replace(self.config, **options)
        max_positions = self.model.cfg.max_source_positions
        lengths = np.fromiter((len(source) for source in sources), dtype=np.int64, count=len(sources))
        num_truncated = int((lengths > max_positions).sum())
        if num_truncated:
            logger.warning("%d source sentences longer than %d tokens are truncated", num_truncated, max_positions)
            lengths = np.minimum(lengths, max_positions)
        results: list[list[Hypothesis]] = [[Hypothesis(tokens=[], score=0.0)] for _ in sources]
        todo = np.flatnonzero(lengths > 1)  # EOS alone: an empty line translates to an empty line
        order = todo[np.argsort(-lengths[todo], kind="stable")]  # longest first: similar lengths share a batch
        generator = torch.Generator(self.device).manual_seed(cfg.seed) if cfg.sampling else None
        with tqdm(total=len(order), unit="sent", desc="decode", disable=not progress, mininterval=1.0, leave=False) as bar:
            # Longest first, so a batch's padded cost is its size x its first length.
            sorted_lengths = lengths[order]
            offsets = greedy_offsets(
                sorted_lengths, sorted_lengths, cfg.max_tokens or UNLIMITED, packed=False, max_sentences=cfg.batch_size
            )
            for start, stop in zip(offsets[:-1], offsets[1:]):
                indices = order[start:stop]
                nbests = self.generate_batch([sources[i] for i in indices], lengths[indices], cfg, generator=generator)
                for index, nbest in zip(indices, nbests):
                    results[index] = nbest
                bar.update(len(indices))
        return results

    def generate_batch(
        self, sources: list[np.ndarray], lengths: np.ndarray, cfg: EvalConfig, *, generator: torch.Generator | None
    ) -> list[list[Hypothesis]]:
        """One batch: sources (EOS last) cut to ``lengths`` (EOS kept) -> n-best hypotheses each."""
        if not isinstance(self.model, TransformerModel):
            return self.model.generate_batch(sources, lengths, cfg)
        src_tokens, src_lengths = self._collate(sources, lengths)
        return generate(self.model, src_tokens, src_lengths, cfg, generator=generator)

    def _collate(self, sources: list[np.ndarray], lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (B, S) int64 source and lengths (B,); over-long sources keep their EOS."""
        tokens = np.full((len(sources), int(lengths.max())), PAD_ID, dtype=np.int64)
        for row, (source, length) in enumerate(zip(sources, lengths)):
            tokens[row, : length - 1] = source[: length - 1]
            tokens[row, length - 1] = EOS_ID
        return torch.from_numpy(tokens).to(self.device), torch.from_numpy(lengths).to(self.device)

    def score(self, hypotheses: Sequence[str], references: Sequence[str], *, tokenized_lowercase: bool = False) -> list[Score]:
        """sacreBLEU BLEU and chrF (cased, detokenized), with signatures."""
        return score(hypotheses, references, tokenized_lowercase=tokenized_lowercase)


@dataclass
class Split:
    sources: list[np.ndarray]  # token ids, EOS included, in line order
    line_numbers: np.ndarray  # (N,) line of each source in the raw text (for the references)
    reference_path: str | None  # the raw target text the manifest names


def load_split(data_dir: str, split: str, *, src_spm: SentencePieceModel) -> Split:
    """The binarized sources of a split, checked to be encoded with the checkpoint's SentencePiece model
    (otherwise the ids would mean other pieces), and where its raw reference text lies."""
    corpus = ParallelCorpus(data_dir, split)
    manifest = corpus.manifest
    spm_path = manifest.path(manifest.spm.src_model)
    with open(spm_path, "rb") as handle:
        if handle.read() != src_spm.proto:
            raise ValueError(
                f"{spm_path}: not the checkpoint's source SentencePiece model; this data was encoded for "
                "another model (translate its raw text with --input instead)"
            )
    prefix = corpus.entry.input_prefix
    return Split(
        sources=[np.asarray(corpus.src[i], dtype=np.int64) for i in range(len(corpus))],
        line_numbers=np.asarray(corpus.line_numbers),
        reference_path=None if prefix is None else resolve_text_file(prefix, manifest.target_lang),
    )


def read_references(path: str, *, line_numbers: np.ndarray | None = None) -> list[str]:
    """Raw reference lines (split on ``\\n`` only, ``.gz`` allowed), optionally the given lines only."""
    references = decode_lines(read_raw_lines(path), path=path, replace_invalid=True).lines
    if line_numbers is None:
        return references
    if len(line_numbers) and int(line_numbers.max()) >= len(references):
        raise ValueError(f"{path}: {len(references)} lines, but the split has a sentence from line {int(line_numbers.max()) + 1}")
    return [references[i] for i in line_numbers]
