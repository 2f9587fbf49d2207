import gzip
import lzma
import random

import pytest
import zstandard

from nmt.data.text import (
    DataError,
    LineReader,
    decode_lines,
    iter_aligned_chunks,
    read_raw_lines,
    resolve_text_file,
)


def test_split_on_newline_only_keeping_other_breaks_inside_lines(tmp_path):
    content = "a\rb\nc\x0cd\ne\x85f\ng\u2028h\u2029i\nj\x1ck\tl\n".encode("utf-8")
    path = tmp_path / "x.en"
    path.write_bytes(content)
    lines = [line.decode("utf-8") for line in read_raw_lines(str(path))]
    assert lines == ["a\rb", "c\x0cd", "e\x85f", "g\u2028h\u2029i", "j\x1ck\tl"]


def test_windows_endings_and_missing_final_newline(tmp_path):
    path = tmp_path / "x.en"
    path.write_bytes(b"one\r\ntwo\r\n\r\nthree")
    assert read_raw_lines(str(path)) == [b"one", b"two", b"", b"three"]


def reference_lines(data):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def test_block_reader_matches_whole_file_split_at_every_block_size(tmp_path):
    """Blocks as small as one byte cut lines, \\r\\n pairs and skips anywhere: same lines as a whole-file split."""
    rng = random.Random(0)
    path = tmp_path / "x.en"
    for _ in range(300):
        lines = [
            rng.choice([b"", b"a", b"bb\r", b"c\rd", b"\r", b"xyz" * rng.randint(0, 5)])
            for _ in range(rng.randint(0, 30))
        ]
        data = b"\n".join(line + (b"\r" if rng.random() < 0.3 else b"") for line in lines)
        if lines and rng.random() < 0.5:
            data += b"\n"
        path.write_bytes(data)
        expected = reference_lines(data)
        block = rng.randint(1, 9)
        skip = rng.randint(0, len(expected) + 2)
        with LineReader(str(path), block_bytes=block) as reader:
            assert reader.skip(skip) == min(skip, len(expected))
            got = []
            while chunk := reader.read(rng.randint(1, 4)):
                got += chunk
            assert got == expected[skip:]
        with LineReader(str(path), block_bytes=block) as reader:
            head = reader.read(skip)
            assert head == expected[:skip] and reader.count_rest() == len(expected) - len(head)


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst"])
def test_compressed_input(tmp_path, suffix):
    data = b"hello\r\nworld\n" * 1000
    path = tmp_path / f"x.en{suffix}"
    if suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif suffix == ".xz":
        path.write_bytes(lzma.compress(data))
    else:  # two frames, as zstd --rsyncable or concatenated files give
        half = len(data) // 2
        compressor = zstandard.ZstdCompressor()
        path.write_bytes(compressor.compress(data[:half]) + compressor.compress(data[half:]))
    assert resolve_text_file(str(tmp_path / "x"), "en") == str(path)
    assert read_raw_lines(str(path)) == [b"hello", b"world"] * 1000


def test_corrupt_compressed_input_names_the_file(tmp_path):
    path = tmp_path / "x.en.gz"
    path.write_bytes(gzip.compress(b"hello\n" * 100)[:-20])
    with pytest.raises(DataError, match=r"x\.en\.gz: cannot read"):
        read_raw_lines(str(path))


def test_line_count_mismatch_found_at_the_end_names_both_files_and_counts(tmp_path):
    (tmp_path / "c.en").write_text("a\n" * 50_003)
    (tmp_path / "c.de").write_text("a\n" * 50_000)
    chunks = iter_aligned_chunks(
        {"en": str(tmp_path / "c.en"), "de": str(tmp_path / "c.de")}, chunk_lines=20_000
    )
    assert [first for first, _ in (next(chunks), next(chunks))] == [
        0,
        20_000,
    ]  # streamed before the end is seen
    with pytest.raises(DataError) as error:
        list(chunks)
    message = str(error.value)
    assert "c.en has 50003 lines" in message and "c.de has 50000" in message


def test_chunks_of_a_line_range(tmp_path):
    (tmp_path / "c.en").write_text("".join(f"e{i}\n" for i in range(100)))
    (tmp_path / "c.de").write_text("".join(f"d{i}\n" for i in range(100)))
    chunks = list(
        iter_aligned_chunks(
            {"en": str(tmp_path / "c.en"), "de": str(tmp_path / "c.de")},
            chunk_lines=7,
            start=30,
            stop=61,
        )
    )
    assert [first for first, _ in chunks] == [30, 37, 44, 51, 58]
    assert [line for _, lines in chunks for line in lines["en"]] == [
        f"e{i}".encode() for i in range(30, 61)
    ]


def test_invalid_utf8_names_file_and_line():
    raw = [b"fine", b"bad \xff byte"]
    with pytest.raises(DataError, match=r"c\.en:12: invalid UTF-8"):
        decode_lines(raw, path="c.en", replace_invalid=False, first_line=10)
    decoded = decode_lines(raw, path="c.en", replace_invalid=True, first_line=10)
    assert decoded.invalid == [1] and decoded.lines == ["fine", "bad \ufffd byte"]
    assert decode_lines([], path="c.en", replace_invalid=False).lines == []


def test_a_text_file_in_two_forms_is_refused_naming_both(tmp_path):
    (tmp_path / "train.en").write_text("a\n", encoding="utf-8")
    assert resolve_text_file(str(tmp_path / "train"), "en") == str(tmp_path / "train.en")
    with gzip.open(tmp_path / "train.en.gz", "wt", encoding="utf-8") as handle:
        handle.write("b\n")
    with pytest.raises(
        DataError, match=r"train\.en: found as .*train\.en and .*train\.en\.gz; keep one"
    ):
        resolve_text_file(str(tmp_path / "train"), "en")
    (tmp_path / "train.en").unlink()
    assert resolve_text_file(str(tmp_path / "train"), "en") == str(tmp_path / "train.en.gz")
