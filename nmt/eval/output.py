"""What nmt-eval prints per sentence: plain text, or fairseq-generate's tagged lines.

fairseq format, per sentence ``i`` (the 0-based line of the input or of the split), as
``fairseq-generate`` prints it (S-, T- and H- show text instead of pieces with ``--post-process
sentencepiece``)::

    S-i <TAB> source pieces
    T-i <TAB> reference pieces                      (when there is a reference)
    then for each of the n-best, best first:
    H-i <TAB> score <TAB> hypothesis pieces
    D-i <TAB> score <TAB> detokenized hypothesis
    P-i <TAB> per-token log-probabilities, EOS included, 4 decimals
    A-i <TAB> source-target position pairs          (with --print-alignment)

Scores are in base 2, as fairseq prints them (the Python API's are natural logs). The run ends with
``Generate SPLIT with beam=K: BLEU = ...`` lines, as fairseq's does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nmt.data.spm import SentencePieceModel
from nmt.eval.translate import Translation

FORMATS = ("plain", "fairseq")


def base2(score: float) -> float:
    """A natural-log score in bits, as fairseq prints scores."""
    return score / math.log(2)


def plain_lines(nbest: Sequence[Translation], *, score_reference: bool) -> list[str]:
    """One line per translation (``--nbest N``: N lines), or the reference's score (base 2)."""
    if score_reference:
        return [f"{base2(translation.score):.4f}\n" for translation in nbest]
    return [translation.text + "\n" for translation in nbest]


class FairseqLines:
    """fairseq-generate's S-/T-/H-/D-/P-/A- lines of one sentence."""

    def __init__(
        self,
        src_spm: SentencePieceModel,
        tgt_spm: SentencePieceModel,
        *,
        post_process: bool = False,
    ) -> None:
        self.src_spm = src_spm
        self.tgt_spm = tgt_spm
        self.post_process = post_process  # text instead of pieces in S-, T- and H-

    def __call__(
        self, index: int, source: np.ndarray, reference: str | None, nbest: Sequence[Translation]
    ) -> list[str]:
        """``source``: its ids with EOS; ``nbest``: with ``positional_scores`` filled (and ``alignment``
        for A- lines)."""
        lines = [f"S-{index}\t{self._show(self.src_spm, source[:-1].tolist())}\n"]
        if reference is not None:
            lines.append(
                f"T-{index}\t{self._show(self.tgt_spm, self.tgt_spm.encode([reference])[0])}\n"
            )
        for translation in nbest:
            assert translation.positional_scores is not None, (
                "fairseq lines need positional scores (add_token_scores)"
            )
            score = base2(translation.score)
            lines.append(f"H-{index}\t{score}\t{self._show(self.tgt_spm, translation.tokens)}\n")
            lines.append(f"D-{index}\t{score}\t{translation.text}\n")
            lines.append(
                f"P-{index}\t{' '.join(f'{base2(s):.4f}' for s in translation.positional_scores)}\n"
            )
            if translation.alignment is not None:
                lines.append(
                    f"A-{index}\t{' '.join(f'{s}-{t}' for s, t in translation.alignment)}\n"
                )
        return lines

    def _show(self, spm: SentencePieceModel, ids: list[int]) -> str:
        return (
            spm.decode([ids])[0] if self.post_process else " ".join(spm.processor.id_to_piece(ids))
        )
