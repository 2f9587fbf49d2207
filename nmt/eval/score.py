"""Corpus BLEU and chrF with sacreBLEU, each with the signature that makes it reproducible."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class Score:
    name: str  # "BLEU", "chrF2", or a labelled variant
    score: float
    summary: str  # sacreBLEU's one-line result, e.g. "BLEU = 35.10 66.2/41.3/... (BP = 1.000 ...)"
    signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"

    def __str__(self) -> str:
        return f"{self.summary}\n  signature: {self.signature}"


TOKENIZED_LOWERCASE_LABEL = (
    "BLEU (lowercased, 13a-tokenized; for comparison with papers' tokenized lowercase BLEU)"
)


def score(
    hypotheses: Sequence[str], references: Sequence[str], *, tokenized_lowercase: bool = False
) -> list[Score]:
    """sacreBLEU BLEU and chrF on detokenized, cased text (plus lowercased BLEU when asked)."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must align line for line"
        )
    if not hypotheses:  # sacreBLEU fails with an IndexError
        raise ValueError("nothing to score: no sentences (BLEU and chrF are undefined on none)")
    metrics: list[tuple[str, BLEU | CHRF]] = [("BLEU", BLEU()), ("chrF2", CHRF())]
    if tokenized_lowercase:
        metrics.append((TOKENIZED_LOWERCASE_LABEL, BLEU(lowercase=True, tokenize="13a")))
    scores = []
    for name, metric in metrics:
        result = metric.corpus_score(list(hypotheses), [list(references)])
        summary = (
            str(result)
            if name != TOKENIZED_LOWERCASE_LABEL
            else f"{name} = {str(result).split(' = ', 1)[1]}"
        )
        scores.append(
            Score(
                name=name,
                score=result.score,
                summary=summary,
                signature=str(metric.get_signature()),
            )
        )
    return scores
