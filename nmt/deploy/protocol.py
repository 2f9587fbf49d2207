"""LibreTranslate's API as nmt-serve speaks it: request bodies in, response bodies out, pure functions.

    POST /translate  {"q": "text" | ["text", ...], "source": "en", "target": "de", "alternatives": 2}
                     -> {"translatedText": "..." | ["...", ...], "alternatives": [...]}
                     (JSON, or a form: application/x-www-form-urlencoded, as LibreTranslate's clients post)
    POST /detect     {"q": "text"} -> [{"confidence": 98.5, "language": "en"}]
    GET  /languages  -> [{"code": "en", "name": "English", "targets": ["de"]}, ...]

A text is split into sentences on "\\n" only and joined back with "\\n" (one sentence per line, as
everywhere in nmt). A client's mistake is a ``RequestError``: an HTTP status and a one-line message,
answered as ``{"error": message}``. Nothing here touches a socket or a model, so every shape and
every error is a plain call away from a test (the app, ``nmt.deploy.app``, wires these to routes).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nmt.config import GLOSSARY_MODES
from nmt.data.terminology import Glossary, term_problem
from nmt.eval.hypothesis import LengthLimitError
from nmt.eval.languages import language_name
from nmt.languages import Direction, Languages

MAX_ALTERNATIVES = 8
# A request's own glossary: bounded, since each of its terms is matched in every sentence.
MAX_GLOSSARY_ENTRIES = 256
MAX_TERM_CHARS = 200
FORM = "application/x-www-form-urlencoded"


class RequestError(Exception):
    """A client's mistake: answered with ``status`` and ``{"error": message}``; ``close``: the
    request was not read to its end, so the connection cannot carry another one."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


@dataclass
class TranslateRequest:
    """A parsed POST /translate (or /detect: ``q`` only). A new request option is a new field with
    a default, so that every request without it means what it meant before."""

    lines: list[list[str]]  # per text of q, its lines (sentences)
    is_list: bool  # q was a list
    source: str | None = None  # "auto": detect it
    target: str | None = None
    alternatives: int = 0  # further translations besides the best
    glossary: Glossary | None = None  # the request's own, or a named one of the server
    glossary_mode: str = "annotate"  # how its terms are applied (``Translator.apply_terms``)

    @property
    def sentences(self) -> list[str]:
        """Every line of every text, in order: what is translated."""
        return [line for text_lines in self.lines for line in text_lines]


def _payload(body: bytes, content_type: str) -> dict[str, Any]:
    """A JSON object, or a form (``application/x-www-form-urlencoded``, as LibreTranslate's own
    clients post it): a key given several times is a list."""
    if content_type.split(";")[0].strip().lower() == FORM:
        try:
            fields = urllib.parse.parse_qs(
                body.decode("utf-8"), keep_blank_values=True, strict_parsing=False
            )
        except UnicodeDecodeError as error:
            raise RequestError(400, f"invalid form: not UTF-8 ({error.reason})") from None
        return {key: values[0] if len(values) == 1 else values for key, values in fields.items()}
    try:
        payload = json.loads(body)
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    except ValueError as error:  # not JSON, not UTF-8, an integer of over 4,300 digits...
        raise RequestError(400, f"invalid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise RequestError(
            400, 'the body must be a JSON object like {"q": "text", "source": "en", "target": "de"}'
        )
    return payload


def _texts(payload: dict[str, Any]) -> tuple[list[str], bool]:
    """``q``'s texts, and whether it was a list."""
    if "q" not in payload:
        raise RequestError(400, "missing q: the text to translate (a string or a list of strings)")
    q = payload["q"]
    is_list = isinstance(q, list)
    texts = q if is_list else [q]
    if not all(isinstance(text, str) for text in texts):
        raise RequestError(400, "q: must be a string or a list of strings")
    for number, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON's "\\ud800" escape: a lone surrogate
            raise RequestError(
                400,
                f"{_where(number, None, is_list)}: character {error.start + 1} is a lone surrogate "
                f"(U+{ord(text[error.start]):04X}), which is not text",
            ) from None
    return texts, is_list


def _alternatives(payload: dict[str, Any]) -> int:
    alternatives = payload.get("alternatives", 0)
    if isinstance(alternatives, str) and alternatives.isdigit():  # a form's values are strings
        alternatives = int(alternatives)
    if (
        not isinstance(alternatives, int)
        or isinstance(alternatives, bool)
        or not 0 <= alternatives <= MAX_ALTERNATIVES
    ):
        raise RequestError(
            400,
            f"alternatives: must be an integer from 0 to {MAX_ALTERNATIVES}, got {alternatives!r}",
        )
    return alternatives


