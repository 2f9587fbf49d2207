"""Checkpoints of a run: complete state, atomic writes, resume, rotation of old files.

Names and the file format live in ``nmt.checkpoint_io`` (evaluation reads them too); this module
decides what a training checkpoint holds and when old ones go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import platform
import random
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

from nmt import dist
from nmt.checkpoint_io import (
    FORMAT,
    LAST,
    VERSION,
    atomic_torch_save,
    bytes_to_tensor,
    numbered_checkpoints,
    numbered_name,
)
from nmt.config import RUN_IDENTITIES, CheckpointConfig, ModelConfig, TrainConfig
from nmt.data.manifest import Manifest
from nmt.data.subsets import subset_entry, subset_manifest
from nmt.fileio import (
    describe_os_error,
    exclusive_lock,
    remove_stale_temporaries,
    temporary_sibling,
)
from nmt.provenance import defaults, differences, identity
from nmt.train.stopping import Progress

logger = logging.getLogger(__name__)

# Numbered checkpoints of each kind, for --keep-last-epochs and --keep-interval-updates.
EPOCH_CHECKPOINT = re.compile(r"checkpoint\d+\.pt")
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_\d+\.pt")


def rng_state() -> dict[str, Any]:
    """RNG states as tensors/plain data (``weights_only``-loadable)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }
    if torch.cuda.is_initialized():
        # This process's device only: get_rng_state_all() would start a CUDA context on every GPU.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if isinstance(state.get("cuda"), torch.Tensor) and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])


def read_vocab(manifest: Manifest, *, lang_tok: str = "encoder") -> dict[str, Any]:
    """What a checkpoint needs to translate raw text on its own: languages, ids, SentencePiece
    models; a multilingual model's directions, tags and where its tag goes (``lang_tok``)."""
    vocab: dict[str, Any] = {
        "source_lang": manifest.source_lang,
        "target_lang": manifest.target_lang,
        "special_ids": dict(manifest.special_ids),
    }
    vocab.update(manifest.languages(lang_tok).to_vocab())  # nothing for one untagged direction
    for side, name in (("src", manifest.spm.src_model), ("tgt", manifest.spm.tgt_model)):
        with open(manifest.path(name), "rb") as handle:
            vocab[f"{side}_spm"] = bytes_to_tensor(handle.read())
    return vocab


# What a run is, for resuming it: one part per reset flag that accepts a change in it (the options
# of each part are declared with opt(identity=...) in nmt.config). The vocabulary and the model's
# shape can never change under the same weights.
IDENTITY_RESETS = {
    "vocabulary": None,
    "model": None,
    "training data": "--reset-dataloader",
    "batch sequence": "--reset-dataloader",
    "optimizer": "--reset-optimizer",
    "learning-rate schedule": "--reset-lr-scheduler",
}
assert set(RUN_IDENTITIES) <= set(IDENTITY_RESETS)
# Model options a resumed run may change: those of no identity (they shape no weight).
MODEL_OPTIONS_FREE_TO_CHANGE = tuple(
    f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("identity") is None
)


def _declared_by(group: str) -> type:
    return ModelConfig if group == "model" else TrainConfig


def run_identity(
    cfg: TrainConfig, model_cfg: ModelConfig, manifest: Manifest
) -> dict[str, dict[str, Any]]:
    """The options and data a checkpoint's state belongs to, grouped as ``IDENTITY_RESETS``."""
    options = {
        group: identity(model_cfg if group == "model" else cfg, group) for group in RUN_IDENTITIES
    }
    spm_files = sorted({manifest.spm.src_model, manifest.spm.tgt_model})
    train_splits = manifest.training_splits(cfg.data.train_subsets)
    train_files: dict[str, str] = {}
    for subset in train_splits:
        holder, split = subset_manifest(manifest, subset)
        where = "" if holder is manifest else os.path.abspath(holder.directory) + "/"
        prefixes = tuple(
            side.prefix + "." for part in holder.split(split).parts for side in (part.src, part.tgt)
        )
        train_files.update(
            (where + name, checksum)
            for name, checksum in holder.checksums.items()
            if name.startswith(prefixes)
        )
    return {
        "vocabulary": {
            "languages": f"{manifest.source_lang}-{manifest.target_lang}",
            **(
                {"directions": ",".join(manifest.lang_pairs)} if manifest.languages().tagged else {}
            ),
            **{
                f"SentencePiece model {name}": manifest.checksums.get(name, "?")
                for name in spm_files
            },
            **options["vocabulary"],
        },
        "model": options["model"],
        "training data": {
            **dict(sorted(train_files.items())),
            **{
                f"samples in {split}": subset_entry(manifest, split).num_samples
                for split in train_splits
            },
        },
        "batch sequence": options["batch sequence"],
        "optimizer": options["optimizer"],
        "learning-rate schedule": {
            **options["learning-rate schedule"],
            # the cosine schedule runs to --max-update: it is part of the schedule only then
            "--max-update": cfg.run.max_update if cfg.optim.lr_scheduler == "cosine" else None,
        },
    }


