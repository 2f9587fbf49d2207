import gzip

import pytest

from nmt.data.text import DataError, read_parallel_text, read_raw_lines


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


def test_gzip_input(tmp_path):
    with gzip.open(tmp_path / "x.en.gz", "wb") as handle:
        handle.write(b"hello\nworld\n")
    assert read_raw_lines(str(tmp_path / "x.en.gz")) == [b"hello", b"world"]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    (tmp_path / "c.en").write_text("a\nb\nc\n")
    (tmp_path / "c.de").write_text("a\nb\n")
    with pytest.raises(DataError) as error:
        read_parallel_text(str(tmp_path / "c"), "en", "de", replace_invalid=False)
    message = str(error.value)
    assert "c.en has 3 lines" in message and "c.de has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "c.en").write_bytes(b"fine\nbad \xff byte\n")
    (tmp_path / "c.de").write_bytes(b"gut\nauch\n")
    with pytest.raises(DataError, match=r"c\.en:2: invalid UTF-8"):
        read_parallel_text(str(tmp_path / "c"), "en", "de", replace_invalid=False)
    text = read_parallel_text(str(tmp_path / "c"), "en", "de", replace_invalid=True)
    assert text.invalid == [1]
    assert text.src[1] == "bad \ufffd byte" and text.tgt == ["gut", "auch"]
