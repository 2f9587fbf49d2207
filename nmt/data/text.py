"""Reading raw parallel text: one sentence per line, split on ``\\n`` only, streamed in blocks.

Text in the wild carries ``\\r``, form feeds, ``\\x85``, U+2028 and friends *inside* sentences;
``str.splitlines`` would break on those and silently misalign source and target. Here a line ends
at ``\\n`` and nowhere else; a trailing ``\\r`` (Windows line ending) is removed. Files may be plain
or compressed (``.gz``, ``.xz``, ``.zst``); they are read a block at a time, so memory does not
grow with the file.
"""

from __future__ import annotations

import contextlib
import gzip
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

READ_BLOCK_BYTES = 1 << 20
COMPRESSED_SUFFIXES = (".gz", ".xz", ".zst")


class DataError(ValueError):
    """Bad input data: the message names the file (and line where there is one)."""


def resolve_text_file(prefix: str, lang: str) -> str:
    """``PREFIX.LANG`` or its compressed form (``.gz``, ``.xz``, ``.zst``); a clear error when none exists."""
    plain = f"{prefix}.{lang}"
    found = [
        candidate
        for candidate in (plain, *(plain + suffix for suffix in COMPRESSED_SUFFIXES))
        if os.path.isfile(candidate)
    ]
    if len(found) > 1:  # which one is meant? They may hold different text.
        raise DataError(
            f"{plain}: found as {' and '.join(found)}; keep one of them (move the others away)"
        )
    if found:
        return found[0]
    raise DataError(
        f"{plain}: no such file (also tried {', '.join(plain + s for s in COMPRESSED_SUFFIXES)})"
    )


def open_binary(path: str) -> BinaryIO:
    """The decompressed bytes of ``path``, by its suffix."""
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if path.endswith(".xz"):
            return lzma.open(path, "rb")  # type: ignore[return-value]
        if path.endswith(".zst"):
            import zstandard

            raw = open(path, "rb")
            return zstandard.ZstdDecompressor().stream_reader(
                raw, read_across_frames=True, closefd=True
            )  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror or error}") from None


class LineReader:
    """The lines of one text file as bytes (line endings removed), a block at a time.

    ``read(n)`` returns up to ``n`` lines (fewer only at the end); ``skip(n)`` passes over lines
    without splitting them; ``count_rest()`` counts what is left. ``line_number`` is the number of
    lines consumed so far. A final newline ends the last line; it does not start an empty one.
    """

    def __init__(self, path: str, *, block_bytes: int = READ_BLOCK_BYTES) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self.line_number = 0
        self._handle = open_binary(path)
        self._lines: list[bytes] = []
        self._next = 0  # first unconsumed entry of _lines
        self._partial = b""  # an unfinished line carried into the next block
        self._eof = False

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> LineReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_block(self) -> bytes:
        try:
            return self._handle.read(self.block_bytes)
        # zstandard.ZstdError and friends too: a truncated or corrupt compressed stream
        except Exception as error:
            decoded = complete_lines_before_error(self.path)
            raise DataError(
                f"{self.path}: cannot read line {decoded + 1} ({decoded} lines decoded before "
                f"it): {error}"
            ) from None

    def _fill(self) -> bool:
        """Split the next block into lines; False at the end of the file."""
        if self._eof:
            return False
        block = self._read_block()
        if not block:
            self._eof = True
            if not self._partial:
                return False
            last = self._partial[:-1] if self._partial.endswith(b"\r") else self._partial
            self._lines, self._next, self._partial = [last], 0, b""
            return True
        # "\r\n" -> "\n" removes exactly the one \r that ends a line, in C; an unfinished line that
        # ends in \r is completed (and its \r removed) with the next block.
        data = (self._partial + block).replace(b"\r\n", b"\n")
        lines = data.split(b"\n")
        self._partial = lines.pop()
        self._lines, self._next = lines, 0
        return True

    def read(self, count: int) -> list[bytes]:
        out: list[bytes] = []
        while len(out) < count:
            if self._next >= len(self._lines) and not self._fill():
                break
            take = self._lines[self._next : self._next + count - len(out)]
            self._next += len(take)
            out.extend(take)
        self.line_number += len(out)
        return out

    def skip(self, count: int) -> int:
        """Pass over up to ``count`` lines; returns how many there were."""
        skipped = min(count, len(self._lines) - self._next)
        self._next += skipped
        while skipped < count and not self._eof:
            block = self._read_block()
            if not block:
                self._eof = True
                if self._partial:
                    self._partial = b""
                    skipped += 1
                break
            data = self._partial + block
            newlines = data.count(b"\n")
            if skipped + newlines <= count:
                skipped += newlines
                self._partial = data[data.rfind(b"\n") + 1 :] if newlines else data
                continue
            # The wanted line starts inside this block: split from there on.
            position = -1
            for _ in range(count - skipped):
                position = data.index(b"\n", position + 1)
            skipped = count
            lines = data[position + 1 :].replace(b"\r\n", b"\n").split(b"\n")
            self._partial = lines.pop()
            self._lines, self._next = lines, 0
        self.line_number += skipped
        return skipped

    def count_rest(self) -> int:
        """Lines not yet consumed (reads to the end of the file)."""
        rest = len(self._lines) - self._next
        self._next = len(self._lines)
        while not self._eof:
            block = self._read_block()
            if not block:
                self._eof = True
                break
            rest += block.count(b"\n")
            self._partial = block[-1:]
        if self._partial and not self._partial.endswith(b"\n"):
            rest += 1
        self._partial = b""
        return rest


