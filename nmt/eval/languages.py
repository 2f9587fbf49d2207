"""A multilingual model's directions and tag placement, read from what the model carries.

A checkpoint's ``vocab`` (and an export's manifest) records ``lang_pairs``, ``tags`` and ``lang_tok``
(where the target tag goes), so inference never re-specifies a training flag: ``-s/-t`` pick the
direction and this module turns it into the tag, on the source or as the forced first target token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.data.spm import language_tag

# English names of ISO 639-1 codes (LibreTranslate's /languages "name", the web page's selectors):
# the 97 languages langid identifies; a model's other codes are named by themselves.
LANGUAGE_NAMES: dict[str, str] = {
    "af": "Afrikaans",
    "am": "Amharic",
    "an": "Aragonese",
    "ar": "Arabic",
    "as": "Assamese",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "br": "Breton",
    "bs": "Bosnian",
    "ca": "Catalan",
    "cs": "Czech",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "dz": "Dzongkha",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fo": "Faroese",
    "fr": "French",
    "ga": "Irish",
    "gl": "Galician",
    "gu": "Gujarati",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "ht": "Haitian Creole",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "jv": "Javanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "kn": "Kannada",
    "ko": "Korean",
    "ku": "Kurdish",
    "ky": "Kyrgyz",
    "la": "Latin",
    "lb": "Luxembourgish",
    "lo": "Lao",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mg": "Malagasy",
    "mk": "Macedonian",
    "ml": "Malayalam",
    "mn": "Mongolian",
    "mr": "Marathi",
    "ms": "Malay",
    "mt": "Maltese",
    "nb": "Norwegian Bokmål",
    "ne": "Nepali",
    "nl": "Dutch",
    "nn": "Norwegian Nynorsk",
    "no": "Norwegian",
    "oc": "Occitan",
    "or": "Odia",
    "pa": "Punjabi",
    "pl": "Polish",
    "ps": "Pashto",
    "pt": "Portuguese",
    "qu": "Quechua",
    "ro": "Romanian",
    "ru": "Russian",
    "rw": "Kinyarwanda",
    "se": "Northern Sami",
    "si": "Sinhala",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sq": "Albanian",
    "sr": "Serbian",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "te": "Telugu",
    "th": "Thai",
    "tl": "Tagalog",
    "tr": "Turkish",
    "ug": "Uyghur",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "vi": "Vietnamese",
    "vo": "Volapük",
    "wa": "Walloon",
    "xh": "Xhosa",
    "zh": "Chinese",
    "zu": "Zulu",
}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


@dataclass(frozen=True)
class Direction:
    """How one direction is asked of the model: tag ids before the source, and the forced first
    target token (None: none)."""

    source_prefix: tuple[int, ...] = ()
    first_token: int | None = None

    def prefixed(self, sources: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        """Binarized sources (EOS included) with this direction's source tag in front (``sources``
        itself when there is none: a dataset's lazy view stays lazy)."""
        if not self.source_prefix:
            return sources
        prefix = np.asarray(self.source_prefix, dtype=np.int64)
        return [np.concatenate([prefix, source]) for source in sources]


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
