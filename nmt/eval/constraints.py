"""Lexical constraints for the batched beam search: phrases (piece ids) every output must contain.

The search is dynamic beam allocation (Post & Vilar 2018) vectorized over the batch (Hu et al.
2019; fairseq's ``LexicallyConstrainedBeamSearch``): at every step the candidates are the usual
best extensions plus, for every beam, its best token and each token that advances an unmet
constraint; each candidate falls in the bank of the constraint tokens it has met, and the beam is
filled bank by bank in turn (the best of every bank, then the second best...), so hypotheses that
met more constraints are never crowded out by better-scoring ones that met fewer. EOS is banned
until a hypothesis has met all of its constraints.

A constraint is met when its pieces occur contiguously in the output, wherever they overlap other
constraints ("a b" and "b c" are both met by "a b c"). Each row keeps, per constraint, the set of
its prefixes that end the output (shift-and string matching: a new token extends exactly the
prefixes it continues), so a constraint left halfway is picked up again by a later occurrence,
constraints sharing pieces need no trie, and a step costs a few comparisons per candidate, not a
look back over the output. ``ordered``: constraint i counts only once constraints 0..i-1 were met
at an earlier step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NO_TOKEN = -1  # padding of the constraint table; never equal to a generated id


@dataclass
class Progress:
    """Per hypothesis (any leading shape): which constraints are met, which prefixes end the output."""

    met: torch.Tensor  # (..., C) bool
    ends: torch.Tensor  # (..., C, L) bool: the constraint's first j + 1 pieces end the output

    def __getitem__(self, index: torch.Tensor | tuple[torch.Tensor, ...]) -> Progress:
        """The hypotheses that ``index`` picks on the leading dimensions."""
        return Progress(self.met[index], self.ends[index])

    def flatten_beams(self) -> Progress:
        """(B, K, ...) -> (B x K, ...): per sentence and beam to per row."""
        return Progress(self.met.flatten(0, 1), self.ends.flatten(0, 1))


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
        self.span = torch.arange(1, longest + 1, device=device)  # (L,) prefix length of each column
        self.num_banks = int(self.lengths.sum(dim=1).max()) + 1  # 0..all constraint pieces met

    def start(self, sentences: torch.Tensor) -> Progress:
        """The empty output of each sentence in ``sentences`` (B,): only its absent constraints met."""
        lengths = self.lengths[sentences]
        ends = torch.zeros(
            (*lengths.shape, len(self.span)), dtype=torch.bool, device=lengths.device
        )
        return Progress(met=lengths == 0, ends=ends)

    def wanted(
        self, progress: Progress, sentences: torch.Tensor, rows_per_sentence: int
    ) -> torch.Tensor:
        """(R, C) the piece each row's output needs next for each constraint, NO_TOKEN where none
        (met; with ``ordered``, not the first unmet one, or one that occurred before its turn)."""
        tokens = self.tokens[sentences].repeat_interleave(rows_per_sentence, dim=0)  # (R, C, L)
        lengths = self.lengths[sentences].repeat_interleave(rows_per_sentence, dim=0)  # (R, C)
        matched = self._matched(progress.ends)
        under_way = self._open(progress.met) & (matched < lengths)
        following = matched.clamp(max=len(self.span) - 1)[:, :, None]
        return tokens.gather(2, following).squeeze(2).masked_fill(~under_way, NO_TOKEN)

    def advance(
        self, progress: Progress, new_tokens: torch.Tensor, sentences: torch.Tensor
    ) -> tuple[Progress, torch.Tensor]:
        """Candidates' progress and bank: ``progress`` (B, N, C) of each candidate's parent row,
        ``new_tokens`` (B, N) the token the candidate appends, ``sentences`` (B,). Returns the
        candidates' Progress (B, N, C) and their bank (B, N): pieces of the met constraints plus
        the longest partial match of an open one."""
        pieces = self.tokens[sentences][:, None]  # (B, 1, C, L)
        lengths = self.lengths[sentences][:, None]  # (B, 1, C)
        # Prefix j + 1 ends the new output where prefix j ended the parent's and the token is piece j.
        continued = torch.cat(
            [torch.ones_like(progress.ends[..., :1]), progress.ends[..., :-1]], -1
        )
        ends = continued & (new_tokens[:, :, None, None] == pieces)  # (B, N, C, L)
        matched = self._matched(ends)  # (B, N, C)
        complete = (matched == lengths) & (lengths > 0)
        met = progress.met | (complete & self._open(progress.met))
        partial = matched.masked_fill(~self._open(met), 0).amax(dim=-1)  # (B, N)
        bank = (lengths * met).sum(dim=-1) + partial
        return Progress(met, ends), bank

    def _matched(self, ends: torch.Tensor) -> torch.Tensor:
        """(..., C) the longest prefix of each constraint that ends the output (0: none)."""
        return (ends * self.span).amax(dim=-1)

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
