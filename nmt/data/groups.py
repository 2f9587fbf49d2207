"""Text groups: which files of a split hold which directions, so that each language side is read and
encoded once (steps of ``nmt.data.preprocess``'s one pipeline).

A group is the aligned files of some languages: a bilingual corpus ``P.SRC``/``P.TGT``, the
multi-way files ``P.LANG`` of a ``--lang-pairs`` dataset (line i of every language is the same
sentence), or one pair's files ``P.SRC-TGT.LANG`` (fairseq's naming, for corpora that are not
multi-way; ``de-en`` reads ``P.en-de.*`` when only those exist). A direction in two groups, or half
a pair's files beside a complete group, is refused: one of them is never chosen silently. The
directions of a group share its per-language token files: 6 directions over 4 multi-way languages
store 4 token files per split, not 12 (and encode each sentence once).

A ``--lang-pairs`` dataset's joint SentencePiece model samples each language in proportion to
``sentences^(1/T)`` (``--spm-lang-temperature``, ``language_shares``), so a small language still
gets its pieces; its language tags ``<2xx>`` are reserved in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nmt.data.spm import SentencePieceModel
from nmt.data.text import DataError, resolve_text_file
from nmt.languages import Pair, language_tag


@dataclass
class TextGroup:
    """Aligned files of some languages: the multi-way ``P.LANG`` (``stem`` "") or one pair's
    ``P.A-B.LANG`` (``stem`` "A-B"), and the directions read from them."""

    stem: str
    paths: dict[str, str] = field(default_factory=dict)  # language -> file
    directions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        """The languages some direction of the group translates into (their text is a reference)."""
        return sorted({tgt for _, tgt in self.directions})

    def prefix(self, split: str, lang: str) -> str:
        """The token files of one language side in the dataset."""
        return f"{split}.{self.stem}.{lang}" if self.stem else f"{split}.{lang}"


def _exists(prefix: str, lang: str) -> str | None:
    try:
        return resolve_text_file(prefix, lang)
    except DataError:
        return None


def _file_sets(prefix: str, src: str, tgt: str) -> dict[str, dict[str, str | None]]:
    """Per stem ("SRC-TGT", "TGT-SRC", "" for the multi-way files): each language's file, or None."""
    return {
        stem: {lang: _exists(f"{prefix}.{stem}" if stem else prefix, lang) for lang in (src, tgt)}
        for stem in (Pair(src, tgt).name, Pair(tgt, src).name, "")
    }


def resolve_groups(prefix: str, pairs: list[tuple[str, str]], *, option: str) -> list[TextGroup]:
    """The text groups of one split prefix (given as ``option``), every file resolved. A missing
    file, a direction in two sets of files, or half a per-pair set beside a complete set is one line
    naming them: reading one set silently could train or score on other text than was meant."""
    groups: dict[str, TextGroup] = {}
    for src, tgt in pairs:
        direction = Pair(src, tgt).name
        sets = _file_sets(prefix, src, tgt)
        complete = {stem: found for stem, found in sets.items() if all(found.values())}
        named = {stem: " + ".join(filter(None, found.values())) for stem, found in sets.items()}
        if len(complete) > 1:
            first, second = [named[stem] for stem in complete][:2]
            raise DataError(
                f"{option} {prefix}: direction {direction} is in two sets of files, {first}, and "
                f"{second}; keep one set (move the other away, or give {option} a prefix with "
                "only one)"
            )
        halves = [
            stem
            for stem, found in sets.items()
            if stem and stem not in complete and any(found.values())
        ]
        if complete and halves:
            lang = next(lang for lang, path in sets[halves[0]].items() if path is None)
            raise DataError(
                f"{option} {prefix}: direction {direction} has {named[halves[0]]} without "
                f"{prefix}.{halves[0]}.{lang} (nor .gz/.xz/.zst) beside the complete "
                f"{named[next(iter(complete))]}; complete the per-pair set or move it away"
            )
        if not complete:
            lang = next(lang for lang, path in sets[""].items() if path is None)
            raise DataError(
                f"{prefix}.{lang}: no such file (nor .gz/.xz/.zst, nor the per-pair "
                f"{prefix}.{direction}.{lang}) for direction {direction}"
            )
        stem, found = next(iter(complete.items()))
        group = groups.setdefault(stem, TextGroup(stem=stem))
        group.paths.update({lang: path for lang, path in found.items() if path is not None})
        group.directions.append((src, tgt))
    return list(groups.values())


def language_shares(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """Each language's share of the SentencePiece sample: proportional to ``count^(1/T)``."""
    weights = {lang: count ** (1.0 / temperature) for lang, count in counts.items() if count}
    total = sum(weights.values())
    return {lang: weight / total for lang, weight in weights.items()}


def given_model(path: str, languages: list[str]) -> bytes:
    """The proto of ``--spm-model`` ``path``, which must reserve the tag of every language."""
    model = SentencePieceModel.load(path)
    missing = [language_tag(lang) for lang in languages if language_tag(lang) not in model.tags]
    if missing:
        raise ValueError(
            f"--spm-model {path}: has no reserved tag {missing[0]} (train it with nmt-preprocess "
            "--lang-pairs naming that language)"
        )
    return model.proto
