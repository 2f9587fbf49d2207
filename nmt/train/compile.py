"""torch.compile with static shapes: a bounded set of batch shapes, every one compiled at start-up.

Variable-length batches would otherwise recompile mid-run (and past dynamo's recompile limit of 8,
silently fall back to eager). Here a padded batch is padded to one length L for both sides, with L
rounded up to ``--length-multiple``, and to the number of rows the token budget allows at L
(``max_tokens // L``; extra rows are empty samples of zero weight). The shapes are known before
training, so every rank compiles all of them during warm-up, then recompiles are forbidden.
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


def compile_mode(*, device_type: str, world_size: int) -> str:
    """CUDA graphs (reduce-overhead) pay off on one GPU; with DDP or on CPU keep the default."""
    return "reduce-overhead" if device_type == "cuda" and world_size == 1 else "default"


def compiled_frames() -> int:
    """Frames dynamo compiled so far in this process (grows by one per (re)compilation)."""
    return int(torch._dynamo.utils.counters["frames"]["ok"])


@dataclass
class CompiledStep:
    model: torch.nn.Module  # the compiled (DDP-wrapped where several ranks) model
    shapes: list[tuple[int, int]]
    length_multiple: int
    frames_after_warmup: int
    warmup_seconds: float

    @classmethod
    def build(cls, trainer: Trainer, shapes: list[tuple[int, int]]) -> CompiledStep:
        cfg = trainer.cfg
        if cfg.layout != "padded":
            raise ValueError("--compile: static shapes are implemented for --layout padded only")
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
        step = cls(model=compiled, shapes=shapes, length_multiple=cfg.length_multiple, frames_after_warmup=0, warmup_seconds=0.0)
        step.warm_up(trainer)
        return step

    def shape_for(self, length: int) -> tuple[int, int]:
        bucket = -(-length // self.length_multiple) * self.length_multiple
        for rows, shape_length in self.shapes:
            if shape_length == bucket:
                return rows, shape_length
        raise AssertionError(f"length {length} has no compiled shape")  # shapes cover the data's longest

    def collate(self, samples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        """Padded to exactly (rows, length) on both sides; the extra rows are empty samples."""
        rows, length = self.shape_for(max(max(len(src), len(tgt)) for src, tgt in samples))
        return collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout="padded", pad_rows_to=rows, pad_tokens_to=length)

    def warm_up(self, trainer: Trainer) -> None:
        """Forward + backward once per shape on dummy data: no optimizer step, RNG untouched."""
        started = time.perf_counter()
        trainer.wrapped.train()
        with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
            for rows, length in self.shapes:
                tokens = np.full(length, 4, dtype=np.int64)
                tokens[-1] = EOS_ID
                batch = trainer.to_device(self.collate([(tokens, tokens)] * rows))
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
