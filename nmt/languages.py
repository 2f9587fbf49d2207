"""Languages, directions and tags: the one place that knows them, for data, training, evaluation,
export and serving.

A direction is a ``Pair`` of languages, named ``en-de``. A model (or a dataset) translates the
directions of its ``Languages``. With several directions, the model is told which one by the target
language's tag ``<2xx>`` ("into xx"), a SentencePiece control symbol that enters a sequence by id
only; where it goes is the run's ``--lang-tok`` (its placement):

- ``encoder`` (the default; Marian/Sockeye/fairseq ``--encoder-langtok tgt``): the source is
  ``<2xx> pieces EOS``;
- ``decoder`` (fairseq ``--decoder-langtok``): the target is ``<2xx> pieces EOS`` and the decoder
  reads ``BOS <2xx> ...``; at inference the tag is forced as the first output token.

A bilingual model is the one-direction case without a tag (nothing to choose, so nothing is asked:
its sequences and checkpoints are those of a model that never heard of languages). A checkpoint's
``vocab`` (and an export's manifest) records the directions of a tagged model as ``lang_pairs``,
``tags`` and ``lang_tok``, so inference never re-specifies a training flag.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PLACEMENTS = ("encoder", "decoder")  # where a tagged model reads its target tag (--lang-tok)

# A language code: ISO 639-1/639-3 letters, optionally a script or region (zh_Hant, pt_BR). No "-":
# it separates the two languages of a direction.
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(_[A-Za-z0-9]{2,8})?")


def language_tag(lang: str) -> str:
    """The token that asks for a translation into ``lang``."""
    return f"<2{lang}>"


@dataclass(frozen=True)
class Pair:
    """One direction: ``source`` into ``target``."""

    source: str
    target: str

    @property
    def name(self) -> str:
        return f"{self.source}-{self.target}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str, *, option: str = "--lang-pairs", codes: bool = True) -> Pair:
        """``en-de`` -> Pair("en", "de"); ValueError (one line naming ``option`` and the pair) for
        a malformed pair, a malformed language code (``codes``: checked) or a language into itself."""
        pair = text.strip()
        langs = pair.split("-")
        if len(langs) != 2 or not all(langs):
            raise ValueError(f"{option}: {pair!r} is not a pair SRC-TGT (e.g. en-de)")
        for lang in langs if codes else ():
            if not LANGUAGE_CODE.fullmatch(lang):
                raise ValueError(
                    f"{option}: {pair!r}: {lang!r} is not a language code (2-3 lowercase letters, "
                    "e.g. en, de, fra; optionally _Script or _REGION)"
                )
        if langs[0] == langs[1]:
            raise ValueError(f"{option}: {pair!r} translates a language into itself")
        return cls(langs[0], langs[1])


def parse_pairs(text: str, *, option: str = "--lang-pairs") -> list[Pair]:
    """``en-de,de-en`` -> [Pair("en", "de"), Pair("de", "en")], each checked by ``Pair.parse``, and
    none listed twice."""
    pairs: list[Pair] = []
    for item in text.split(","):
        pair = Pair.parse(item, option=option)
        if pair in pairs:
            raise ValueError(f"{option}: {pair.name!r} is listed twice")
        pairs.append(pair)
    return pairs


@dataclass(frozen=True)
class Direction:
    """How one direction is asked of a model: tag ids before the source, and the forced first
    target token (None: none). Training data carry the same tokens: the source prefix on the
    source, the first token at the start of the target."""

    source_prefix: tuple[int, ...] = ()
    first_token: int | None = None

    @property
    def target_prefix(self) -> tuple[int, ...]:
        return () if self.first_token is None else (self.first_token,)

    def prefixed(self, sources: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        """Binarized sources (EOS included) with this direction's source tag in front (``sources``
        itself when there is none: a dataset's lazy view stays lazy)."""
        if not self.source_prefix:
            return sources
        prefix = np.asarray(self.source_prefix, dtype=np.int64)
        return [np.concatenate([prefix, source]) for source in sources]


BILINGUAL = Direction()  # the one direction of an untagged model: nothing asked


