"""A ``torch.utils.data.Sampler`` over ``nmt.data.batching``'s batches, for users who bring their own DataLoader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from nmt.config import BatchingConfig
from nmt.data.batching import Batches, check_lengths, global_batches, shard
from nmt.data.curriculum import check_difficulty


class MaxTokensBatchSampler(Sampler[list[int]]):
    """Yields lists of sample indices for this rank, each within a token budget (see module doc):
    the batches of ``global_batches`` for the epoch, dealt to ranks by ``shard``, for users who bring
    their own DataLoader. ``nmt-train`` reads the same functions through ``nmt.data.plan``.

    Competence is driven by update counts: call ``set_epoch(epoch, start_update=n)`` with the number
    of optimizer updates so far; ``cfg.update_freq`` and ``num_replicas`` map batches to updates.

    Resuming: ``state_dict()`` records the epoch, ``start_update`` and how many of this rank's
    batches were consumed. A DataLoader prefetches, so the sampler has usually yielded more than
    the trainer consumed: pass ``consumed=`` (batches the trainer finished this epoch) to
    ``state_dict`` to save the exact position.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        cfg: BatchingConfig,
        *,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        difficulty: np.ndarray | None = None,
        length_multiple: int = 1,
        shuffle: bool = True,
    ) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        self.cfg = cfg
        self.seed = seed
        self.length_multiple = length_multiple
        self.shuffle = shuffle
        check_lengths(
            self.src_lengths,
            self.tgt_lengths,
            max_tokens=cfg.max_tokens,
            length_multiple=length_multiple,
        )
        self.difficulty = (
            None
            if difficulty is None
            else check_difficulty(difficulty, num_samples=self.src_lengths.shape[0])
        )
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.start_update = 0
        self._position = 0
        self._cache: tuple[tuple[int, int], Batches] | None = None

    def set_epoch(self, epoch: int, *, start_update: int = 0) -> None:
        """Select the epoch (and, for competence, the number of updates done before it)."""
        if (epoch, start_update) != (self.epoch, self.start_update):
            self._position = 0
        self.epoch, self.start_update = epoch, start_update

    def global_batches(self) -> Batches:
        """This epoch's batches for all ranks (cached per epoch)."""
        key = (self.epoch, self.start_update)
        if self._cache is None or self._cache[0] != key:
            batches = global_batches(
                self.src_lengths,
                self.tgt_lengths,
                self.cfg,
                seed=self.seed,
                epoch=self.epoch,
                difficulty=self.difficulty,
                start_update=self.start_update,
                batches_per_update=self.num_replicas * self.cfg.update_freq,
                length_multiple=self.length_multiple,
                shuffle=self.shuffle,
            )
            self._cache = (key, batches)
        return self._cache[1]

    def rank_batches(self) -> Batches:
        """This rank's batches for the epoch, balanced by real (source + target) tokens."""
        return shard(
            self.global_batches(),
            num_replicas=self.num_replicas,
            rank=self.rank,
            sample_tokens=self.src_lengths + self.tgt_lengths,
        )

    def __len__(self) -> int:
        return len(self.rank_batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.rank_batches()
        while self._position < len(batches):
            batch = batches[self._position]
            self._position += 1
            yield batch.tolist()
        self._position = 0

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        position = self._position if consumed is None else consumed
        return {"epoch": self.epoch, "start_update": self.start_update, "position": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.start_update = int(state["epoch"]), int(state["start_update"])
        self._position = int(state["position"])
