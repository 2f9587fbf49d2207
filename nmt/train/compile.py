"""torch.compile with static shapes: a bounded set of batch shapes, every one compiled at start-up.

Variable-length batches would otherwise recompile mid-run (and past dynamo's recompile limit of 8,
silently fall back to eager). Here a padded batch is padded to one length L for both sides, with L
rounded up to ``--length-multiple``, and to the number of rows the token budget allows at L
(``max_tokens // L``; extra rows are empty samples of zero weight). A packed batch is padded on
both sides to one token count: the larger side's total rounded up to a bucket step of 1/16 of
``--max-tokens`` (a multiple of ``--length-multiple``), at most 16 shapes. Its attention and masks
run eager (they depend on the number of samples and the longest one); everything else is compiled
per token count. The shapes are known before training, so every rank compiles all of them during
warm-up, then recompiles are forbidden.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch._dynamo

from nmt.data.collate import collate
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID
from nmt.train.parallel import maybe_no_sync

if TYPE_CHECKING:
    from nmt.train.trainer import Trainer

logger = logging.getLogger(__name__)


def shape_buckets(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, max_tokens: int, length_multiple: int, max_sentences: int | None
) -> list[tuple[int, int]]:
    """Every (rows, length) shape a padded batch of this data can take, shortest length first."""
    longest = int(max(np.max(src_lengths), np.max(tgt_lengths)))
    num_buckets = -(-longest // length_multiple)
    shapes = []
    for bucket in range(1, num_buckets + 1):
        length = bucket * length_multiple
        rows = max_tokens // length
        if max_sentences is not None:
            rows = min(rows, max_sentences)
        if rows >= 1:
            shapes.append((rows, length))
    return shapes


PACKED_BUCKETS = 16
PACKED_DUMMY_LENGTH = 32  # warm-up samples of a packed shape: within any model's positions


def packed_token_buckets(*, max_tokens: int, length_multiple: int) -> list[int]:
    """Every token count a packed batch is padded to (both sides): multiples of the bucket step."""
    step = -(-max(1, -(-max_tokens // PACKED_BUCKETS)) // length_multiple) * length_multiple
    return list(range(step, -(-max_tokens // step) * step + 1, step))


def compile_mode(*, device_type: str, world_size: int) -> str:
    """CUDA graphs (reduce-overhead) pay off on one GPU; with DDP or on CPU keep the default."""
    return "reduce-overhead" if device_type == "cuda" and world_size == 1 else "default"


def compiled_frames() -> int:
    """Frames dynamo compiled so far in this process (grows by one per (re)compilation)."""
    return int(torch._dynamo.utils.counters["frames"]["ok"])


@dataclass
class CompiledStep:
    model: torch.nn.Module  # the compiled (DDP-wrapped where several ranks) model
    shapes: list[tuple[int, int]]  # padded: (rows, length); packed: (1, tokens per side)
    length_multiple: int
    packed: bool
    frames_after_warmup: int
    warmup_seconds: float

    @classmethod
    def build(cls, trainer: Trainer, shapes: list[tuple[int, int]]) -> CompiledStep:
        cfg = trainer.cfg
        mode = compile_mode(device_type=trainer.device.type, world_size=trainer.env.world_size)
        # One graph per shape, and a few spare for the eval/train mode switch of the same module.
        torch._dynamo.config.recompile_limit = max(8, 2 * len(shapes) + 2)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4 * len(shapes) + 8
        )
        try:
            compiled = torch.compile(trainer.wrapped, dynamic=False, mode=mode)
        except Exception as error:  # the platform cannot compile at all
            raise RuntimeError(f"--compile: torch.compile is not available here ({error}); run without --compile") from None
        step = cls(
            model=compiled, shapes=shapes, length_multiple=cfg.data.batching.length_multiple, packed=cfg.data.batching.layout == "packed",
            frames_after_warmup=0, warmup_seconds=0.0,
        )
        step.warm_up(trainer)
        return step

    def shape_for(self, length: int) -> tuple[int, int]:
        """The smallest shape whose length (padded) or token count (packed) holds ``length``."""
        for rows, shape_length in self.shapes:
            if shape_length >= length:
                return rows, shape_length
        raise AssertionError(f"length {length} has no compiled shape")  # shapes cover the data's longest

    def collate(self, samples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        """Padded: exactly (rows, length) on both sides, the extra rows empty samples. Packed: both
        sides' tokens padded to the same bucketed count (a tail that belongs to no sample)."""
        if self.packed:
            longest_side = max(sum(len(src) for src, _ in samples), sum(len(tgt) for _, tgt in samples))
            _, tokens = self.shape_for(longest_side)
            return collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout="packed", pad_tokens_to=tokens)
        rows, length = self.shape_for(max(max(len(src), len(tgt)) for src, tgt in samples))
        return collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout="padded", pad_rows_to=rows, pad_tokens_to=length)

    def dummy_samples(self, rows: int, length: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Samples that fill a shape; packed ones are cut into short samples (positions stay small)."""
        def sample(size: int) -> tuple[np.ndarray, np.ndarray]:
            tokens = np.full(size, 4, dtype=np.int64)
            tokens[-1] = EOS_ID
            return tokens, tokens

        if not self.packed:
            return [sample(length)] * rows
        short, remainder = divmod(length, PACKED_DUMMY_LENGTH)
        return [sample(PACKED_DUMMY_LENGTH)] * short + ([sample(remainder)] if remainder else [])

    def warm_up(self, trainer: Trainer) -> None:
        """Forward + backward once per shape on dummy data: no optimizer step, RNG untouched."""
        started = time.perf_counter()
        trainer.wrapped.train()
        with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
            for rows, length in self.shapes:
                batch = trainer.to_device(self.collate(self.dummy_samples(rows, length)))
                with maybe_no_sync(trainer.wrapped, sync=False):
                    loss, _ = trainer.forward_loss(self.model, batch)
                    (loss * 0.0).backward()
        trainer.optimizer.zero_grad(set_to_none=True)
        self.frames_after_warmup = compiled_frames()
        self.warmup_seconds = time.perf_counter() - started
        torch.compiler.set_stance("fail_on_recompile")
        logger.info("compiled %d shapes in %.1fs; recompiles are now an error", len(self.shapes), self.warmup_seconds)

    def recompiles_since_warmup(self) -> int:
        return compiled_frames() - self.frames_after_warmup
