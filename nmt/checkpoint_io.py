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

import codecs
import math
import os
import pickle
import re
import warnings
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


_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80  # the first byte of a pickle of protocol 2 or later (torch's legacy format)


def _first_sentence(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text.split(". ")[0].rstrip(".") if text else type(error).__name__


def _looks_like_text(header: bytes) -> bool:
    try:  # incremental: the header may end inside a character
        text = codecs.getincrementaldecoder("utf-8")().decode(header)
    except UnicodeDecodeError:
        return False
    return all(char.isprintable() or char in "\t\n\r\f\v" for char in text)


def _why_not_loaded(header: bytes, error: Exception) -> str:
    """Why ``torch.load`` failed, in a few words (torch's own messages run to pages)."""
    if not header.startswith(_ZIP_MAGIC) and header[:1] != bytes([_PICKLE_PROTO]):
        # First: text starting with "c" reads as a pickle's GLOBAL opcode, a refused "import".
        return (
            "a text file"
            if _looks_like_text(header)
            else "neither a zip archive nor a pickle, as torch.save writes"
        )
    if isinstance(error, pickle.UnpicklingError):
        # torch re-raises the unpickler's error "from None" with pages of advice; the context keeps it.
        error = error.__context__ if isinstance(error.__context__, Exception) else error
        refused = re.search(r"GLOBAL (\S+)", str(error))
        if refused:
            return (
                f"loading it would import {refused.group(1)}; only tensors and plain data are "
                "loaded, so that no code from a file runs"
            )
        return f"its pickle does not load safely: {_first_sentence(error)}"
    if isinstance(error, EOFError):
        return "truncated: it ends too early"
    return f"truncated or damaged: {_first_sentence(error)}"


def load_torch_file(
    path: str, *, what: str, allowed: Sequence[type] = (), refused_hint: str = ""
) -> Any:
    """``torch.load(weights_only=True)`` of a file a user named, ``allowed`` the classes it may
    build besides tensors and plain data: every way the file can be wrong (missing, empty, text,
    truncated, another zip, code in its pickle...) is one ValueError "PATH: not WHAT (why)".
    ``refused_hint`` follows the reason when a class outside ``allowed`` is refused."""
    if os.path.isdir(path):
        raise ValueError(f"{path}: a directory, not a checkpoint file")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such checkpoint file")
    try:
        with open(path, "rb") as handle:
            header = handle.read(512)
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error.strerror or error}") from None
    if not header:
        raise ValueError(f"{path}: not {what} (an empty file)")
    if header.startswith(_ZIP_MAGIC):
        # Checked here: torch reports a truncated archive as "OSError: Invalid argument", pathless.
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            raise ValueError(f"{path}: not {what} (a truncated or damaged zip archive)") from None
        if not any(name.count("/") == 1 and name.endswith("/data.pkl") for name in names):
            raise ValueError(f"{path}: not {what} (a zip archive without torch's data.pkl)")
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(list(allowed)):
            # Said of every pickle of protocol 4 or later, loadable or not: not the user's business.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except OSError as error:
        if error.filename is not None:  # the disk's fault, not the file's: said with its path
            raise
        reason = _why_not_loaded(header, error)
    except Exception as error:
        # Whatever the unpickler raises on bytes it cannot read (KeyError for text...) is the file's.
        reason = _why_not_loaded(header, error)
    hint = f"; {refused_hint}" if refused_hint and reason.startswith("loading it would") else ""
    raise ValueError(f"{path}: not {what} ({reason}){hint}")


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load safely (``weights_only=True``) and check it is one of ours; clear errors otherwise."""
    state = load_torch_file(path, what="an nmt checkpoint")
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
