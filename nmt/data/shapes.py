"""Batch shapes for ``torch.compile``: a known set, every batch collated into one of them.

A packed batch is padded on both sides to one token count: the larger side's total rounded up to
``length_multiple``, and at least 2 (dynamo specialises a size of 1). The compiled layers take that
count as dynamic (``nmt.train.compile``): one graph serves every count, and the warm-up runs the
smallest and the largest. A padded batch is padded to one length L for both sides, L rounded up to
``length_multiple``, and to the number of rows the token budget allows at L (the padded cost of
``rows`` samples of length L is ``rows * L``, the rule greedy batching cuts by); extra rows are
empty samples of zero weight. Padded shapes stay static, one graph each, all warmed up: the padded
attention's key mask is cached per key count (``AttentionMask.sdpa_mask``), and a graph that reads
that cache is specialised to its length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.batching import padded_rows
from nmt.data.collate import Sample, collate
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID

PACKED_DUMMY_LENGTH = 32  # warm-up samples of a packed shape: within any model's positions
_DUMMY_TOKEN = 4  # the first ordinary piece id (after pad, bos, eos, unk)


def padded_shapes(
    longest: int, *, max_tokens: int, length_multiple: int, max_sentences: int | None
) -> list[tuple[int, int]]:
    """Every (rows, length) shape a padded batch of samples up to ``longest`` tokens can take."""
    shapes = []
    for bucket in range(1, -(-longest // length_multiple) + 1):
        length = bucket * length_multiple
        rows = padded_rows(length, max_tokens=max_tokens, max_sentences=max_sentences)
        if rows >= 1:
            shapes.append((rows, length))
    return shapes


def packed_token_counts(*, max_tokens: int, length_multiple: int) -> list[int]:
    """Every token count a packed batch is padded to (both sides): the multiples of
    ``length_multiple`` up to the budget's, from 2 (dynamo specialises a dimension of size 1)."""
    largest = -(-max_tokens // length_multiple) * length_multiple
    return list(range(max(2, length_multiple), largest + 1, length_multiple))


@dataclass(frozen=True)
class StaticShapes:
    """The shapes of one run and how a batch is collated into the smallest that holds it."""

    shapes: tuple[tuple[int, int], ...]  # padded: (rows, length); packed: (1, tokens per side)
    packed: bool

    @classmethod
    def for_data(
        cls,
        longest: int,
        *,
        max_tokens: int,
        length_multiple: int,
        max_sentences: int | None,
        packed: bool,
    ) -> StaticShapes:
        if packed:
            counts = packed_token_counts(max_tokens=max_tokens, length_multiple=length_multiple)
            return cls(tuple((1, tokens) for tokens in counts), packed=True)
        shapes = padded_shapes(
            longest,
            max_tokens=max_tokens,
            length_multiple=length_multiple,
            max_sentences=max_sentences,
        )
        return cls(tuple(shapes), packed=False)

    def shape_for(self, size: int) -> tuple[int, int]:
        """The smallest shape whose length (padded) or token count (packed) holds ``size``."""
        for rows, length in self.shapes:
            if length >= size:
                return rows, length
        raise AssertionError(
            f"size {size} has no static shape"
        )  # batching keeps every batch within them

    def collate(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        """Padded: exactly (rows, length) on both sides, the extra rows empty samples. Packed: both
        sides' tokens padded to the same bucketed count (a tail that belongs to no sample)."""
        if self.packed:
            longest_side = max(
                sum(len(src) for src, _ in samples), sum(len(tgt) for _, tgt in samples)
            )
            _, tokens = self.shape_for(longest_side)
            return collate(
                samples, pad_id=PAD_ID, bos_id=BOS_ID, layout="packed", pad_tokens_to=tokens
            )
        rows, length = self.shape_for(max(max(len(src), len(tgt)) for src, tgt in samples))
        return collate(
            samples,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            layout="padded",
            pad_rows_to=rows,
            pad_tokens_to=length,
        )

    def warmup_batches(self) -> list[dict[str, torch.Tensor]]:
        """Batches of dummy samples: one per padded shape; packed, the smallest and the largest
        (the dynamic graphs compiled on the first serve every count), cut into short samples
        (their positions stay within any model's)."""

        def sample(size: int) -> Sample:
            tokens = np.full(size, _DUMMY_TOKEN, dtype=np.int64)
            tokens[-1] = EOS_ID
            return tokens, tokens

        batches = []
        ends = sorted({self.shapes[0], self.shapes[-1]}, key=lambda shape: shape[1])
        for rows, length in ends if self.packed else self.shapes:
            if self.packed:
                short, remainder = divmod(length, PACKED_DUMMY_LENGTH)
                samples = [sample(PACKED_DUMMY_LENGTH)] * short + (
                    [sample(remainder)] if remainder else []
                )
            else:
                samples = [sample(length)] * rows
            batches.append(self.collate(samples))
        return batches
