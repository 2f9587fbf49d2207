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

import os
import pickle
import zipfile
from typing import Any

import torch

from nmt.fileio import atomic_write

FORMAT = "nmt-checkpoint"
VERSION = 1


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


def atomic_torch_save(obj: dict[str, Any], path: str) -> None:
    """``torch.save`` through ``atomic_write``: a kill or a full disk never leaves a broken ``path``."""
    with atomic_write(path) as handle:
        torch.save(obj, handle)


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load safely (``weights_only=True``) and check it is one of ours; clear errors otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path}: not an nmt checkpoint (cannot be loaded safely: {first_line})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not an nmt checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise ValueError(f"{path}: checkpoint version {state.get('version')}, this nmt reads version {VERSION}")
    return state