@dataclass(frozen=True)
class Languages:
    """A model's (or dataset's) directions, and how each is asked for: ``tags`` "<2de>" -> id and
    their ``placement``; no tags: one direction, asked for by nothing (a bilingual model)."""

    pairs: tuple[str, ...]  # "en-de", in training order
    tags: dict[str, int] = field(default_factory=dict)
    placement: str = "encoder"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"--lang-tok: must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        assert self.tags or len(self.pairs) == 1, "several directions need their tags"

    @classmethod
    def one_direction(cls, source: str, target: str) -> Languages:
        """A bilingual model or dataset: ``source`` into ``target``, no tag."""
        return cls(pairs=(Pair(source, target).name,))

    @classmethod
    def from_vocab(cls, vocab: dict[str, Any]) -> Languages:
        """From a checkpoint's ``vocab`` (or an export manifest's): its ``lang_pairs`` and tags, or
        the one direction ``source_lang``-``target_lang``."""
        if vocab.get("lang_pairs"):
            return cls(
                pairs=tuple(vocab["lang_pairs"]),
                tags={str(tag): int(index) for tag, index in vocab["tags"].items()},
                placement=str(vocab.get("lang_tok", "encoder")),
            )
        return cls.one_direction(vocab.get("source_lang", "src"), vocab.get("target_lang", "tgt"))

    def to_vocab(self) -> dict[str, Any]:
        """What a checkpoint records beside its ``source_lang``/``target_lang`` (nothing for an
        untagged model: its checkpoint is a bilingual one)."""
        if not self.tagged:
            return {}
        return {"lang_pairs": list(self.pairs), "tags": dict(self.tags), "lang_tok": self.placement}

    @property
    def tagged(self) -> bool:
        """Whether a direction is asked for by a tag (else there is one, asked for by nothing)."""
        return bool(self.tags)

    @property
    def directions(self) -> list[Pair]:
        return [Pair.parse(name, codes=False) for name in self.pairs]

    @property
    def first(self) -> Pair:
        """The default direction: the only one, or the first trained."""
        return self.directions[0]

    @property
    def sources(self) -> list[str]:
        return sorted({pair.source for pair in self.directions})

    @property
    def targets(self) -> list[str]:
        return sorted({pair.target for pair in self.directions})

    @property
    def codes(self) -> list[str]:
        """Every language the model reads or writes."""
        return sorted({*self.sources, *self.targets})

    def target_tags(self) -> dict[str, str]:
        """Target language -> its tag, for the languages a tagged model translates into."""
        return {lang: language_tag(lang) for lang in self.targets} if self.tagged else {}

    def direction(
        self,
        source_lang: str | None = None,
        target_lang: str | None = None,
        *,
        zero_shot: bool = False,
    ) -> Direction:
        """How to ask for ``source_lang``-``target_lang``: a side left out is the only direction's
        (with several, both are needed); ValueError naming the directions the model has when the
        pair was not trained (``zero_shot`` allows any pair of a tagged model's languages)."""
        if not source_lang or not target_lang:
            if len(self.pairs) > 1:
                raise ValueError(
                    f"a multilingual model: give the direction with -s/--source-lang and "
                    f"-t/--target-lang (it has {', '.join(self.pairs)})"
                )
            source_lang = source_lang or self.first.source
            target_lang = target_lang or self.first.target
        pair = Pair(source_lang, target_lang).name
        trained = pair in self.pairs
        if not trained and not (
            zero_shot
            and self.tagged
            and source_lang in self.codes
            and target_lang in self.targets
            and source_lang != target_lang
        ):
            hint = (
                ""
                if zero_shot or not self.tagged
                else "; untrained pairs of its languages need --zero-shot"
            )
            raise ValueError(
                f"direction {pair}: not in the model (it has {', '.join(self.pairs)}{hint})"
            )
        if not self.tagged:
            return BILINGUAL
        tag = self.tags[language_tag(target_lang)]
        if self.placement == "decoder":
            return Direction(first_token=tag)
        return Direction(source_prefix=(tag,))
