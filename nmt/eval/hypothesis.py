"""What every search returns, and the length limit they share (PyTorch's and CTranslate2's)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nmt.config import EvalConfig


@dataclass
class Hypothesis:
    tokens: list[int]  # generated piece ids, EOS excluded
    score: float  # sum of log-probabilities (EOS included) / (len(tokens) + 1) ** lenpen


def max_target_lengths(
    src_lengths: np.ndarray, cfg: EvalConfig, *, max_positions: int
) -> np.ndarray:
    """Tokens a sentence may generate before the forced EOS: ``int(a * src_len + b)``, within positions."""
    limit = np.floor(cfg.max_len_a * src_lengths.astype(np.float64) + cfg.max_len_b).astype(
        np.int64
    )
    return np.minimum(limit, max_positions - 1)  # the forced EOS is fed at position max_len at most