def _check_options(payload: dict[str, Any]) -> None:
    """``source``, ``target`` and ``format`` as this service can honour them."""
    for key in ("source", "target"):
        if not isinstance(payload.get(key, ""), str):
            raise RequestError(400, f"{key}: must be a string")
    text_format = payload.get("format", "text")
    if text_format != "text":
        raise RequestError(
            400,
            f"format: only 'text' is served (got {text_format!r}); send the text between the "
            "tags of an HTML document as text",
        )


def parse_request(
    body: bytes,
    *,
    max_sentences: int,
    content_type: str = "application/json",
    glossaries: Mapping[str, Glossary] | None = None,
) -> TranslateRequest:
    """A LibreTranslate body (JSON or form) -> a ``TranslateRequest``; RequestError otherwise.
    Which directions exist is the service's to check (``Service.direction``)."""
    payload = _payload(body, content_type)
    texts, is_list = _texts(payload)
    _check_options(payload)
    alternatives = _alternatives(payload)
    glossary = _glossary(payload.get("glossary"), glossaries or {})
    glossary_mode = payload.get("glossary_mode", "annotate")
    if glossary_mode not in GLOSSARY_MODES:
        raise RequestError(
            400, f"glossary_mode: must be one of {', '.join(GLOSSARY_MODES)}, got {glossary_mode!r}"
        )
    lines = [text.split("\n") for text in texts]  # one sentence per line: "\n" only
    num_sentences = sum(len(text_lines) for text_lines in lines)
    if num_sentences > max_sentences:
        raise RequestError(
            400,
            f"too many sentences: {num_sentences} in one request, at most {max_sentences} (--max-request-sentences)",
        )
    return TranslateRequest(
        lines,
        is_list,
        source=payload.get("source") or None,
        target=payload.get("target") or None,
        alternatives=alternatives,
        glossary=glossary,
        glossary_mode=glossary_mode,
    )


def _glossary(value: Any, named: Mapping[str, Glossary]) -> Glossary | None:
    """``glossary``: a JSON object of source term -> target term (at most
    ``MAX_GLOSSARY_ENTRIES``, terms of at most ``MAX_TERM_CHARS`` characters), or the name of one
    the server loaded (nmt-serve --glossary NAME=FILE); a bad entry is a 400 naming it."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in named:
            loaded = ", ".join(sorted(named)) or "none: nmt-serve --glossary NAME=FILE loads one"
            raise RequestError(400, f"glossary: no glossary named {value!r} (loaded: {loaded})")
        return named[value]
    if not isinstance(value, dict):
        raise RequestError(
            400, "glossary: must be an object of source term -> target term, or a glossary's name"
        )
    if len(value) > MAX_GLOSSARY_ENTRIES:
        raise RequestError(
            400, f"glossary: {len(value)} entries, at most {MAX_GLOSSARY_ENTRIES} per request"
        )
    for source, target in value.items():
        if not isinstance(target, str):
            raise RequestError(400, f"glossary entry {source!r}: the target term must be a string")
        problem = term_problem(source, target)
        longest = max(len(source), len(target))
        if problem is None and longest > MAX_TERM_CHARS:
            problem = f"a term of {longest} characters, over the limit of {MAX_TERM_CHARS}"
        if problem is not None:
            raise RequestError(400, f"glossary entry {source!r}: {problem}")
    return Glossary(value, name="the request's glossary")


@dataclass(frozen=True)
class Service:
    """What the service translates: the model's directions (untrained ones of a tagged model only
    with ``zero_shot``)."""

    languages: Languages
    zero_shot: bool = False

    @property
    def source_lang(self) -> str:
        return ",".join(self.languages.sources)

    @property
    def target_lang(self) -> str:
        return ",".join(self.languages.targets)

    @property
    def first_pair(self) -> tuple[str, str]:
        """The direction the web page offers first: the model's first."""
        return self.languages.first.source, self.languages.first.target

    def detects(self, asked: TranslateRequest) -> bool:
        """Whether ``asked``'s source language is to be detected first (a model that reads one
        language reads ``source: auto`` as that one)."""
        return asked.source == "auto" and len(self.languages.sources) > 1

    def direction(self, source: str | None, target: str | None) -> Direction:
        """The direction of a request (``source`` already detected when it was "auto")."""
        if len(self.languages.pairs) > 1 and (not source or not target):
            raise RequestError(
                400,
                f"{'source' if not source else 'target'}: required by this multilingual service "
                f"(directions: {', '.join(self.languages.pairs)})",
            )
        try:
            return self.languages.direction(source, target, zero_shot=self.zero_shot)
        except ValueError as error:
            raise RequestError(
                400, str(error).replace("--zero-shot", "nmt-serve --zero-shot")
            ) from None

    def listing(self) -> list[dict[str, Any]]:
        """LibreTranslate's /languages: each language and the targets it translates into."""
        pairs = self.languages.pairs
        return [
            {
                "code": code,
                "name": language_name(code),
                "targets": sorted(
                    target
                    for target in self.languages.targets
                    if target != code
                    and (
                        self.zero_shot
                        and self.languages.tagged
                        and code in self.languages.sources
                        or f"{code}-{target}" in pairs
                    )
                ),
            }
            for code in self.languages.codes
        ]

    def detect(self, texts: list[str]) -> list[tuple[str, float]]:
        """(language, confidence 0-100) of each text, among the languages the model reads."""
        from nmt.eval.language_id import detect

        return [
            (lang, round(100.0 * confidence, 2))
            for lang, confidence in detect(texts, languages=self.languages.sources)
        ]


