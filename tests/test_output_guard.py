"""The one output guard (``nmt.fileio.check_written_paths``), walked through every command's real
``main``: each option that names a path declares what the command does there, and every option a
command writes to is refused, in one line naming it, wherever writing would destroy an input, a
dataset, an export or a checkpoint, however the path is spelled; nothing is written."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from nmt.fileio import PATH_KINDS, PREFIX, READ, Destination, check_destination
from nmt_cli import eval as eval_cli
from nmt_cli import export as export_cli
from nmt_cli import filter as filter_cli
from nmt_cli import import_model as import_cli
from nmt_cli import plot as plot_cli
from nmt_cli import preprocess as preprocess_cli
from nmt_cli import serve as serve_cli
from nmt_cli import train as train_cli

COMMANDS = {
    "nmt-train": train_cli,
    "nmt-eval": eval_cli,
    "nmt-filter": filter_cli,
    "nmt-preprocess": preprocess_cli,
    "nmt-export": export_cli,
    "nmt-import": import_cli,
    "nmt-plot": plot_cli,
    "nmt-serve": serve_cli,
}

# Option names that look like paths and are not: checked by hand once, listed so that a new
# path-like option fails test_every_path_option_declares_what_the_command_does_there.
NOT_PATHS = {
    "--spm-model-type",
    "--log-interval",
    "--log-format",
    "--log-all-ranks",
    "--train-subsets",  # split names of DATA_DIR (DIR/SPLIT: a dataset, guarded as one)
    "--valid-subset",
    "--split",
    "--from",
    "--format",
    "--source-lang",
    "--target-lang",
    "--no-progress-bar",
    "--access-log",
    "--upsample-directions",
    "--eval-bleu-args",
    "--eval-bleu-remove-bpe",
}
PATH_WORDS = ("dir", "file", "path", "pref", "output", "log", "scores", "model", "restore", "dict")
PATH_WORDS += ("input", "reference", "forward", "reverse", "checkpoint", "source", "ckpt", "data")


def _path_like(action) -> bool:
    """A text option (no flag, no number, no choice) whose name suggests a path."""
    if action.nargs == 0 or action.choices or action.type not in (None, str):
        return False
    names = [*action.option_strings, str(action.metavar or ""), action.dest]
    return any(word in name.lower() for name in names for word in PATH_WORDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_path_option_declares_what_the_command_does_there(command):
    undeclared = []
    for action in COMMANDS[command].build_parser()._actions:
        names = set(action.option_strings)
        if action.dest == "help" or names & NOT_PATHS or not _path_like(action):
            continue
        kind = getattr(action, "path_kind", None)
        if kind is None:
            undeclared.append(action.option_strings or [action.dest])
        else:
            assert kind in PATH_KINDS
    assert not undeclared, f"{command}: declare these with a path kind (mark_path/opt(path=))"


def _tree_digest(root: str) -> dict[str, str]:
    digests = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    digests[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return digests


@pytest.fixture
def world(tiny, tmp_path):
    """A private copy of the tiny dataset and model (a bug in the guard must not spoil the shared
    fixture), raw text, a save dir with a checkpoint, and a JSON log."""
    data = tmp_path / "data"
    shutil.copytree(tiny.data_dir, data)
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    checkpoint = save_dir / "checkpoint_last.pt"
    shutil.copy(tiny.checkpoint, checkpoint)
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        (raw / f"train.{lang}").write_text("a b\nc d\n", encoding="utf-8")
    log = tmp_path / "train.jsonl"
    log.write_text('{"update": 1, "loss": 2.0}\n', encoding="utf-8")
    (tmp_path / "link-to-data").symlink_to(data)
    return {
        "root": tmp_path,
        "data": data,
        "ckpt": checkpoint,
        "save": save_dir,
        "raw": raw,
        "log": log,
    }


def _base_argv(command: str, w: dict) -> list[str]:
    """The least each command needs besides the option under test."""
    return {
        "nmt-train": [str(w["data"]), "--cpu"],
        "nmt-eval": [str(w["data"]), "--path", str(w["ckpt"]), "--cpu"],
        "nmt-filter": [str(w["data"]), "--forward", str(w["ckpt"]), "--reverse", str(w["ckpt"])],
        "nmt-preprocess": ["-s", "en", "-t", "de", "--trainpref", str(w["raw"] / "train")],
        "nmt-export": [str(w["ckpt"])],
        "nmt-import": [str(w["ckpt"]), "--from", "fairseq"],
        "nmt-plot": [str(w["log"])],
        "nmt-serve": ["--path", str(w["ckpt"])],
    }[command]


# Required companions of an option under test (and the options a command needs when the one
# under test is not it).
COMPANIONS = {
    ("nmt-filter", "--destdir"): ["--keep-fraction", "0.5"],
    ("nmt-train", None): ["--save-dir", "{root}/new-ckpt"],
    ("nmt-filter", None): ["--scores", "{root}/new.scores"],
    ("nmt-preprocess", None): ["--destdir", "{root}/new-data"],
    ("nmt-export", None): ["--output-dir", "{root}/new-export"],
    ("nmt-import", None): ["--output-dir", "{root}/new-import"],
}


DATASET_REASONS = ("a dataset", "an input")
CHECKPOINT_REASONS = ("a checkpoint", "an input")


def _hostile_targets(kind: str, w: dict) -> list[tuple[str, tuple[str, ...]]]:
    """(path, the reasons the one line may give) for an output option of ``kind``."""
    data, ckpt = w["data"], w["ckpt"]
    token_file = next(name for name in sorted(os.listdir(data)) if name.endswith(".bin"))
    spelled = f"{w['root']}/link-to-data/../data/{token_file}"  # a link, then ..
    if kind == "file":
        return [
            (str(data / token_file), DATASET_REASONS),
            (spelled, DATASET_REASONS),
            (str(data / "manifest.json"), DATASET_REASONS),
            (str(ckpt), CHECKPOINT_REASONS),
            (f"{w['save']}/./checkpoint_last.pt", CHECKPOINT_REASONS),
        ]
    if kind in ("dir", "save_dir"):
        return [
            (str(data), DATASET_REASONS),
            (f"{w['root']}/link-to-data/", DATASET_REASONS),
            (str(data / "sub"), DATASET_REASONS),
            (str(w["root"]), ("holds",)),
        ]
    assert kind in ("dataset", "export"), kind
    return [
        (str(data / "inner"), DATASET_REASONS),
        (str(w["save"]), ("a save dir", "an input")),
        (f"{w['root']}/link-to-data/inner", DATASET_REASONS),
    ]


def _cases():
    for command, module in sorted(COMMANDS.items()):
        for action in module.build_parser()._actions:
            kind = getattr(action, "path_kind", None)
            if kind is not None and kind not in (READ, PREFIX):
                option = max(action.option_strings, key=len, default=None)
                yield command, option or action.metavar, kind


CASES = list(_cases())


def test_the_walk_covers_every_written_option_of_every_command():
    commands = {command for command, _, _ in CASES}
    # nmt-serve writes no path; every other command writes at least one.
    assert commands == set(COMMANDS) - {"nmt-serve"}
    assert ("nmt-train", "--log-file", "file") in CASES
    assert ("nmt-filter", "--scores", "file") in CASES
    assert ("nmt-train", "--save-dir", "save_dir") in CASES


@pytest.mark.parametrize("command,option,kind", CASES, ids=[f"{c} {o}" for c, o, _ in CASES])
def test_every_written_option_is_guarded(command, option, kind, world, capsys):
    before = _tree_digest(str(world["root"]))
    for target, reasons in _hostile_targets(kind, world):
        argv = _base_argv(command, world)
        if option.startswith("-"):
            argv += [option, target]
        else:  # a positional output (none today)
            argv.append(target)
        argv += COMPANIONS.get((command, option), [])
        own = COMPANIONS.get((command, None), [])
        if own and own[0] != option:
            argv += [word.format(root=world["root"]) for word in own]
        code = COMMANDS[command].main(argv)
        err = capsys.readouterr().err.strip()
        lines = [line for line in err.splitlines() if " | " not in line]  # log lines aside
        assert code == 1, (argv, err)
        assert len(lines) == 1 and lines[0].startswith(f"{command}: error: {option} "), err
        assert any(reason in lines[0] for reason in reasons), (reasons, err)
        assert _tree_digest(str(world["root"])) == before, argv
        assert not os.path.exists(world["data"] / "sub") and not os.path.exists(
            world["data"] / "inner"
        )


def test_a_log_or_tensorboard_directory_beside_the_checkpoints_is_fine(world):
    from nmt.fileio import PathOption, check_written_paths

    check_written_paths(
        [
            PathOption("DATA_DIR", str(world["data"]), READ),
            PathOption("--save-dir", str(world["save"]), "save_dir"),
            PathOption("--log-file", str(world["save"] / "train.log"), "file"),
            PathOption("--tensorboard-logdir", str(world["save"]), "dir"),
        ]
    )


def test_two_outputs_of_one_command_on_the_same_file_are_refused(world, capsys):
    out = str(world["root"] / "same")
    argv = _base_argv("nmt-filter", world) + ["--scores", out, "--destdir", out]
    assert filter_cli.main([*argv, "--keep-fraction", "0.5"]) == 1
    assert "--destdir" in capsys.readouterr().err


def test_overwrite_never_deletes_a_save_dir_or_checkpoint_put_inside_a_dataset(world, capsys):
    """The reported case: a save dir inside a dataset (accepted before), then nmt-preprocess
    --overwrite of that dataset deleted the checkpoints without a word."""
    inside = world["data"] / "ckpt"
    shutil.copytree(world["save"], inside)
    before = _tree_digest(str(world["data"]))
    raw = str(world["raw"] / "train")
    argv = ["-s", "en", "-t", "de", "--trainpref", raw, "--destdir", str(world["data"])]
    assert preprocess_cli.main([*argv, "--overwrite", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "holds" in err and "ckpt" in err and "--overwrite would delete" in err, err
    assert _tree_digest(str(world["data"])) == before
    # A stray checkpoint file is kept the same way.
    shutil.rmtree(inside)
    shutil.copy(world["ckpt"], world["data"] / "average.pt")
    replace = Destination(
        str(world["data"]),
        option="--destdir",
        replace_flag="--overwrite",
        made_by="nmt-preprocess",
        replace=True,
    )
    with pytest.raises(ValueError, match="average.pt, a checkpoint"):
        check_destination(replace)
    os.remove(world["data"] / "average.pt")
    check_destination(replace)  # its own files only: replaced as before


def test_streams_are_written_to_not_guarded(world):
    from nmt.fileio import PathOption, check_written_paths

    check_written_paths(
        [
            PathOption("--path", str(world["ckpt"]), READ),
            PathOption("--output", "/dev/null", "file"),
            PathOption("--output", "-", "file"),
        ]
    )


def test_a_replaced_directory_is_swapped_in_one_step(tmp_path, monkeypatch):
    """--overwrite/--force: the old directory and the new one trade places atomically, so a kill
    at any moment leaves one of them at the destination (two renames left a moment with none,
    and the old one under a name the next run's clean-up deletes)."""
    from nmt.fileio import install_directory, mark_directory

    old = tmp_path / "out"
    old.mkdir()
    (old / "old.txt").write_text("old")
    mark_directory(str(old), "nmt-export")
    new = tmp_path / ".out.tmp-1"
    new.mkdir()
    (new / "new.txt").write_text("new")

    def no_rename(*args):
        raise AssertionError(f"a rename left the destination empty for a moment: {args}")

    monkeypatch.setattr(os, "rename", no_rename)
    destination = Destination(
        str(old), option="--output-dir", replace_flag="--force", made_by="nmt-export", replace=True
    )
    install_directory(str(new), destination)
    assert sorted(os.listdir(old)) == [".nmt-made-by", "new.txt"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_manifest_json_of_another_program_above_the_run_is_no_dataset(world):
    """A project whose root holds some other manifest.json (a web app's, an extension's) is not
    taken for a dataset: what is written under it is not refused."""
    from nmt.fileio import PathOption, check_written_paths, managed_kind

    project = world["root"] / "project"
    project.mkdir()
    (project / "manifest.json").write_text('{"name": "my-extension", "version": "1.0"}')
    assert managed_kind(str(project)) is None
    assert managed_kind(str(world["data"])) == "dataset"
    (world["data"] / ".nmt-made-by").unlink()  # a dataset from before the markers
    assert managed_kind(str(world["data"])) == "dataset"
    check_written_paths([PathOption("--save-dir", str(project / "ckpt"), "save_dir")])
