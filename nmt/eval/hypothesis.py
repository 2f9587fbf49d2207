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


class LengthLimitError(ValueError):
    """Sentence ``index`` (0-based) cannot be translated within a length limit: --min-len asks more
    tokens than its translation may have, or (where truncating is refused) it is longer than the
    model reads. ``reason`` says which, without the sentence."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"sentence {index + 1}: {reason}")
        self.index = index
        self.reason = reason


def check_min_len(
    src_lengths: np.ndarray, cfg: EvalConfig, *, max_source_positions: int, max_positions: int
) -> None:
    """ValueError unless every sentence of ``src_lengths`` (EOS included, within the model's
    positions) may be translated with at least ``cfg.min_len`` tokens: with fewer allowed, the
    search has no output to return. The whole setting is refused when no source could do."""
    longest = int(
        max_target_lengths(np.array([max_source_positions]), cfg, max_positions=max_positions)[0]
    )
    if cfg.min_len > longest:
        raise ValueError(
            f"--min-len {cfg.min_len}: no translation may be that long; at most {longest} tokens "
            f"(--max-len-a {cfg.max_len_a} --max-len-b {cfg.max_len_b}, the model's "
            f"{max_source_positions} source and {max_positions} target positions)"
        )
    limits = max_target_lengths(src_lengths, cfg, max_positions=max_positions)
    short = np.flatnonzero(limits < cfg.min_len)
    if short.size:
        index = int(short[0])
        raise LengthLimitError(
            index,
            f"--min-len {cfg.min_len} is more than the {int(limits[index])} tokens its translation "
            f"may have (--max-len-a {cfg.max_len_a} x {int(src_lengths[index])} source tokens "
            f"+ --max-len-b {cfg.max_len_b}); lower --min-len or raise --max-len-b",
        )