def _where(text: int, line: int | None, is_list: bool) -> str:
    """A place in ``q`` as a client can find it: "q", "q[2]", "q line 3", "q[2] line 3" (1-based lines)."""
    place = f"q[{text}]" if is_list else "q"
    return place if line is None else f"{place} line {line + 1}"


def locate(lines: list[list[str]], index: int, *, is_list: bool) -> str:
    """Where sentence ``index`` of the flattened ``lines`` is in the request (``_where``)."""
    for text, text_lines in enumerate(lines):
        if index < len(text_lines):
            return _where(text, index if len(text_lines) > 1 else None, is_list)
        index -= len(text_lines)
    raise IndexError(index)


def untranslatable(asked: TranslateRequest, error: LengthLimitError) -> RequestError:
    """The 400 of a sentence that cannot be translated as asked, naming where it is in ``q``."""
    return RequestError(
        400, f"{locate(asked.lines, error.index, is_list=asked.is_list)}: {error.reason}"
    )


def detection(language: str, confidence: float) -> dict[str, Any]:
    return {"confidence": confidence, "language": language}


def translation_response(
    asked: TranslateRequest,
    translations: list[list[str]],
    *,
    detected: tuple[str, float] | None = None,
    terms: list[list[tuple[str, str]]] | None = None,
) -> dict[str, Any]:
    """The body answering ``asked``, from the n-best translations of each of its sentences (in
    ``asked.sentences``' order, best first) and the detected source language (``source: auto``);
    ``terms``: the glossary terms applied to each sentence, answered per text as
    ``appliedTerms`` (``[{"source": ..., "target": ...}]``)."""
    ranked: list[list[str]] = []  # per text: its best, then its alternatives
    offset = 0
    for text_lines in asked.lines:
        found = translations[offset : offset + len(text_lines)]
        ranked.append(
            [
                "\n".join(nbest[min(rank, len(nbest) - 1)] for nbest in found)
                for rank in range(asked.alternatives + 1)
            ]
        )
        offset += len(text_lines)
    response: dict[str, Any] = {
        "translatedText": [r[0] for r in ranked] if asked.is_list else ranked[0][0]
    }
    if asked.alternatives:
        response["alternatives"] = [r[1:] for r in ranked] if asked.is_list else ranked[0][1:]
    if terms is not None:
        applied = [
            [{"source": source, "target": target} for source, target in dict(found).items()]
            for found in _per_text(asked, terms)
        ]
        response["appliedTerms"] = applied if asked.is_list else applied[0]
    if detected is not None:
        found_language = detection(*detected)
        response["detectedLanguage"] = (
            [found_language] * len(asked.lines) if asked.is_list else found_language
        )
    return response


def _per_text(
    asked: TranslateRequest, terms: list[list[tuple[str, str]]]
) -> list[list[tuple[str, str]]]:
    """The terms of each text: its sentences' terms, in order."""
    found, offset = [], 0
    for text_lines in asked.lines:
        found.append([term for line in terms[offset : offset + len(text_lines)] for term in line])
        offset += len(text_lines)
    return found


def detection_response(asked: TranslateRequest, found: list[tuple[str, float]]) -> Any:
    """POST /detect's body: [{"confidence": 0-100, "language": code}] (q a string), one such list
    per text (q a list); ``found``: (language, confidence) of each text."""
    results = [[detection(lang, confidence)] for lang, confidence in found]
    return results if asked.is_list else results[0]


def detection_texts(asked: TranslateRequest) -> list[str]:
    """The texts of a POST /detect, each whole."""
    return ["\n".join(text_lines) for text_lines in asked.lines]
