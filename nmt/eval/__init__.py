"""Decoding and scoring: beam/greedy/sampling search, sacreBLEU, and the Translator API."""

from nmt.eval.score import Score, score
from nmt.eval.search import Hypothesis, generate
from nmt.eval.translate import Translator, load_averaged_checkpoint

__all__ = ["Hypothesis", "Score", "Translator", "generate", "load_averaged_checkpoint", "score"]
