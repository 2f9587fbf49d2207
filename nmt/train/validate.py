"""Validation: when it runs, what it measures, and the meters it keeps (the best score so far, the
validations without improvement) that ``checkpoint_best.pt`` and --patience follow."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nmt.config import CheckpointConfig
from nmt.train.stopping import Progress

logger = logging.getLogger(__name__)

# Per direction: (loss sum, nll sum, target tokens) of the validation split, all ranks: nats.
EvaluateLoss = Callable[[], dict[str, tuple[float, float, int]]]
# BLEU of the validation split, or per direction (rank 0 decodes; every rank gets the scores).
EvaluateBleu = Callable[[], float | dict[str, float]]


@dataclass
class Outcome:
    metrics: dict[str, float]
    is_best: bool
    patience_exhausted: bool


class Validator:
    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        evaluate_loss: EvaluateLoss,
        evaluate_bleu: EvaluateBleu | None = None,
        missing: str | None = None,
    ) -> None:
        """``missing``: why there is nothing to validate on (no validation split); validation is
        then off, and an option that needs it is an error."""
        if missing is not None:
            asked = [
                flag
                for flag, given in (
                    ("--eval-bleu", cfg.eval_bleu),
                    ("--patience", cfg.patience >= 0),
                    ("--validate-interval-updates", cfg.validate_interval_updates > 0),
                )
                if given
            ]
            if asked:
                raise ValueError(f"{asked[0]}: {missing}")
            logger.warning("%s: training without validation (no checkpoint_best.pt)", missing)
        self.cfg = cfg
        self.enabled = missing is None
        self.evaluate_loss = evaluate_loss
        self.evaluate_bleu = evaluate_bleu
        self.best: float | None = None
        self.bad_validations = 0  # for --patience

    def due(self, at: Progress, *, stopping: str | None, by_signal: bool) -> bool:
        """At the end of every --validate-interval epochs, every --validate-interval-updates, and
        at the last update of a run that ends by a limit (so checkpoint_best.pt exists however short
        the run, as in fairseq); a signal stops without that wait."""
        if by_signal or not self.enabled:
            return False
        every = self.cfg.validate_interval_updates
        return (
            (at.ends_epoch and at.epoch % self.cfg.validate_interval == 0)
            or (every > 0 and at.update % every == 0)
            or stopping is not None
        )

    def __call__(self) -> Outcome:
        metrics = direction_metrics(self.evaluate_loss())
        if self.evaluate_bleu is not None:
            bleu = self.evaluate_bleu()
            if isinstance(bleu, dict):  # per direction: their mean chooses the best checkpoint
                if len(bleu) > 1:
                    metrics.update({f"{pair}_bleu": value for pair, value in bleu.items()})
                bleu = sum(bleu.values()) / len(bleu)
            metrics["valid_bleu"] = bleu
        by_bleu = self.cfg.best_checkpoint_metric == "bleu"
        value = metrics["valid_bleu"] if by_bleu else metrics["valid_loss"]
        # A non-finite loss is never the best (nan compares false both ways).
        improved = math.isfinite(value) and (
            self.best is None or (value > self.best if by_bleu else value < self.best)
        )
        if improved:
            self.best, self.bad_validations = value, 0
        else:
            self.bad_validations += 1
        exhausted = 0 <= self.cfg.patience < self.bad_validations
        return Outcome(metrics, improved, exhausted)

    def patience_reason(self) -> str:
        patience = self.cfg.patience
        return f"no improvement in {patience + 1} validations (--patience {patience})"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_validations = state["best"], int(state["bad_validations"])


def direction_metrics(sums: dict[str, tuple[float, float, int]]) -> dict[str, float]:
    """valid_loss/nll (bits per token) and ppl; several directions: each one's (``en-de_loss``...)
    and, as valid_*, the mean over directions (each direction counts once, whatever its size)."""
    per_token = {
        name: (loss / tokens / math.log(2), nll / tokens / math.log(2))
        for name, (loss, nll, tokens) in sums.items()
    }
    loss = sum(value[0] for value in per_token.values()) / len(per_token)
    nll = sum(value[1] for value in per_token.values()) / len(per_token)
    metrics = {"valid_loss": loss, "valid_nll": nll, "valid_ppl": perplexity(nll)}
    for name, (direction_loss, direction_nll) in per_token.items() if len(per_token) > 1 else ():
        metrics[f"{name}_loss"] = direction_loss
        metrics[f"{name}_ppl"] = perplexity(direction_nll)
    return metrics


def perplexity(nll_bits: float) -> float:
    """2 ** nll; inf once that no longer fits a float (a diverging run), never an OverflowError."""
    return math.inf if nll_bits >= 1024 else 2.0**nll_bits