def complete_lines_before_error(path: str) -> int:
    """The whole lines of ``path`` that decode before its read error: a block read loses what it
    had decoded when the stream breaks, so the file is read again in the decompressor's own steps
    (``read1``), as far as it goes. Only called once a read has failed."""
    count = 0
    try:
        with open_binary(path) as handle:
            read = getattr(handle, "read1", handle.read)
            while block := read(1 << 16):
                count += block.count(b"\n")
    except Exception:  # the error being reported
        pass
    return count


def count_lines(path: str) -> int:
    with LineReader(path) as reader:
        return reader.count_rest()


def read_raw_lines(path: str) -> list[bytes]:
    """All lines of a (small) file as bytes, split on b"\\n" only, without their line endings."""
    with LineReader(path) as reader:
        lines = []
        while chunk := reader.read(1 << 16):
            lines.extend(chunk)
        return lines


def line_count_mismatch(src_path: str, src_lines: int, tgt_path: str, tgt_lines: int) -> DataError:
    return DataError(
        f"{src_path} has {src_lines} lines but {tgt_path} has {tgt_lines}: source and target must be aligned line for line"
    )


def iter_aligned_chunks(
    paths: dict[str, str], *, chunk_lines: int, start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, dict[str, list[bytes]]]]:
    """``(first line, lines of each file)`` in chunks of ``chunk_lines`` aligned lines of ``paths``
    (a language -> its file), for the lines ``[start, stop)``.

    A line-count mismatch is raised (naming the first file and one whose count differs, with both
    counts) as soon as one file ends before the others; without ``stop`` that is at the end of the
    stream, after every chunk before it was yielded.
    """
    with contextlib.ExitStack() as stack:
        readers = {key: stack.enter_context(LineReader(path)) for key, path in paths.items()}

        def mismatch() -> DataError | None:
            totals = {
                key: reader.line_number + reader.count_rest() for key, reader in readers.items()
            }
            first = next(iter(totals))
            other = next((key for key, total in totals.items() if total != totals[first]), None)
            if other is None:
                return None
            return line_count_mismatch(paths[first], totals[first], paths[other], totals[other])

        if min([reader.skip(start) for reader in readers.values()]) < start:
            error = mismatch()
            if error is not None:
                raise error
            first_path = next(iter(paths.values()))
            total = next(iter(readers.values())).line_number
            raise DataError(
                f"{first_path}: {total} lines, fewer than this shard's first line {start + 1}"
            )
        first_line = start
        while stop is None or first_line < stop:
            want = chunk_lines if stop is None else min(chunk_lines, stop - first_line)
            chunk = {key: reader.read(want) for key, reader in readers.items()}
            sizes = {len(lines) for lines in chunk.values()}
            if len(sizes) > 1:
                error = mismatch()
                assert error is not None
                raise error
            size = sizes.pop()
            if not size:
                if stop is not None:
                    raise DataError(
                        f"{next(iter(paths.values()))}: ends at line {first_line}, before this "
                        f"shard's last line {stop}"
                    )
                return
            yield first_line, chunk
            first_line += size


@dataclass
class DecodedLines:
    lines: list[str]
    invalid: list[int]  # 0-based indices (within the chunk) of lines that were not valid UTF-8


def decode_lines(
    raw: list[bytes], *, path: str, replace_invalid: bool, first_line: int = 0
) -> DecodedLines:
    """UTF-8 decode; invalid lines raise (naming file:line) unless ``replace_invalid``.

    Replaced lines keep their place (U+FFFD for the bad bytes) so alignment never shifts; the
    caller decides whether to drop them (training) or keep them (valid/test must keep line counts).
    ``first_line`` is the 0-based line number of ``raw[0]`` in the file, for messages.
    """
    if not raw:
        return DecodedLines(lines=[], invalid=[])
    try:  # one C call for the whole chunk; per line only when something is wrong
        return DecodedLines(lines=b"\n".join(raw).decode("utf-8").split("\n"), invalid=[])
    except UnicodeDecodeError:
        pass
    lines: list[str] = []
    invalid: list[int] = []
    for index, line in enumerate(raw):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            if not replace_invalid:
                raise DataError(
                    f"{path}:{first_line + index + 1}: invalid UTF-8 ({error.reason} at byte {error.start}); "
                    "fix the file or pass --skip-invalid"
                ) from None
            invalid.append(index)
            lines.append(line.decode("utf-8", errors="replace"))
    return DecodedLines(lines=lines, invalid=invalid)
