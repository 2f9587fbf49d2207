"""Reading raw parallel text: one sentence per line, split on ``\\n`` only.

Text in the wild carries ``\\r``, form feeds, ``\\x85``, U+2028 and friends *inside* sentences;
``str.splitlines`` would break on those and silently misalign source and target. Here a line ends
at ``\\n`` and nowhere else; a trailing ``\\r`` (Windows line ending) is removed.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass


class DataError(ValueError):
    """Bad input data: the message names the file (and line where there is one)."""


def resolve_text_file(prefix: str, lang: str) -> str:
    """``PREFIX.LANG`` or ``PREFIX.LANG.gz``; a clear error when neither exists."""
    plain = f"{prefix}.{lang}"
    for candidate in (plain, plain + ".gz"):
        if os.path.isfile(candidate):
            return candidate
    raise DataError(f"{plain}: no such file (also tried {plain}.gz)")


def read_raw_lines(path: str) -> list[bytes]:
    """Lines as bytes, split on b"\\n" only, without the line ending (``\\n`` or ``\\r\\n``)."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                data = handle.read()
        else:
            with open(path, "rb") as handle:
                data = handle.read()
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: cannot read: {error}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start an empty one
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


@dataclass
class DecodedLines:
    lines: list[str]
    invalid: list[int]  # 0-based indices of lines that were not valid UTF-8


def decode_lines(raw: list[bytes], *, path: str, replace_invalid: bool) -> DecodedLines:
    """UTF-8 decode; invalid lines raise (naming file:line) unless ``replace_invalid``.

    Replaced lines keep their place (U+FFFD for the bad bytes) so alignment never shifts; the
    caller decides whether to drop them (training) or keep them (valid/test must keep line counts).
    """
    lines: list[str] = []
    invalid: list[int] = []
    for index, line in enumerate(raw):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            if not replace_invalid:
                raise DataError(
                    f"{path}:{index + 1}: invalid UTF-8 ({error.reason} at byte {error.start}); "
                    "fix the file or pass --skip-invalid"
                ) from None
            invalid.append(index)
            lines.append(line.decode("utf-8", errors="replace"))
    return DecodedLines(lines=lines, invalid=invalid)


@dataclass
class ParallelText:
    src_path: str
    tgt_path: str
    src: list[str]
    tgt: list[str]
    invalid: list[int]  # indices of pairs where either side was not valid UTF-8


def read_parallel_text(prefix: str, src_lang: str, tgt_lang: str, *, replace_invalid: bool) -> ParallelText:
    """Both sides of a corpus, checked to have the same number of lines."""
    src_path = resolve_text_file(prefix, src_lang)
    tgt_path = resolve_text_file(prefix, tgt_lang)
    src_raw = read_raw_lines(src_path)
    tgt_raw = read_raw_lines(tgt_path)
    if len(src_raw) != len(tgt_raw):
        raise DataError(
            f"{src_path} has {len(src_raw)} lines but {tgt_path} has {len(tgt_raw)}: "
            "source and target must be aligned line for line"
        )
    src = decode_lines(src_raw, path=src_path, replace_invalid=replace_invalid)
    tgt = decode_lines(tgt_raw, path=tgt_path, replace_invalid=replace_invalid)
    invalid = sorted(set(src.invalid) | set(tgt.invalid))
    return ParallelText(src_path=src_path, tgt_path=tgt_path, src=src.lines, tgt=tgt.lines, invalid=invalid)
