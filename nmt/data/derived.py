"""Datasets derived from another one (back-translated, filtered): a training split written block by
block into a work directory beside the destination, with the source dataset's joint vocabulary,
then installed whole with its manifest, as ``nmt-preprocess`` installs its own."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np

from nmt.data.indexed import IndexedWriter
from nmt.data.manifest import Manifest, PartEntry, SplitEntry, SpmEntry, sha256_files
from nmt.data.preprocess import LineNumbersWriter, building_dataset
from nmt.data.spm import SPECIAL_IDS, token_dtype
from nmt.fileio import Destination

SPM_NAME = "spm.model"


class TrainSplitWriter:
    """The ``train`` split's two sides and raw line numbers, appended a block of pairs at a time."""

    def __init__(self, workdir: str, *, langs: tuple[str, str], vocab_size: int) -> None:
        dtype = token_dtype(vocab_size)
        self.dtype = dtype
        self.prefixes = [f"train.{lang}" for lang in langs]
        self.writers = [IndexedWriter(os.path.join(workdir, p), dtype=dtype) for p in self.prefixes]
        self.numbers_file = "train.line_numbers.npy"
        self.numbers = LineNumbersWriter(os.path.join(workdir, self.numbers_file))

    def add(self, sources: list[np.ndarray], targets: list[np.ndarray], lines: np.ndarray) -> None:
        """Pairs (token ids with EOS) and the raw line each came from."""
        for writer, sequences in zip(self.writers, (sources, targets)):
            writer.add_many(
                np.concatenate(sequences).astype(self.dtype)
                if sequences
                else np.zeros(0, dtype=self.dtype),
                np.array([len(s) for s in sequences], dtype=np.int64),
            )
        self.numbers.add(np.asarray(lines, dtype=np.int64))

    @property
    def num_samples(self) -> int:
        return self.writers[0].num_sequences

    def finish(self, *, num_lines: int, input_prefix: str, filtered: dict[str, int]) -> SplitEntry:
        sides = []
        for writer, prefix in zip(self.writers, self.prefixes):
            sides.append(writer.finish_entry(prefix))
        self.numbers.finish()
        part = PartEntry(
            src=sides[0],
            tgt=sides[1],
            num_lines=num_lines,
            num_samples=self.num_samples,
            line_numbers=self.numbers_file,
        )
        return SplitEntry(
            name="train",
            role="train",
            num_lines=num_lines,
            num_samples=self.num_samples,
            parts=(part,),
            input_prefix=input_prefix,
            filtered=filtered,
        )


def write_derived_dataset(
    source: Manifest,
    target: Destination,
    *,
    langs: tuple[str, str],
    fill: Callable[[TrainSplitWriter], SplitEntry],
    config: dict[str, Any],
) -> Manifest:
    """``target``: a dataset in ``source``'s joint vocabulary whose ``train`` split ``fill`` writes
    (returning its entry); built in a work directory and installed whole, or not at all."""
    if not source.spm.joint:
        raise ValueError(
            f"{source.directory}: a vocabulary per language; derived datasets need one joint vocabulary"
        )
    with building_dataset(target.path, target) as workdir:
        shutil.copyfile(source.path(source.spm.src_model), os.path.join(workdir, SPM_NAME))
        vocab_size = source.spm.src_vocab_size
        split = fill(TrainSplitWriter(workdir, langs=langs, vocab_size=vocab_size))
        if split.num_samples == 0:
            raise ValueError(
                f"{target.option} {target.path}: no pairs left ({', '.join(f'{k}={v}' for k, v in split.filtered.items())})"
            )
        manifest = Manifest(
            directory=target.path,
            source_lang=langs[0],
            target_lang=langs[1],
            special_ids=dict(SPECIAL_IDS),
            spm=SpmEntry(
                joint=True,
                src_model=SPM_NAME,
                tgt_model=SPM_NAME,
                src_vocab_size=vocab_size,
                tgt_vocab_size=vocab_size,
                given_model=source.path(source.spm.src_model),
            ),
            splits={"train": split},
            checksums=sha256_files(workdir, sorted(os.listdir(workdir))),
            config=config,
        )
        manifest.write(workdir)
    return manifest
