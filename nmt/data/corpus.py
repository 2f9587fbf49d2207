"""ParallelCorpus: a memory-mapped split of a preprocessed dataset, read through its manifest."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from nmt.data.indexed import IndexedDataset

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def load_manifest(data_dir: str) -> dict[str, Any]:
    path = os.path.join(data_dir, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest; is {data_dir} a directory written by nmt-preprocess?") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read manifest: {error}") from None
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise ValueError(f"{path}: manifest version {manifest.get('manifest_version')}, expected {MANIFEST_VERSION}")
    return manifest


class ParallelCorpus:
    """Source and target sides of one split; ``corpus[i] -> (src ids, tgt ids)`` (with EOS).

    Nothing is read into memory up front: tokens and lengths are memory-mapped.
    """

    def __init__(self, data_dir: str, split: str, *, manifest: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.manifest = load_manifest(data_dir) if manifest is None else manifest
        splits = self.manifest["splits"]
        if split not in splits:
            raise ValueError(f"{data_dir}: no split {split!r} (have: {', '.join(splits)})")
        self.split = split
        entry = splits[split]
        self.src = IndexedDataset(os.path.join(data_dir, entry["src"]["prefix"]))
        self.tgt = IndexedDataset(os.path.join(data_dir, entry["tgt"]["prefix"]))
        if len(self.src) != len(self.tgt):
            raise ValueError(f"{data_dir}: split {split!r} has {len(self.src)} source but {len(self.tgt)} target sequences")
        line_numbers = entry.get("line_numbers")
        self.line_numbers = (
            np.load(os.path.join(data_dir, line_numbers), mmap_mode="r") if line_numbers else np.arange(len(self.src))
        )

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[index], self.tgt[index]

    @property
    def src_lengths(self) -> np.ndarray:
        return self.src.lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths
