"""Results files: what a recipe or benchmark measured, and enough to trust and regenerate it.

One JSON file per measurement (``results/<name>.json`` for the published ones): the command line,
the git revision (with ``-dirty`` when the work tree had uncommitted changes), the machine (CPU
model, cores, GPU, torch), the UTC date, the figures, and the hypothesis files it scored (paths
relative to the results file, so the directory can move). scripts/published.py regenerates the
READMEs' tables from these files and recomputes paired-bootstrap p-values from the hypotheses.

Recipes also record their figures at several update counts (``figures["by_update"]``: a list of
``{"updates": N, "bleu": ..., ...}``), so that a run on a slower or faster machine can be compared
with the expected score at the updates it reached rather than at the minutes it ran
(``expected_at``).

Standard library only (torch is looked at, not required), so any script can write one.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nmt.fileio import atomic_write, describe_os_error

RESULTS_VERSION = 1
BY_UPDATE = "by_update"  # figures key: [{"updates": N, metric: value, ...}, ...]


@dataclass(frozen=True)
class Results:
    path: str
    command: list[str]
    revision: str
    machine: dict[str, Any]
    date: str  # ISO 8601, UTC
    figures: dict[str, Any]
    hypotheses: dict[str, str]  # name -> path relative to the results file's directory

    def hypothesis_path(self, name: str) -> str:
        """The path of hypothesis file ``name``, resolved from the results file's directory."""
        if name not in self.hypotheses:
            raise ValueError(
                f"{self.path}: no hypotheses named {name!r} (has {sorted(self.hypotheses)})"
            )
        return os.path.join(os.path.dirname(os.path.abspath(self.path)), self.hypotheses[name])


