"""nmt-eval as a clumsy or hostile user runs it: --output over its own inputs, over a link, a FIFO or
stdout; empty input and reference; a --min-len no output can meet (issue 28, cases 1, 3 and 6)."""

from __future__ import annotations

import gzip
import os
import stat
import threading
import zlib

import pytest

from nmt.eval import Translator
from nmt.eval.score import score
from nmt_cli.eval import main


def _one_error_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-eval: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.fixture()
def inputs(tiny, tmp_path):
    """Copies of the checkpoint and of the test text, so that a failure here harms no other test."""
    checkpoint = tmp_path / "ckpt" / "checkpoint_best.pt"
    checkpoint.parent.mkdir()
    with open(tiny.checkpoint, "rb") as handle:
        checkpoint.write_bytes(handle.read())
    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_text("\n".join(tiny.test_src[:4]) + "\n", encoding="utf-8")
    reference.write_text("\n".join(tiny.test_tgt[:4]) + "\n", encoding="utf-8")
    return checkpoint, source, reference


def test_output_that_is_an_input_under_any_spelling_is_refused(inputs, tmp_path, capsys) -> None:
    checkpoint, source, reference = inputs
    (tmp_path / "link.en").symlink_to(source)
    os.link(reference, tmp_path / "hard.de")
    before = {path: path.read_bytes() for path in (checkpoint, source, reference)}
    args = ["--path", str(checkpoint), "--input", str(source), "--reference", str(reference)]
    for output, option in (
        (source, "--input"),
        (reference, "--reference"),
        (checkpoint, "--path"),
        (tmp_path / "link.en", "--input"),  # a symbolic link to the input
        (tmp_path / "hard.de", "--reference"),  # a hard link: the same inode
        (tmp_path / "ckpt" / ".." / "test.en", "--input"),  # another spelling
    ):
        assert main([*args, "--output", str(output), "--cpu"]) == 1
        _one_error_line(capsys.readouterr().err, f"--output {output}: is {option} ")
    assert {path: path.read_bytes() for path in before} == before
    assert (tmp_path / "link.en").is_symlink()


def test_output_inside_the_dataset_is_refused(tiny, capsys) -> None:
    output = os.path.join(tiny.data_dir, "test.hyp")
    assert main([tiny.data_dir, "--path", tiny.checkpoint, "--output", output, "--cpu"]) == 1
    _one_error_line(capsys.readouterr().err, "lies inside DATA_DIR")
    assert not os.path.exists(output)


def test_a_link_stays_a_link_and_a_fifo_a_fifo(tiny, inputs, tmp_path, capsys) -> None:
    checkpoint, source, _ = inputs
    expected = "".join(
        line + "\n"
        for line in Translator.from_checkpoint(str(checkpoint)).translate(tiny.test_src[:4])
    )
    target, link = tmp_path / "hyp.txt", tmp_path / "hyp-link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    args = ["--path", str(checkpoint), "--input", str(source), "--cpu"]
    assert main([*args, "--output", str(link)]) == 0
    assert link.is_symlink() and target.read_text(encoding="utf-8") == expected

    fifo = tmp_path / "hyp.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    # A daemon: if the FIFO were replaced (as on main), the reader would wait for a writer forever.
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main([*args, "--output", str(fifo)]) == 0
    reader.join(timeout=30)
    assert received == [expected.encode()]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    capsys.readouterr()


def test_a_path_to_stdout_streams_to_it(tiny, inputs, tmp_path, capfd) -> None:
    """``--output /dev/stdout`` as a link of our own to /proc/self/fd/1 (never the machine's
    /dev/stdout, which a regression would replace): the translations on stdout, the link kept."""
    checkpoint, source, _ = inputs
    stdout_link = tmp_path / "stdout"
    stdout_link.symlink_to("/proc/self/fd/1")
    argv = ["--path", str(checkpoint), "--input", str(source), "--output", str(stdout_link)]
    assert main([*argv, "--cpu"]) == 0
    expected = Translator.from_checkpoint(str(checkpoint)).translate(tiny.test_src[:4])
    assert capfd.readouterr().out.split("\n")[:-1] == expected
    assert stdout_link.is_symlink()


def test_empty_input_and_reference_is_one_line(inputs, tmp_path, capsys) -> None:
    checkpoint, _, _ = inputs
    empty_src, empty_ref = tmp_path / "empty.en", tmp_path / "empty.de"
    empty_src.write_bytes(b"")
    empty_ref.write_bytes(b"")
    argv = ["--path", str(checkpoint), "--input", str(empty_src), "--reference", str(empty_ref)]
    assert main([*argv, "--cpu"]) == 1
    _one_error_line(capsys.readouterr().err, str(empty_ref), "nothing to score")
    with pytest.raises(ValueError, match="nothing to score"):
        score([], [])


def test_min_len_over_the_length_limit_is_one_line(inputs, tmp_path, capsys) -> None:
    checkpoint, source, _ = inputs
    args = ["--path", str(checkpoint), "--input", str(source), "--cpu"]
    assert main([*args, "--min-len", "100"]) == 1  # over the model's 64 target positions
    _one_error_line(capsys.readouterr().err, "--min-len 100: no translation may be that long")
    short = tmp_path / "short.en"
    short.write_text("the big red dog sits on the mat\ndog\n", encoding="utf-8")
    assert main(["--path", str(checkpoint), "--input", str(short), "--min-len", "14", "--cpu"]) == 1
    _one_error_line(capsys.readouterr().err, f"{short}:2: --min-len 14 is more than the 12 tokens")


def test_a_truncated_gz_input_is_reported_at_the_line_it_breaks(inputs, tmp_path, capsys) -> None:
    checkpoint, _, _ = inputs
    text = "".join(f"the dog {i} sits on the mat\n" for i in range(3000)).encode()
    compressed = gzip.compress(text)
    truncated = tmp_path / "cut.en.gz"
    truncated.write_bytes(compressed[: len(compressed) // 2])
    decoded = zlib.decompressobj(wbits=31).decompress(truncated.read_bytes())
    whole_lines = decoded.count(b"\n")
    assert main(["--path", str(checkpoint), "--input", str(truncated), "--cpu"]) == 1
    _one_error_line(
        capsys.readouterr().err,
        f"{truncated}: cannot read line {whole_lines + 1} ({whole_lines} lines decoded before it)",
    )
