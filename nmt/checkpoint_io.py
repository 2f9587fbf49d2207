"""The checkpoint file format, shared by training (which writes it) and evaluation (which reads it).

A checkpoint is a dict of tensors and plain data only, loaded with ``torch.load(weights_only=True)``
so that no code from a checkpoint file ever runs. Keys:

- ``format`` ("nmt-checkpoint"), ``version`` (int)
- ``model``: the *uncompiled* module's state dict; ``model_config``: ``nmt.config.ModelConfig`` as a dict
- ``vocab``: ``source_lang``, ``target_lang``, ``special_ids`` and the SentencePiece model protos as
  uint8 tensors (``src_spm``, ``tgt_spm``), so a checkpoint alone translates raw text
- training state (absent from averaged/exported checkpoints): ``train_config``, ``optimizer``,
  ``lr_scheduler``, ``scaler``, ``sampler``, ``rng``, ``num_updates``, ``epoch``, ``best``...
"""

from __future__ import annotations

import math
import os
import pickle
import re
import zipfile
from collections.abc import Sequence
from typing import Any

import torch

from nmt.fileio import atomic_write

FORMAT = "nmt-checkpoint"
VERSION = 1

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
# Numbered checkpoints: checkpoint{epoch}.pt at an epoch's end, checkpoint_{epoch}_{update}.pt in between.
NUMBERED = re.compile(r"checkpoint\d+\.pt|checkpoint_\d+_\d+\.pt")


def numbered_name(*, epoch: int, num_updates: int, end_of_epoch: bool) -> str:
    return f"checkpoint{epoch}.pt" if end_of_epoch else f"checkpoint_{epoch}_{num_updates}.pt"


def _training_order(name: str) -> tuple[int, float]:
    """(epoch, update) of a numbered name; an epoch's own checkpoint comes after its updates'."""
    numbers = [int(n) for n in re.findall(r"\d+", name)]
    return (numbers[0], numbers[1]) if len(numbers) == 2 else (numbers[0], math.inf)


def numbered_checkpoints(save_dir: str) -> list[str]:
    """The numbered checkpoints in ``save_dir``, newest first by the epoch and update in their names
    (file times change when files are copied or touched; the numbers do not)."""
    names = [name for name in os.listdir(save_dir) if NUMBERED.fullmatch(name)]
    return [
        os.path.join(save_dir, name) for name in sorted(names, key=_training_order, reverse=True)
    ]


def last_checkpoints(save_dir: str, count: int) -> list[str]:
    """The ``count`` newest numbered checkpoints in ``save_dir``."""
    if not os.path.isdir(save_dir):
        raise ValueError(f"{save_dir}: not a directory (--average-last needs a save dir as --path)")
    numbered = numbered_checkpoints(save_dir)
    if len(numbered) < count:
        raise ValueError(
            f"{save_dir}: --average-last {count} needs {count} numbered checkpoints "
            f"(checkpoint{{epoch}}.pt or checkpoint_{{epoch}}_{{update}}.pt), found {len(numbered)}"
        )
    return numbered[:count]


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


class _RecordingWriter:
    """A file that remembers the OSError its ``write`` raised: ``torch.save`` turns it into a
    RuntimeError without the cause ("enforce fail at inline_container.cc ... unexpected pos")."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def atomic_torch_save(obj: dict[str, Any], path: str) -> None:
    """``torch.save`` through ``atomic_write``: a kill or a full disk never leaves a broken ``path``,
    and a failed write is reported as the OSError it was (ENOSPC: "disk full" and the path)."""
    with atomic_write(path) as handle:
        writer = _RecordingWriter(handle)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load safely (``weights_only=True``) and check it is one of ours; clear errors otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError) as error:
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        raise ValueError(
            f"{path}: not an nmt checkpoint (cannot be loaded safely: {first_line})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not an nmt checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise ValueError(
            f"{path}: checkpoint version {state.get('version')}, this nmt reads version {VERSION}"
        )
    return state


def load_model_checkpoint(path: str) -> dict[str, Any]:
    """``load_checkpoint``, checked to hold what decoding needs: the weights, the model config, the vocabulary."""
    state = load_checkpoint(path)
    for key in ("model", "model_config", "vocab"):
        if key not in state:
            raise ValueError(f"{path}: checkpoint has no {key!r} entry")
    return state


def same_vocab(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def load_averaged_checkpoint(paths: Sequence[str]) -> dict[str, Any]:
    """One checkpoint, or several with their weights averaged (same model config and vocabulary).

    The sum is taken in float64 so that the order of the files does not change the result and the
    average of identical checkpoints is exactly that checkpoint.
    """
    if not paths:
        raise ValueError("--path: no checkpoint given")
    first = load_model_checkpoint(paths[0])
    if len(paths) == 1:
        return first
    weights = first["model"]
    sums = {
        name: tensor.double() if tensor.is_floating_point() else tensor
        for name, tensor in weights.items()
    }
    for path in paths[1:]:
        state = load_model_checkpoint(path)
        if state["model_config"] != first["model_config"]:
            raise ValueError(
                f"{path}: model config differs from {paths[0]}'s; only checkpoints of one model can be averaged"
            )
        if not same_vocab(state["vocab"], first["vocab"]):
            raise ValueError(
                f"{path}: vocabulary differs from {paths[0]}'s; only checkpoints of one model can be averaged"
            )
        if state["model"].keys() != weights.keys():
            raise ValueError(
                f"{path}: parameter names differ from {paths[0]}'s; only checkpoints of one model can be averaged"
            )
        for name, tensor in state["model"].items():
            if tensor.is_floating_point():
                sums[name] += tensor.double()
    averaged = {
        name: (total / len(paths)).to(weights[name].dtype)
        if weights[name].is_floating_point()
        else total
        for name, total in sums.items()
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": averaged,
        "model_config": first["model_config"],
        "vocab": first["vocab"],
    }
