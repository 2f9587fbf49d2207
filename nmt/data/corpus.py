"""ParallelCorpus: a memory-mapped split of a preprocessed dataset, read through its manifest."""

from __future__ import annotations


import numpy as np

from nmt.data.indexed import IndexedDataset
from nmt.data.manifest import Manifest, load_manifest


class ParallelCorpus:
    """Source and target sides of one split; ``corpus[i] -> (src ids, tgt ids)`` (with EOS).

    Nothing is read into memory up front: tokens and lengths are memory-mapped.
    """

    def __init__(self, data_dir: str, split: str, *, manifest: Manifest | None = None) -> None:
        self.data_dir = data_dir
        self.manifest = load_manifest(data_dir) if manifest is None else manifest
        self.split = split
        self.entry = self.manifest.split(split)
        self.src = IndexedDataset(self.manifest.path(self.entry.src.prefix))
        self.tgt = IndexedDataset(self.manifest.path(self.entry.tgt.prefix))
        if len(self.src) != len(self.tgt):
            raise ValueError(f"{data_dir}: split {split!r} has {len(self.src)} source but {len(self.tgt)} target sequences")
        line_numbers = self.entry.line_numbers
        self.line_numbers = np.load(self.manifest.path(line_numbers), mmap_mode="r") if line_numbers else np.arange(len(self.src))

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