def check_identity(
    path: str, saved: dict[str, Any] | None, current: dict[str, Any], cfg: CheckpointConfig
) -> None:
    """ValueError listing, one line per item, what differs between ``path``'s run and this one and
    no --reset-* flag of ``cfg`` accepts. An option newer than the checkpoint compares as its
    default: the code that wrote the checkpoint behaved as that default does."""
    if saved is None:
        logger.warning(
            "%s records no run identity (an older checkpoint): options not checked", path
        )
        return
    accepted = {
        "--reset-dataloader": cfg.reset_dataloader,
        "--reset-optimizer": cfg.reset_optimizer,
        "--reset-lr-scheduler": cfg.reset_lr_scheduler,
    }
    refused = []
    for group, items in current.items():
        lines = differences(
            saved.get(group, {}),
            items,
            absent=defaults(_declared_by(group), group) if group in RUN_IDENTITIES else None,
            labels=("in the checkpoint", "now"),
        )
        if not lines:
            continue
        flag = IDENTITY_RESETS[group]
        if flag is not None and accepted[flag]:
            logger.info("%s: %s accepts the changed %s (%s)", path, flag, group, "; ".join(lines))
            continue
        advice = f"pass {flag} to accept it" if flag else "it cannot change under the same weights"
        refused += [f"  {group}: {line} ({advice})" for line in lines]
    if refused:
        raise ValueError(
            f"{path}: cannot resume: the checkpoint's run differs from this one:\n"
            + "\n".join(refused)
            + "\nuse the checkpoint's options, a new --save-dir, or the --reset-* flag named"
        )


LOCK_NAME = ".nmt.lock"


def lock_save_dir(save_dir: str, *, is_main: bool) -> contextlib.ExitStack:
    """One run per --save-dir: rank 0 holds the lock until the returned stack is closed; every rank
    stops if it cannot have it."""
    held = contextlib.ExitStack()
    problem = None
    if is_main:
        try:
            os.makedirs(save_dir, exist_ok=True)
            held.enter_context(
                exclusive_lock(os.path.join(save_dir, LOCK_NAME), what=f"--save-dir {save_dir}")
            )
        except (ValueError, OSError) as error:
            problem = str(
                describe_os_error(error, save_dir) if isinstance(error, OSError) else error
            )
    problem = dist.broadcast_object(problem)
    if problem is not None:
        raise ValueError(problem)
    return held


def provenance() -> dict[str, Any]:
    """How a checkpoint was made: the command line, the versions, the code's git revision if known."""
    versions = {"python": platform.python_version()}
    for package in ("nmt", "torch", "sentencepiece", "sacrebleu", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "command_line": list(sys.argv),
        "versions": versions,
        "git_revision": _git_revision(),
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def _git_revision() -> str | None:
    """The revision of the checkout this code runs from (an installed release has none)."""
    source = os.path.dirname(os.path.abspath(__file__))
    try:
        result = subprocess.run(
            ["git", "-C", source, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", source, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() + ("-dirty" if dirty else "")


class Checkpointer:
    """Writes the run's checkpoints (rank 0) and finds the one to resume from."""

    def __init__(self, cfg: CheckpointConfig, *, is_main: bool) -> None:
        self.cfg = cfg
        self.is_main = is_main

    def remove_stale_temporaries(self) -> None:
        """Temporaries of saves killed before their rename (call while holding the directory's lock)."""
        if self.is_main and os.path.isdir(self.cfg.save_dir):
            for name in remove_stale_temporaries(self.cfg.save_dir):
                logger.info("removed %s, left by a save that was killed", name)

    def due(self, at: Progress, *, stopping: bool, validating: bool) -> list[str]:
        """The files to write after this update (the first is written, the others are links to
        it), none when no save is due. checkpoint_last.pt at every epoch's end, before every
        validation (so a crash there loses nothing) and when the run stops; a numbered checkpoint
        every --save-interval epochs (``checkpointE.pt``) or --save-interval-updates updates
        (``checkpoint_E_U.pt``, E the epoch in progress), the epoch's taking precedence."""
        if at.ends_epoch:
            numbered = not self.cfg.no_epoch_checkpoints and at.epoch % self.cfg.save_interval == 0
        else:
            every = self.cfg.save_interval_updates
            numbered = every > 0 and at.update % every == 0
        names = (
            [numbered_name(epoch=at.epoch, num_updates=at.update, end_of_epoch=at.ends_epoch)]
            if numbered
            else []
        )
        if names or at.ends_epoch or stopping or validating:
            names.append(LAST)
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
            logger.info(
                "saved %s at update %d (%.2fs)",
                ", ".join(names),
                state["num_updates"],
                time.perf_counter() - started,
            )
        dist.barrier()

    def rotate(self) -> list[str]:
        """Delete numbered checkpoints beyond the newest --keep-last (of both kinds),
        --keep-last-epochs and --keep-interval-updates."""
        numbered = numbered_checkpoints(self.cfg.save_dir)  # newest first
        stale: set[str] = set()
        for kind, keep in (
            (None, self.cfg.keep_last),
            (EPOCH_CHECKPOINT, self.cfg.keep_last_epochs),
            (UPDATE_CHECKPOINT, self.cfg.keep_interval_updates),
        ):
            if keep >= 0:
                paths = [p for p in numbered if kind is None or kind.fullmatch(os.path.basename(p))]
                stale.update(paths[keep:])
        for path in sorted(stale):
            os.remove(path)
        return sorted(stale)


def _link_atomically(source: str, target: str, state: dict[str, Any]) -> None:
    tmp = temporary_sibling(target)
    try:
        os.link(source, tmp)
    except OSError:  # no hard links here (some network file systems): write it again
        atomic_torch_save(state, target)
        return
    os.replace(tmp, target)
