"""The dataset manifest (``manifest.json``), read once per run into typed, checked entries.

A dataset directory is self-contained: every path in the manifest is relative to the directory, so
a moved or copied dataset still opens, and valid/test splits carry their raw reference text
(compressed) inside it. A manifest with a missing or mistyped entry is reported as one line naming
the file and the entry, never as a KeyError deep in training.

A split is a list of parts (one, unless it was preprocessed in shards): part k holds the raw lines
``[first_line, first_line + num_lines)`` and is read as if the parts were one file.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from nmt.data.spm import SPECIAL_IDS
from nmt.languages import Languages

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2  # 2: splits in parts, references, token-id maxima; version 1 is still read


@dataclass(frozen=True)
class SideEntry:
    """One side (source or target) of a part: ``prefix.bin`` / ``prefix.idx``."""

    prefix: str
    num_tokens: int
    token_dtype: str
    max_token_id: int | None = None  # the largest id written (None: a version-1 manifest)


@dataclass(frozen=True)
class PartEntry:
    src: SideEntry
    tgt: SideEntry
    num_lines: int  # raw lines this part was made from
    num_samples: int  # pairs kept
    first_line: int = 0  # 0-based raw line of the part's first line
    line_numbers: str | None = None  # .npy with the raw line of each kept pair (train splits)


@dataclass(frozen=True)
class SplitEntry:
    name: str
    role: str  # train | valid | test
    num_lines: int  # lines of the raw text
    num_samples: int  # pairs kept
    parts: tuple[PartEntry, ...]
    input_prefix: str | None = None  # where the raw text was read from (informative only)
    filtered: dict[str, int] = field(
        default_factory=dict
    )  # pairs dropped, by reason (dedup: "duplicate")
    replaced_invalid_utf8: int = 0
    reference: str | None = (
        None  # the raw target text, gzip-compressed, inside the dataset (valid/test)
    )


@dataclass(frozen=True)
class SpmEntry:
    joint: bool
    src_model: str
    tgt_model: str
    src_vocab_size: int
    tgt_vocab_size: int
    given_model: str | None = None


@dataclass(frozen=True)
class Manifest:
    directory: str  # where it was read from (not stored)
    source_lang: str
    target_lang: str
    special_ids: dict[str, int]
    spm: SpmEntry
    splits: dict[str, SplitEntry]
    checksums: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    convention: str = (
        "source = pieces + EOS; target = pieces + EOS; decoder input = BOS + target[:-1]"
    )
    # Tagged datasets (nmt-preprocess --lang-pairs): the directions "src-tgt" in the order given,
    # each with the splits "SPLIT.src-tgt"; the language tags and their ids. Empty for a dataset of
    # one untagged direction, source_lang-target_lang, whose splits are "SPLIT" (as main wrote them).
    lang_pairs: tuple[str, ...] = ()
    tags: dict[str, int] = field(default_factory=dict)

    def languages(self, placement: str = "encoder") -> Languages:
        """The dataset's directions, their tags placed as ``placement`` (a training choice)."""
        if not self.lang_pairs:
            return Languages.one_direction(self.source_lang, self.target_lang)
        return Languages(pairs=self.lang_pairs, tags=dict(self.tags), placement=placement)

    def direction_split(self, split: str, pair: str) -> str:
        """The split of one direction: ``valid`` and ``en-de`` -> ``valid.en-de`` (``valid`` on a
        dataset of one untagged direction)."""
        pairs = self.languages().pairs
        if pair not in pairs:
            raise ValueError(f"{self.directory}: no direction {pair} (has: {', '.join(pairs)})")
        return direction_split(split, pair) if self.lang_pairs else split

    def training_splits(self, names: tuple[str, ...] | list[str]) -> list[str]:
        """The stored splits of training splits ``names``: each direction's (``train`` ->
        ``train.en-de``, ``train.de-en``...), or a name that is no split of this dataset as it is
        (another dataset's ``DIR/SPLIT``)."""
        return [
            split
            for name in names
            for split in (self.direction_splits(name) or {"": name}).values()
        ]

    def direction_splits(self, split: str) -> dict[str, str]:
        """Direction -> its split of ``split`` (e.g. every direction's ``valid``), where present."""
        found = {pair: self.direction_split(split, pair) for pair in self.languages().pairs}
        return {pair: name for pair, name in found.items() if name in self.splits}

    def path(self, name: str) -> str:
        """A file of the dataset, wherever the directory is now."""
        return os.path.join(self.directory, name)

    def split(self, name: str) -> SplitEntry:
        if name not in self.splits:
            raise ValueError(
                f"{self.directory}: no split {name!r} (have: {', '.join(self.splits)})"
            )
        return self.splits[name]

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest_version": MANIFEST_VERSION,
            "source_lang": self.source_lang,
            "target_lang": self.target_lang,
            "special_ids": dict(self.special_ids),
            "convention": self.convention,
            "spm": vars(self.spm).copy(),
            "splits": {name: _split_json(entry) for name, entry in self.splits.items()},
            "config": self.config,
            "checksums": dict(self.checksums),
            **(
                {"lang_pairs": list(self.lang_pairs), "tags": dict(self.tags)}
                if self.lang_pairs
                else {}
            ),
        }

    @classmethod
    def from_json(
        cls, values: dict[str, Any], *, directory: str, source: str = MANIFEST_NAME
    ) -> Manifest:
        reader = _Reader(source)
        version = reader.get(values, "manifest_version", int)
        if version not in (1, MANIFEST_VERSION):
            raise ValueError(
                f"{source}: manifest version {version}, this nmt reads versions 1 and {MANIFEST_VERSION}"
            )
        spm = reader.get(values, "spm", dict)
        splits = reader.get(values, "splits", dict)
        special_ids = reader.get(values, "special_ids", dict)
        if special_ids != SPECIAL_IDS:
            # Collate, the loss and the search use the toolkit's ids; a dataset with others would
            # train on the wrong padding silently.
            raise ValueError(f"{source}: special ids {special_ids}, this nmt uses {SPECIAL_IDS}")
        return cls(
            directory=directory,
            source_lang=reader.get(values, "source_lang", str),
            target_lang=reader.get(values, "target_lang", str),
            special_ids=special_ids,
            spm=SpmEntry(
                joint=reader.get(spm, "joint", bool, where="spm"),
                src_model=reader.get(spm, "src_model", str, where="spm"),
                tgt_model=reader.get(spm, "tgt_model", str, where="spm"),
                src_vocab_size=reader.get(spm, "src_vocab_size", int, where="spm"),
                tgt_vocab_size=reader.get(spm, "tgt_vocab_size", int, where="spm"),
                given_model=spm.get("given_model"),
            ),
            splits={name: reader.split(name, entry) for name, entry in splits.items()},
            checksums=values.get("checksums", {}),
            config=values.get("config", {}),
            lang_pairs=tuple(values.get("lang_pairs", ())),
            tags=dict(values.get("tags", {})),
        )

    def write(self, directory: str) -> None:
        """``directory/manifest.json``, atomically: a directory with a manifest is a complete one."""
        from nmt.fileio import atomic_write

        with atomic_write(os.path.join(directory, MANIFEST_NAME), "w", encoding="utf-8") as handle:
            json.dump(self.to_json(), handle, indent=2)
            handle.write("\n")


