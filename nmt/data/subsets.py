"""Training splits by name: ``SPLIT`` of the dataset being trained on, or ``DIR/SPLIT`` of another
dataset directory with the same vocabulary and languages (a back-translated corpus written by
``nmt-eval --output-dataset``, say), blended like any other corpus of the dataset."""

from __future__ import annotations

import os

from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import Manifest, SplitEntry, load_manifest


def subset_manifest(manifest: Manifest, name: str) -> tuple[Manifest, str]:
    """(the manifest holding split ``name``, the split's name in it); checked against ``manifest``
    (the training dataset's) in one line when it is another dataset's."""
    if name in manifest.splits or "/" not in name:
        return manifest, name
    directory, split = name.rstrip("/").rsplit("/", 1)
    if not os.path.isdir(directory):
        raise ValueError(
            f"--train-subsets {name}: {manifest.directory} has no split {name!r} and {directory} is no directory"
        )
    other = load_manifest(directory)
    if (other.source_lang, other.target_lang) != (manifest.source_lang, manifest.target_lang):
        raise ValueError(
            f"--train-subsets {name}: {other.source_lang}-{other.target_lang} data, "
            f"{manifest.directory} is {manifest.source_lang}-{manifest.target_lang}"
        )
    for side in ("src_model", "tgt_model"):
        ours, theirs = getattr(manifest.spm, side), getattr(other.spm, side)
        if manifest.checksums.get(ours) != other.checksums.get(theirs) or not other.checksums.get(
            theirs
        ):
            raise ValueError(
                f"--train-subsets {name}: {other.path(theirs)} is not the vocabulary of "
                f"{manifest.path(ours)}; preprocess it with --spm-model {manifest.path(ours)}"
            )
    other.split(split)  # a missing split: one line naming the directory
    return other, split


def open_subset(manifest: Manifest, name: str) -> ParallelCorpus:
    other, split = subset_manifest(manifest, name)
    return ParallelCorpus(other.directory, split, manifest=other)


def subset_entry(manifest: Manifest, name: str) -> SplitEntry:
    other, split = subset_manifest(manifest, name)
    return other.split(split)
