"""Decoding and scoring: beam/greedy/sampling search, sacreBLEU, and the Translator API."""

from nmt.eval.ensemble import Ensemble
from nmt.eval.score import Score, score
from nmt.eval.search import Hypothesis, generate
from nmt.checkpoint_io import load_averaged_checkpoint
from nmt.eval.translate import Translator

__all__ = ["Ensemble", "Hypothesis", "Score", "Translator", "generate", "load_averaged_checkpoint", "score"]
