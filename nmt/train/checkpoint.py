"""Checkpoints: complete state, atomic writes, resume, rotation of old files."""

from __future__ import annotations

import glob
import os
import random
import re
from typing import Any

import numpy as np
import torch

from nmt.checkpoint_io import FORMAT, VERSION, atomic_torch_save, load_checkpoint

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
_NUMBERED = re.compile(r"^checkpoint(\d+)\.pt$|^checkpoint_(\d+)_(\d+)\.pt$")


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


def make_checkpoint(**entries: Any) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, **entries}


def numbered_name(*, epoch: int, num_updates: int, end_of_epoch: bool) -> str:
    return f"checkpoint{epoch}.pt" if end_of_epoch else f"checkpoint_{epoch}_{num_updates}.pt"


def save(state: dict[str, Any], save_dir: str, names: list[str]) -> None:
    """Write the state once, then hard-link (or copy) it under the other names, each atomically."""
    os.makedirs(save_dir, exist_ok=True)
    first = os.path.join(save_dir, names[0])
    atomic_torch_save(state, first)
    for name in names[1:]:
        target = os.path.join(save_dir, name)
        tmp = target + f".tmp-{os.getpid()}"
        try:
            os.link(first, tmp)
        except OSError:
            atomic_torch_save(state, target)
            continue
        os.replace(tmp, target)


def rotate(save_dir: str, *, keep_last: int) -> list[str]:
    """Delete numbered checkpoints beyond the ``keep_last`` newest (by update, then epoch)."""
    if keep_last < 0:
        return []
    numbered = []
    for path in glob.glob(os.path.join(save_dir, "checkpoint*.pt")):
        match = _NUMBERED.match(os.path.basename(path))
        if match:
            numbered.append((os.path.getmtime(path), path))
    stale = [path for _, path in sorted(numbered, reverse=True)[keep_last:]]
    for path in stale:
        os.remove(path)
    return stale


def find_resume_checkpoint(save_dir: str) -> dict[str, Any] | None:
    path = os.path.join(save_dir, LAST)
    return load_checkpoint(path) if os.path.isfile(path) else None
