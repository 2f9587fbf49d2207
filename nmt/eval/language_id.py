"""Language identification of outputs: off-target rate (``nmt-eval``) and ``POST /detect`` (``nmt-serve``).

``langid`` (PyPI, the ``langid`` extra) ships its model inside the package: nothing is downloaded at
run time. Restricted to the model's languages, it tells apart the languages a multilingual model
can produce (on Multi30k val, en/de/fr/cs: see ``benchmarks/language_id.py``), which is what an
off-target rate asks: did the model write the language it was asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


@functools.cache
def _identifier(languages: tuple[str, ...]) -> Any:
    try:
        from langid.langid import LanguageIdentifier, model
    except ImportError:
        raise ValueError(
            "language identification needs langid: pip install 'nmt[langid]'"
        ) from None
    identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
    if languages:
        known = set(identifier.nb_classes)
        unknown = [lang for lang in languages if lang.split("_")[0] not in known]
        if unknown:
            raise ValueError(f"language identification: langid does not know {unknown[0]!r}")
        identifier.set_languages(sorted({lang.split("_")[0] for lang in languages}))
    return identifier


def detect(texts: Sequence[str], *, languages: Sequence[str] = ()) -> list[tuple[str, float]]:
    """(language, confidence in [0, 1]) of each text, among ``languages`` (all of langid's 97 if
    empty); an empty text is ("", 0.0)."""
    identifier = _identifier(tuple(sorted(languages)))
    results = []
    for text in texts:
        if not text.strip():
            results.append(("", 0.0))
            continue
        lang, confidence = identifier.classify(text)
        results.append((str(lang), float(confidence)))
    return results


def off_target_rate(
    hypotheses: Sequence[str], target_lang: str, *, languages: Sequence[str]
) -> float:
    """Percentage of non-empty hypotheses whose detected language (among ``languages``) is not
    ``target_lang``."""
    found = [lang for lang, _ in detect(hypotheses, languages=languages) if lang]
    if not found:
        return 0.0
    return 100.0 * sum(lang != target_lang.split("_")[0] for lang in found) / len(found)
