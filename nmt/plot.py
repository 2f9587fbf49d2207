"""Training curves from a run's log: nmt-train's JSON records or its TensorBoard event files.

Both give the same series: training loss and learning rate per logged update, validation loss (and
BLEU with --eval-bleu) per validation, each against updates and wall-clock minutes since the first
record. A resumed run logs some updates again; the last record of an update wins. matplotlib
(the ``plot`` extra) and tensorboard (to read event files) are imported only when needed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from nmt.fileio import write_output

logger = logging.getLogger(__name__)

# (record kind, key in the JSON record) of each curve; TensorBoard tags are "kind/key".
CURVES = {
    "train loss": ("train", "loss"),
    "valid loss": ("valid", "valid_loss"),
    "valid BLEU": ("valid", "valid_bleu"),
    "learning rate": ("train", "lr"),
}


@dataclass
class Series:
    updates: np.ndarray  # (N,) int, increasing
    times: np.ndarray  # (N,) float, Unix seconds; NaN where the log has no wall clock
    values: np.ndarray  # (N,) float


def read_curves(path: str) -> dict[str, Series]:
    """The curves in ``path`` (a JSON log, a TensorBoard directory or event file), by name of ``CURVES``;
    curves the log does not have are absent. ValueError (naming the file) when it has none."""
    if os.path.isdir(path):
        points = _tensorboard_points(_event_directories(path))
    elif not os.path.isfile(path):
        raise ValueError(f"{path}: no such file or directory")
    elif "tfevents" in os.path.basename(path):
        points = _tensorboard_points([os.path.dirname(path) or "."], only_file=path)
    else:
        points = _json_points(path)
    curves = {name: _series(points[name]) for name in CURVES if points.get(name)}
    if not curves:
        raise ValueError(
            f"{path}: no training records (expected nmt-train --log-format json output, or a --tensorboard-logdir directory)"
        )
    return curves


def _series(points: dict[int, tuple[float, float]]) -> Series:
    updates = np.array(sorted(points), dtype=np.int64)
    times = np.array([points[u][0] for u in updates], dtype=np.float64)
    values = np.array([points[u][1] for u in updates], dtype=np.float64)
    return Series(updates, times, values)


def _json_points(path: str) -> dict[str, dict[int, tuple[float, float]]]:
    """update -> (time, value) per curve from JSON lines; lines not starting with '{' are other output."""
    points: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in CURVES}
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", errors="replace").strip()
        if not text.startswith("{"):
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            if number == len(lines):  # the last line of a killed run, cut short
                logger.warning("%s:%d: incomplete last record skipped", path, number)
                continue
            raise ValueError(f"{path}:{number}: not a JSON record ({error.msg})") from None
        if not isinstance(record, dict) or "update" not in record:
            continue
        for name, (kind, key) in CURVES.items():
            if record.get("kind") == kind and isinstance(record.get(key), (int, float)):
                points[name][int(record["update"])] = (
                    float(record.get("time", np.nan)),
                    float(record[key]),
                )
    return points


def _event_directories(root: str) -> list[str]:
    directories = sorted(
        {
            dirpath
            for dirpath, _, files in os.walk(root)
            if any("tfevents" in name for name in files)
        }
    )
    if not directories:
        raise ValueError(
            f"{root}: no TensorBoard event files (events.out.tfevents.*) in this directory"
        )
    return directories


def _tensorboard_points(
    directories: list[str], *, only_file: str | None = None
) -> dict[str, dict[int, tuple[float, float]]]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ValueError(
            "reading TensorBoard event files needs the tensorboard package (pip install 'nmt[tensorboard]')"
        ) from None
    points: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in CURVES}
    for directory in directories:
        accumulator = EventAccumulator(
            only_file or directory, size_guidance={"scalars": 0}
        )  # 0: keep every point
        accumulator.Reload()
        tags = set(accumulator.Tags().get("scalars", []))
        for name, (kind, key) in CURVES.items():
            if f"{kind}/{key}" in tags:
                for event in sorted(
                    accumulator.Scalars(f"{kind}/{key}"), key=lambda e: e.wall_time
                ):
                    points[name][int(event.step)] = (float(event.wall_time), float(event.value))
    return points


def plot_curves(curves: dict[str, Series], output: str, *, title: str) -> None:
    """Rows: loss (train and valid), BLEU, learning rate (those present); columns: against updates,
    and against wall-clock minutes (when the log has times). Written atomically."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError("nmt-plot needs matplotlib (pip install 'nmt[plot]')") from None
    rows = [
        names
        for names in (("train loss", "valid loss"), ("valid BLEU",), ("learning rate",))
        if any(n in curves for n in names)
    ]
    start = min(
        (float(np.nanmin(s.times)) for s in curves.values() if not np.isnan(s.times).all()),
        default=None,
    )
    columns = ["updates"] + (["wall-clock minutes"] if start is not None else [])
    if start is None:
        logger.warning("the log has no wall-clock times: curves against updates only")
    figure = Figure(figsize=(6 * len(columns), 3 * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(rows), len(columns), squeeze=False)
    for row, names in enumerate(rows):
        for column, xlabel in enumerate(columns):
            ax = axes[row][column]
            for name in names:
                if name not in curves:
                    continue
                series = curves[name]
                x = series.updates if column == 0 else (series.times - start) / 60.0
                ax.plot(
                    x,
                    series.values,
                    marker="o" if name.startswith("valid") else None,
                    markersize=3,
                    label=name,
                )
            ax.set_xlabel(xlabel)
            ax.set_ylabel("loss (base 2)" if names[0].endswith("loss") else names[0])
            ax.grid(alpha=0.3)
            if len(names) > 1:
                ax.legend()
    figure.suptitle(title)
    suffix = os.path.splitext(output)[1].lstrip(".").lower() or "png"
    with write_output(output, "wb") as handle:
        figure.savefig(handle, format=suffix, dpi=100)
