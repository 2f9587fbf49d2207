"""Recipes as resumable steps on the library: what each step is made from, done once, refused when
its output was made from something else.

A recipe (examples/*/run.py) is a list of named steps. Each step declares its identity (the options
and input files its output depends on) and its output (the files whose presence means it ran).
``run_steps`` checks every step against the recipe's record (``OUT/recipe.json``, one small file)
before anything runs: a step done with the same identity is skipped, one recorded with another is
refused in one line naming what differs, and an unfinished one (interrupted, killed) runs again,
which resumes it where the command it calls resumes (nmt-train continues from checkpoint_last.pt,
nmt-eval --output-dataset from its last chunk). A step the command refused before it wrote anything
binds nothing: another option may follow.

Also the one checkpoint-averaging rule of the recipes, and their scores as values.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nmt.fileio import atomic_write
from nmt.provenance import differences

RECORD_NAME = "recipe.json"
# Measured on Multi30k val (examples/multi30k/README.md): averaging the last 5 checkpoints helps
# after 25 minutes (+0.5 BLEU) and hurts after 12 (-0.6), while the model still improves quickly.
AVERAGE_COUNT = 5
AVERAGE_FROM_MINUTES = 20.0
AVERAGE_FROM_UPDATES = 3000


class StepFailed(Exception):
    """A command a step called failed; it has said why on stderr already."""


def average_last(*, minutes: float = 0.0, max_update: int = 0, given: int | None = None) -> int:
    """How many of the newest checkpoints a model of this budget is scored with (1: the last)."""
    if given is not None:
        if given < 1:
            raise ValueError(f"--average-last: at least 1, not {given}")
        return given
    long_enough = minutes >= AVERAGE_FROM_MINUTES or max_update >= AVERAGE_FROM_UPDATES
    return AVERAGE_COUNT if long_enough else 1


def weight_flags(save_dir: str, count: int) -> list[str]:
    """nmt-eval's (and nmt-export's) flags for the model of ``save_dir`` averaged over ``count``."""
    if count > 1:
        return ["--path", save_dir, "--average-last", str(count)]
    return ["--path", os.path.join(save_dir, "checkpoint_last.pt")]


def weight_paths(save_dir: str, count: int) -> list[str]:
    """The checkpoint files ``weight_flags`` names."""
    if count == 1:
        return [os.path.join(save_dir, "checkpoint_last.pt")]
    from nmt.checkpoint_io import last_checkpoints  # torch: only for a recipe that averages

    return last_checkpoints(save_dir, count)


def save_weights(paths: Sequence[str], target: str) -> None:
    """The (averaged) model of ``paths`` as one checkpoint file, written atomically."""
    import torch

    from nmt.checkpoint_io import load_averaged_checkpoint

    state = load_averaged_checkpoint(paths)
    with atomic_write(target) as handle:
        torch.save(state, handle)


def file_sha256(path: str) -> str:
    """A model file's identity: its content, whatever its name or place."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def call(prog: str, main: Callable[[list[str]], int], argv: Sequence[str]) -> None:
    """A command's entry point in this process (nmt_cli.train.main...); it reports its own errors,
    so a failure stops the recipe without another message. A command that a signal stopped early
    (nmt-train saves and returns 0) stops the recipe as the signal would: its step is not done."""
    from nmt.workers import interruption, last_stop_signal, stop_signals_noted

    noted = stop_signals_noted()
    code = main([str(arg) for arg in argv])
    if code > 128:  # stopped by a signal before it had anything to save (start-up)
        raise interruption(code - 128)
    if code:
        raise StepFailed(f"{prog} exited with {code}")
    if stop_signals_noted() > noted:
        raise interruption(last_stop_signal())


@dataclass
class Step:
    name: str  # unique in the recipe; it names the step in the record and in messages
    identity: Mapping[str, Any]  # JSON values: options, flags, input files' sha256
    outputs: Sequence[str]  # all present: the step's output exists (partly, while not done)
    run: Callable[[], None] = field(repr=False)
    # Run every time, unrecorded: the command it calls decides what is left to do.
    always: bool = False


class Record:
    """``OUT/recipe.json``: per step, the identity it was made with and whether it finished."""

    def __init__(self, out: str) -> None:
        self.path = os.path.join(out, RECORD_NAME)
        self.steps: dict[str, dict[str, Any]] = {}
        if os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self.steps = json.load(handle)["steps"]
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{self.path}: not a recipe record ({error})") from None

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with atomic_write(self.path, "w", encoding="utf-8") as handle:
            json.dump({"steps": self.steps}, handle, indent=1, sort_keys=True)
            handle.write("\n")


def _exists(step: Step) -> bool:
    return all(os.path.exists(path) for path in step.outputs)