def git_revision(directory: str) -> str:
    """``HEAD``'s hash, ``-dirty`` appended when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = _git(directory, "rev-parse", "HEAD")
        changed = _git(directory, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def _git(directory: str, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", directory, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def machine() -> dict[str, Any]:
    """CPU model, cores, GPU (if torch sees one), torch and Python versions, OS, load average."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": None,
        "torch": None,
        "python": platform.python_version(),
        "os": platform.platform(),
        # Shared machines: the 1/5/15-minute load averages at the end of the measurement.
        "load": [round(load, 2) for load in os.getloadavg()],
    }
    try:
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pass
    # Importing torch costs seconds: only a process that already did (every GPU job) is asked.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_results(
    path: str,
    *,
    figures: Mapping[str, Any],
    hypotheses: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> Results:
    """Write ``path`` atomically: ``figures`` (JSON values) with the command (default ``sys.argv``),
    revision, machine and date; ``hypotheses`` maps a name to a file that exists now."""
    directory = os.path.dirname(os.path.abspath(path))
    hypotheses = dict(hypotheses or {})
    for name, hypothesis in hypotheses.items():
        if not os.path.isfile(hypothesis):
            raise ValueError(f"{path}: hypotheses {name!r}: {hypothesis}: no such file")
    _check_by_update(path, figures.get(BY_UPDATE))
    results = Results(
        path=path,
        command=list(sys.argv if command is None else command),
        revision=git_revision(os.path.dirname(os.path.abspath(__file__))),  # the code that ran
        machine=machine(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        figures=dict(figures),
        hypotheses={
            name: os.path.relpath(os.path.abspath(p), directory) for name, p in hypotheses.items()
        },
    )
    save_results(results)
    return results


def save_results(results: Results) -> None:
    """Write ``results`` to its ``path`` atomically, as it is (a published copy keeps the
    command, revision, machine and date of the run that measured it)."""
    record = {"results_version": RESULTS_VERSION, **_fields(results)}
    os.makedirs(os.path.dirname(os.path.abspath(results.path)), exist_ok=True)
    with atomic_write(results.path, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=False, allow_nan=False)
        handle.write("\n")


def _fields(results: Results) -> dict[str, Any]:
    return {
        "command": results.command,
        "revision": results.revision,
        "machine": results.machine,
        "date": results.date,
        "figures": results.figures,
        "hypotheses": results.hypotheses,
    }


def read_results(path: str) -> Results:
    """The results file at ``path``; ValueError naming it when it is not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except OSError as error:
        raise describe_os_error(error, path) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not JSON ({error.msg})") from None
    if not isinstance(record, dict) or record.get("results_version") != RESULTS_VERSION:
        raise ValueError(f"{path}: not a results file (results_version {RESULTS_VERSION} expected)")
    missing = [
        key for key in ("command", "revision", "machine", "date", "figures") if key not in record
    ]
    if missing:
        raise ValueError(f"{path}: results file without {', '.join(missing)}")
    _check_by_update(path, record["figures"].get(BY_UPDATE))
    return Results(
        path=path,
        command=record["command"],
        revision=record["revision"],
        machine=record["machine"],
        date=record["date"],
        figures=record["figures"],
        hypotheses=record.get("hypotheses", {}),
    )


def _check_by_update(path: str, points: Any) -> None:
    if points is None:
        return
    if not isinstance(points, list) or not all(
        isinstance(point, dict) and isinstance(point.get("updates"), int) for point in points
    ):
        raise ValueError(f"{path}: figures.{BY_UPDATE} must be a list of {{'updates': int, ...}}")
    updates = [point["updates"] for point in points]
    if updates != sorted(set(updates)):
        raise ValueError(f"{path}: figures.{BY_UPDATE} must be in increasing order of updates")


@dataclass(frozen=True)
class Expected:
    value: float
    updates: int  # the update count asked about
    low: int  # the recorded update counts it was read between (equal when one was hit exactly)
    high: int
    beyond: bool  # the run went past the last recorded point, so the value is that point's


def expected_at(results: Results, updates: int, metric: str = "bleu") -> Expected | None:
    """``metric`` expected after ``updates`` updates, linear between the two recorded update counts
    around it; the last point's value past the last one; None before the first or without points."""
    points = [p for p in results.figures.get(BY_UPDATE, []) if metric in p]
    if not points or updates < points[0]["updates"]:
        return None
    last = points[-1]
    if updates >= last["updates"]:
        return Expected(
            float(last[metric]),
            updates,
            last["updates"],
            last["updates"],
            updates > last["updates"],
        )
    for below, above in zip(points, points[1:]):
        if below["updates"] == updates:
            return Expected(float(below[metric]), updates, updates, updates, False)
        if below["updates"] < updates < above["updates"]:
            share = (updates - below["updates"]) / (above["updates"] - below["updates"])
            value = below[metric] + share * (above[metric] - below[metric])
            return Expected(float(value), updates, below["updates"], above["updates"], False)
    raise AssertionError("points are increasing, so one pair brackets updates")


def describe_expected(results: Results, updates: int, metric: str = "bleu") -> str:
    """One line for a recipe's end: the score its results file expects at ``updates``."""
    expected = expected_at(results, updates, metric)
    source = f"{results.path} ({results.date[:10]}, {results.machine.get('cpu')}, rev {results.revision[:10]})"
    if expected is None:
        return f"no expected {metric} at {updates} updates in {source}"
    where = (
        f"its last point, {expected.low} updates"
        if expected.beyond
        else f"{expected.low}"
        + ("" if expected.low == expected.high else f"-{expected.high}")
        + " updates"
    )
    return (
        f"expected {metric} at {updates} updates: {expected.value:.2f} (from {where} in {source})"
    )


def expected_line(path: str, updates: int, metric: str = "bleu") -> str:
    """``describe_expected`` of the results file at ``path``, or a line saying there is none yet
    (a recipe published for no revision so far still finishes with its own scores)."""
    if not os.path.isfile(path):
        return f"no expected {metric} at {updates} updates: {path} has not been measured yet"
    return describe_expected(read_results(path), updates, metric)