def direction_split(split: str, pair: str) -> str:
    return f"{split}.{pair}"


def _split_json(entry: SplitEntry) -> dict[str, Any]:
    values = {key: value for key, value in vars(entry).items() if key != "name"}
    values["parts"] = [
        {**vars(part), "src": vars(part.src).copy(), "tgt": vars(part.tgt).copy()}
        for part in entry.parts
    ]
    return values


class _Reader:
    """Typed access to the JSON, with errors that name the manifest and the entry."""

    def __init__(self, source: str) -> None:
        self.source = source

    def get(self, values: Any, key: str, kind: type, *, where: str = "") -> Any:
        name = f"{where}.{key}" if where else key
        if not isinstance(values, dict) or key not in values:
            raise ValueError(
                f"{self.source}: no {name!r} entry (not a complete nmt-preprocess manifest)"
            )
        value = values[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(
                f"{self.source}: entry {name!r} should be a {kind.__name__}, got {value!r}"
            )
        return value

    def side(self, values: Any, where: str) -> SideEntry:
        return SideEntry(
            prefix=self.get(values, "prefix", str, where=where),
            num_tokens=self.get(values, "num_tokens", int, where=where),
            token_dtype=self.get(values, "token_dtype", str, where=where),
            max_token_id=values.get("max_token_id"),
        )

    def part(self, values: Any, where: str) -> PartEntry:
        return PartEntry(
            src=self.side(self.get(values, "src", dict, where=where), f"{where}.src"),
            tgt=self.side(self.get(values, "tgt", dict, where=where), f"{where}.tgt"),
            num_lines=self.get(values, "num_lines", int, where=where),
            num_samples=self.get(values, "num_samples", int, where=where),
            first_line=values.get("first_line", 0),
            line_numbers=values.get("line_numbers"),
        )

    def split(self, name: str, values: Any) -> SplitEntry:
        where = f"splits.{name}"
        if (
            isinstance(values, dict) and "parts" not in values and "src" in values
        ):  # version 1: one part
            parts = (self.part(values, where),)
        else:
            parts = tuple(
                self.part(part, f"{where}.parts.{k}")
                for k, part in enumerate(self.get(values, "parts", list, where=where))
            )
        num_samples = self.get(values, "num_samples", int, where=where)
        if sum(part.num_samples for part in parts) != num_samples:
            raise ValueError(
                f"{self.source}: {where}: parts hold {sum(p.num_samples for p in parts)} samples, the split says {num_samples}"
            )
        return SplitEntry(
            name=name,
            role=self.get(values, "role", str, where=where),
            num_lines=self.get(values, "num_lines", int, where=where),
            num_samples=num_samples,
            parts=parts,
            input_prefix=values.get("input_prefix"),
            filtered=values.get("filtered", {}),
            replaced_invalid_utf8=values.get("replaced_invalid_utf8", 0),
            reference=values.get("reference"),
        )


def load_manifest(data_dir: str) -> Manifest:
    path = os.path.join(data_dir, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except FileNotFoundError:
        raise ValueError(
            f"{path}: no manifest; is {data_dir} a directory written by nmt-preprocess?"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read manifest: {error}") from None
    return Manifest.from_json(values, directory=data_dir, source=path)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def sha256_files(directory: str, names: list[str], *, num_threads: int = 0) -> dict[str, str]:
    """SHA-256 of each file, on threads (hashlib releases the GIL on large blocks)."""
    workers = num_threads or min(len(names), os.cpu_count() or 1) or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        sums = pool.map(lambda name: sha256_file(os.path.join(directory, name)), names)
        return dict(zip(names, sums))


def verify_checksums(manifest: Manifest, *, num_threads: int = 0) -> None:
    """Check every file the manifest lists against its SHA-256 (``nmt-train --verify-data``).

    Raises ValueError naming the first file that is missing or differs; reads every byte of the
    dataset (a few seconds per GB on threads).
    """
    if not manifest.checksums:
        raise ValueError(f"{manifest.path(MANIFEST_NAME)}: lists no checksums to verify")
    names = sorted(manifest.checksums)
    for name in names:
        if not os.path.isfile(manifest.path(name)):
            raise ValueError(f"{manifest.path(name)}: missing (listed in {MANIFEST_NAME})")
    found = sha256_files(manifest.directory, names, num_threads=num_threads)
    for name in names:
        if found[name] != manifest.checksums[name]:
            raise ValueError(
                f"{manifest.path(name)}: SHA-256 differs from {MANIFEST_NAME} (the file changed or was corrupted "
                "after preprocessing; preprocess again or restore it)"
            )
