"""A multilingual model's directions and tag placement, read from what the model carries.

A checkpoint's ``vocab`` (and an export's manifest) records ``lang_pairs``, ``tags`` and ``lang_tok``
(where the target tag goes), so inference never re-specifies a training flag: ``-s/-t`` pick the
direction and this module turns it into the tag, on the source or as the forced first target token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt.data.spm import language_tag


@dataclass(frozen=True)
class Direction:
    """How one direction is asked of the model: tag ids before the source, and the forced first
    target token (None: none)."""

    source_prefix: tuple[int, ...] = ()
    first_token: int | None = None


BILINGUAL = Direction()


@dataclass(frozen=True)
class Languages:
    pairs: tuple[str, ...]  # "en-de", in training order
    tags: dict[str, int]  # "<2de>" -> id
    placement: str  # encoder | decoder

    @classmethod
    def from_vocab(cls, vocab: dict[str, Any]) -> Languages | None:
        """From a checkpoint's ``vocab`` (or an export manifest's ``languages``); None: bilingual."""
        if not vocab.get("lang_pairs"):
            return None
        return cls(
            pairs=tuple(vocab["lang_pairs"]),
            tags={str(tag): int(index) for tag, index in vocab["tags"].items()},
            placement=str(vocab.get("lang_tok", "encoder")),
        )

    def to_vocab(self) -> dict[str, Any]:
        return {"lang_pairs": list(self.pairs), "tags": dict(self.tags), "lang_tok": self.placement}

    @property
    def sources(self) -> list[str]:
        return sorted({pair.split("-")[0] for pair in self.pairs})

    @property
    def targets(self) -> list[str]:
        return sorted({pair.split("-")[1] for pair in self.pairs})

    def direction(
        self, source_lang: str | None, target_lang: str | None, *, zero_shot: bool = False
    ) -> Direction:
        """The direction ``source_lang``-``target_lang`` (ValueError naming the directions the
        model has, when it was not trained; ``zero_shot`` allows any pair of its languages)."""
        if not source_lang or not target_lang:
            raise ValueError(
                f"a multilingual model: give the direction with -s/--source-lang and "
                f"-t/--target-lang (it has {', '.join(self.pairs)})"
            )
        pair = f"{source_lang}-{target_lang}"
        known = set(self.sources) | set(self.targets)
        trained = pair in self.pairs
        if not trained and not (
            zero_shot
            and source_lang in known
            and target_lang in self.targets
            and source_lang != target_lang
        ):
            hint = "" if zero_shot else "; untrained pairs of its languages need --zero-shot"
            raise ValueError(
                f"direction {pair}: not in the model (it has {', '.join(self.pairs)}{hint})"
            )
        tag = self.tags[language_tag(target_lang)]
        if self.placement == "decoder":
            return Direction(first_token=tag)
        return Direction(source_prefix=(tag,))