def check_steps(out: str, steps: Sequence[Step]) -> list[Step]:
    """The steps still to run; ValueError (one line) when an existing output was made from
    something else than this run asks for."""
    record = Record(out)
    pending = []
    for step in steps:
        recorded = record.steps.get(step.name)
        if step.always or not _exists(step):
            pending.append(step)
        elif recorded is not None:
            found = differences(recorded["identity"], dict(step.identity), labels=("then", "now"))
            if found:
                raise ValueError(
                    f"{out}: {step.name} was made with other settings ({'; '.join(found)}): "
                    "use another --out"
                )
            if not recorded["done"]:
                pending.append(step)
    return pending


def run_steps(out: str, steps: Sequence[Step]) -> None:
    """Every step not done yet, in order, each recorded as begun and then as done. An output found
    without a record (an older recipe's, or linked in from another --out) is taken as it is."""
    pending = {id(step) for step in check_steps(out, steps)}
    record = Record(out)
    for step in steps:
        if step.always:
            step.run()
            continue
        if id(step) not in pending:
            record.steps.setdefault(step.name, {"identity": dict(step.identity), "done": True})
            record.save()
            continue
        record.steps[step.name] = {"identity": dict(step.identity), "done": False}
        record.save()
        try:
            step.run()
        except BaseException:
            if not _exists(step):  # refused before it made anything: it binds nothing
                del record.steps[step.name]
                record.save()
            raise
        record.steps[step.name]["done"] = True
        record.save()


def split_references(data_dir: str, split: str, *, pair: str | None = None) -> list[str]:
    """The raw reference lines of a dataset's split (of direction ``pair``, by default its only
    one), a line per sentence it holds, as nmt-eval --split scores them."""
    from nmt.data import SentencePieceModel
    from nmt.data.manifest import load_manifest
    from nmt.eval.evaluate import direction_sets

    manifest = load_manifest(data_dir)
    src_spm = SentencePieceModel.load(manifest.path(manifest.spm.src_model))
    pairs = [pair or manifest.languages().pairs[0]]
    (found,) = direction_sets(manifest, split, src_spm=src_spm, pairs=pairs, option="--split")
    return found.references


def scores(
    hypotheses_path: str,
    references: Sequence[str],
    *,
    target_lang: str | None = None,
    languages: Sequence[str] = (),
    tokenized_lowercase: bool = False,
) -> dict[str, float]:
    """BLEU and chrF2 (cased sacreBLEU, as nmt-eval prints them) of a hypothesis file; with
    ``target_lang`` also the off-target rate (%) among ``languages``; with ``tokenized_lowercase``
    the lowercased 13a-tokenized BLEU papers report (``bleu_lc``)."""
    from nmt.eval.score import score
    from nmt.eval.translate import read_references

    hypotheses = read_references(hypotheses_path)
    found = score(hypotheses, references, tokenized_lowercase=tokenized_lowercase)
    values = {"bleu": found[0].score, "chrf": found[1].score}
    if tokenized_lowercase:
        values["bleu_lc"] = found[2].score
    if target_lang is not None:
        from nmt.eval.language_id import off_target_rate

        values["off_target"] = off_target_rate(hypotheses, target_lang, languages=languages)
    return values


def num_updates(checkpoint: str) -> int:
    """The updates a run's checkpoint reached (the machine may be shared: minutes say little)."""
    from nmt.checkpoint_io import load_model_checkpoint

    return int(load_model_checkpoint(checkpoint).get("num_updates", 0))


def positive_minutes(text: str) -> float:
    """argparse type of a budget in minutes (nan, inf and 0 are no budget)."""
    import argparse
    import math

    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return minutes


def parse_args(parser: Any, argv: Sequence[str] | None) -> Any:
    """``parser``'s options, and the flags after the first ``--`` as ``train_flags`` (for
    nmt-train, untouched: they may look like this recipe's own options)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.train_flags = argv[cut + 1 :]
    return args


def run_recipe(prog: str, body: Callable[[], None]) -> int:
    """A recipe's exit status: its user errors as one line ``prog: error: ...`` (1); a command that
    failed has reported itself (1); Ctrl+C 130, SIGTERM 143."""
    import sys

    from nmt.fileio import describe_os_error

    try:
        body()
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
    except OSError as error:
        print(f"{prog}: error: {describe_os_error(error)}", file=sys.stderr)
    except StepFailed:
        pass
    except KeyboardInterrupt as error:  # Ctrl+C, or SIGTERM as nmt.workers.Terminated
        print(f"{prog}: {str(error) or 'interrupted'}: run it again to go on", file=sys.stderr)
        return 128 + getattr(error, "signum", signal.SIGINT)
    else:
        return 0
    return 1
