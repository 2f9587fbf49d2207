"""Lexical constraints for the batched beam search: phrases (piece ids) every output must contain.

The search is dynamic beam allocation (Post & Vilar 2018) vectorized over the batch (Hu et al.
2019; fairseq's ``LexicallyConstrainedBeamSearch``): at every step the candidates are the usual
best extensions plus, for every beam, its best token and each token that advances an unmet
constraint; each candidate falls in the bank of the constraint tokens it has met, and the beam is
filled bank by bank in turn (the best of every bank, then the second best...), so hypotheses that
met more constraints are never crowded out by better-scoring ones that met fewer. EOS is banned
until a hypothesis has met all of its constraints.

A constraint is met when its pieces occur contiguously in the output, wherever they overlap other
constraints ("a b" and "b c" are both met by "a b c"). Progress is recomputed from the output's
last pieces (the longest prefix of each constraint that ends the output), so a constraint left
halfway is picked up again by a later occurrence, and constraints sharing pieces need no trie.
``ordered``: constraint i counts only once constraints 0..i-1 were met at an earlier step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NO_TOKEN = -1  # padding of the constraint table; never equal to a generated id
BEFORE_START = -2  # what the output "has" before its first token; never equal to a constraint piece


@dataclass
class Progress:
    """Per hypothesis row: which constraints are met, and how far each one's prefix ends the output."""

    met: torch.Tensor  # (R, C) bool
    matched: (
        torch.Tensor
    )  # (R, C) long: pieces of each constraint that end the output (< its length once met)

    def index_select(self, rows: torch.Tensor) -> Progress:
        return Progress(self.met.index_select(0, rows), self.matched.index_select(0, rows))


class BatchConstraints:
    """The constraints of a batch of sentences on the search's device, and the rules of their banks."""

    def __init__(
        self, phrases: Sequence[Sequence[Sequence[int]]], *, ordered: bool, device: torch.device
    ) -> None:
        """``phrases``: per sentence, its constraints (each a non-empty list of piece ids)."""
        # At least one column (an absent constraint, met from the start) keeps the shapes non-empty.
        num_constraints = max((len(p) for p in phrases), default=1) or 1
        longest = max((len(c) for p in phrases for c in p), default=1)
        tokens = torch.full((len(phrases), num_constraints, longest), NO_TOKEN, dtype=torch.long)
        lengths = torch.zeros((len(phrases), num_constraints), dtype=torch.long)
        for sentence, constraints in enumerate(phrases):
            for index, constraint in enumerate(constraints):
                assert len(constraint) > 0, "an empty constraint is refused when it is read"
                tokens[sentence, index, : len(constraint)] = torch.tensor(constraint)
                lengths[sentence, index] = len(constraint)
        self.tokens = tokens.to(device)  # (B, C, L), NO_TOKEN after each constraint
        self.lengths = lengths.to(device)  # (B, C), 0 where a sentence has fewer constraints
        self.ordered = ordered
        self.longest = longest
        self.num_banks = int(self.lengths.sum(dim=1).max()) + 1  # 0..all constraint pieces met

    def start(self, sentences: torch.Tensor) -> Progress:
        """The empty output of each sentence in ``sentences`` (B,): only its absent constraints met."""
        lengths = self.lengths[sentences]
        return Progress(met=lengths == 0, matched=torch.zeros_like(lengths))

    def wanted(
        self, progress: Progress, sentences: torch.Tensor, rows_per_sentence: int
    ) -> torch.Tensor:
        """(R, C) the piece each row's output needs next for each constraint, NO_TOKEN where none
        (met; with ``ordered``, not the first unmet one, or one that occurred before its turn)."""
        tokens = self.tokens[sentences].repeat_interleave(rows_per_sentence, dim=0)  # (R, C, L)
        lengths = self.lengths[sentences].repeat_interleave(rows_per_sentence, dim=0)  # (R, C)
        under_way = self._open(progress.met) & (progress.matched < lengths)
        following = progress.matched.clamp(max=self.longest - 1)[:, :, None]
        return tokens.gather(2, following).squeeze(2).masked_fill(~under_way, NO_TOKEN)

    def advance(
        self, progress: Progress, tails: torch.Tensor, sentences: torch.Tensor
    ) -> tuple[Progress, torch.Tensor]:
        """Candidates' progress and bank: ``progress`` (B, N, C) of each candidate's parent row,
        ``tails`` (B, N, L) the candidate's last ``longest`` output pieces (its new token last,
        BEFORE_START before the output), ``sentences`` (B,). Returns the candidates' Progress
        (B, N, C) and their bank (B, N): pieces of the met constraints plus the longest partial
        match of an open one."""
        tokens = self.tokens[sentences][:, None]  # (B, 1, C, L)
        lengths = self.lengths[sentences][:, None]  # (B, 1, C)
        span = torch.arange(1, self.longest + 1, device=tails.device)  # (K,) match lengths tried
        offset = torch.arange(self.longest, device=tails.device)  # (J,) piece within a match
        # For a match of k pieces, piece j of the constraint faces tail position L - k + j.
        position = (self.longest - span[:, None] + offset[None, :]).clamp(max=self.longest - 1)
        valid = offset[None, :] < span[:, None]  # (K, J)
        facing = tails[:, :, position]  # (B, N, K, J)
        equal = facing[:, :, None] == tokens[:, :, :, None, :]  # (B, N, C, K, J)
        ends_output = (equal | ~valid).all(dim=-1) & (span <= lengths[..., None])  # (B, N, C, K)
        matched = (ends_output * span).amax(dim=-1)  # (B, N, C): longest prefix ending the output
        complete = (matched == lengths) & (lengths > 0)
        met = progress.met | (complete & self._open(progress.met))
        matched = matched.masked_fill(met, 0)
        partial = matched.masked_fill(~self._open(met), 0).amax(dim=-1)  # (B, N)
        bank = (lengths * met).sum(dim=-1) + partial
        return Progress(met, matched), bank

    def _open(self, met: torch.Tensor) -> torch.Tensor:
        """(..., C) constraints that may be met next: the unmet ones, or with ``ordered`` the first."""
        if not self.ordered:
            return ~met
        before = torch.cat([torch.ones_like(met[..., :1]), met[..., :-1]], dim=-1)
        return ~met & before


def dynamic_beam_order(scores: torch.Tensor, banks: torch.Tensor, num_banks: int) -> torch.Tensor:
    """(B, N) candidate order for dynamic beam allocation: the best candidate of every bank (most
    constraint pieces first), then the second best of every bank, and so on; -inf scores last.

    Taking the first K of this order gives each bank an equal share of the beam, and a bank's unused
    share goes to the others (Hu et al. 2019's stripes)."""
    num = scores.shape[1]
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    bank_sorted = banks.gather(1, by_score)
    by_bank = bank_sorted.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # bank descending, then score descending
    bank_of = bank_sorted.gather(1, by_bank)
    position = torch.arange(num, device=scores.device).expand_as(order)
    starts = torch.ones_like(bank_of, dtype=torch.bool)
    starts[:, 1:] = bank_of[:, 1:] != bank_of[:, :-1]
    rank_in_bank = position - (position * starts).cummax(dim=1).values
    key = rank_in_bank * num_banks + (num_banks - 1 - bank_of)
    dead = scores.gather(1, order) == -torch.inf
    key = torch.where(dead, num * num_banks + position, key)
    return order.gather(1, key.argsort(dim=1, stable=True))
