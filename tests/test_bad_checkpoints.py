"""A checkpoint file a user names to any command (nmt-eval --path, nmt-train --restore-file and
--curriculum model:PATH, nmt-filter --forward/--reverse, nmt-export, nmt-serve --path) that is a text
file, an empty file or a truncated checkpoint is one line naming it and what is wrong, exit 1."""

from __future__ import annotations

import pathlib

import pytest

from nmt_cli.eval import main as eval_main
from nmt_cli.export import main as export_main
from nmt_cli.filter import main as filter_main
from nmt_cli.serve import main as serve_main
from nmt_cli.train import main as train_main

# kind -> (the bad file's bytes from a good checkpoint's, what the error says after "PATH: ")
BAD_FILES = {
    "text": (lambda good: b"en-de model, epoch 3\n", "not an nmt checkpoint (a text file)"),
    "empty": (lambda good: b"", "not an nmt checkpoint (an empty file)"),
    "truncated": (
        lambda good: good[: len(good) // 2],
        "not an nmt checkpoint (a truncated or damaged zip archive)",
    ),
}


def _train(tiny, out, *options):
    return [tiny.data_dir, "--arch", "transformer_tiny", "--save-dir", str(out / "run"), *options]


def _filter(tiny, out, forward, reverse):
    return [tiny.data_dir, "--forward", forward, "--reverse", reverse, "--scores", str(out / "s")]


# command -> (its main, its argv from the tiny setup, the bad file and a directory it may write in)
COMMANDS = {
    "nmt-eval --path": (eval_main, lambda t, bad, out: [t.data_dir, "--path", bad]),
    "nmt-train --restore-file": (
        train_main,
        lambda t, bad, out: _train(t, out, "--restore-file", bad),
    ),
    "nmt-train --curriculum": (
        train_main,
        lambda t, bad, out: _train(t, out, "--curriculum", f"model:{bad}"),
    ),
    "nmt-filter --forward": (
        filter_main,
        lambda t, bad, out: _filter(t, out, bad, t.checkpoint),
    ),
    "nmt-filter --reverse": (
        filter_main,
        lambda t, bad, out: _filter(t, out, t.checkpoint, bad),
    ),
    "nmt-export": (export_main, lambda t, bad, out: [bad, "--output-dir", str(out / "export")]),
    "nmt-serve --path": (serve_main, lambda t, bad, out: ["--path", bad, "--port", "0"]),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_checkpoint_file_is_one_line_naming_it(tiny, tmp_path, capsys, command, kind):
    main, argv = COMMANDS[command]
    content, message = BAD_FILES[kind]
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(content(pathlib.Path(tiny.checkpoint).read_bytes()))
    out = tmp_path / "out"
    out.mkdir()
    assert main(argv(tiny, str(bad), out)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    prog = command.split()[0]
    assert lines[0].startswith(f"{prog}: error: ") and f"{bad}: {message}" in lines[0], lines[0]
    assert list(out.iterdir()) == []  # nothing written
