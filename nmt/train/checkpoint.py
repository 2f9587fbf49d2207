"""Checkpoints of a run: complete state, atomic writes, resume, rotation of old files.

Names and the file format live in ``nmt.checkpoint_io`` (evaluation reads them too); this module
decides what a training checkpoint holds and when old ones go.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

import numpy as np
import torch

from nmt import dist
from nmt.checkpoint_io import (
    BEST,
    FORMAT,
    LAST,
    VERSION,
    atomic_torch_save,
    bytes_to_tensor,
    load_checkpoint,
    numbered_checkpoints,
    numbered_name,
)
from nmt.config import CheckpointConfig
from nmt.data.manifest import Manifest
from nmt.fileio import remove_stale_temporaries, temporary_sibling

logger = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    """RNG states as tensors/plain data (``weights_only``-loadable)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_vocab(manifest: Manifest) -> dict[str, Any]:
    """What a checkpoint needs to translate raw text on its own: languages, ids, SentencePiece models."""
    vocab: dict[str, Any] = {
        "source_lang": manifest.source_lang,
        "target_lang": manifest.target_lang,
        "special_ids": dict(manifest.special_ids),
    }
    for side, name in (("src", manifest.spm.src_model), ("tgt", manifest.spm.tgt_model)):
        with open(manifest.path(name), "rb") as handle:
            vocab[f"{side}_spm"] = bytes_to_tensor(handle.read())
    return vocab


class Checkpointer:
    """Writes the run's checkpoints (rank 0) and finds the one to resume from."""

    def __init__(self, cfg: CheckpointConfig, *, is_main: bool) -> None:
        self.cfg = cfg
        self.is_main = is_main
        if is_main and os.path.isdir(cfg.save_dir):
            for name in remove_stale_temporaries(cfg.save_dir):
                logger.info("removed %s, left by a save that was killed", name)

    def names(self, *, epoch: int, num_updates: int, end_of_epoch: bool, is_best: bool) -> list[str]:
        """The files this save writes: the first is written, the others are links to it."""
        names = [LAST]
        numbered = (end_of_epoch and not self.cfg.no_epoch_checkpoints) or (
            not end_of_epoch and self.cfg.save_interval_updates > 0
        )
        if numbered:
            names.insert(0, numbered_name(epoch=epoch, num_updates=num_updates, end_of_epoch=end_of_epoch))
        if is_best:
            names.append(BEST)
        return names

    def save(self, state: dict[str, Any], names: list[str]) -> None:
        """Write once, hard-link (or copy) under the other names, each atomically; rotate; all ranks wait."""
        if self.is_main:
            started = time.perf_counter()
            os.makedirs(self.cfg.save_dir, exist_ok=True)
            checkpoint = {"format": FORMAT, "version": VERSION, **state}
            first = os.path.join(self.cfg.save_dir, names[0])
            atomic_torch_save(checkpoint, first)
            for name in names[1:]:
                _link_atomically(first, os.path.join(self.cfg.save_dir, name), checkpoint)
            self.rotate()
            logger.info("saved %s at update %d (%.2fs)", ", ".join(names), state["num_updates"], time.perf_counter() - started)
        dist.barrier()

    def rotate(self) -> list[str]:
        """Delete numbered checkpoints beyond the ``keep_last`` newest."""
        if self.cfg.keep_last < 0:
            return []
        stale = numbered_checkpoints(self.cfg.save_dir)[self.cfg.keep_last :]
        for path in stale:
            os.remove(path)
        return stale

    def load_last(self) -> dict[str, Any] | None:
        path = os.path.join(self.cfg.save_dir, LAST)
        return load_checkpoint(path) if os.path.isfile(path) else None


def _link_atomically(source: str, target: str, state: dict[str, Any]) -> None:
    tmp = temporary_sibling(target)
    try:
        os.link(source, tmp)
    except OSError:  # no hard links here (some network file systems): write it again
        atomic_torch_save(state, target)
        return
    os.replace(tmp, target)
