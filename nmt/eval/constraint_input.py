"""Lexical constraints as the user gives them: fairseq's input lines (the source, then its phrases,
tab-separated) and the check that every phrase has pieces. Apart from ``constraints``, the search's
half, because these run on the path that decodes an export without importing torch."""

from __future__ import annotations

from collections.abc import Sequence


def check_phrases(phrases: Sequence[Sequence[int]], *, where: str) -> None:
    """ValueError (one line, ``where`` names the line) for a constraint with no pieces."""
    for index, phrase in enumerate(phrases):
        if not phrase:
            raise ValueError(
                f"{where}: constraint {index + 1} is empty (no pieces: a tab at the end, two tabs "
                "in a row, or only spaces)"
            )


def split_line(line: str) -> tuple[str, list[str]]:
    """fairseq's input format: the source, then its constraints, tab-separated."""
    source, *constraints = line.split("\t")
    return source, constraints
