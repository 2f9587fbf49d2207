"""nmt-plot on a real short training run's logs (JSON lines and TensorBoard), and its errors."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from nmt.plot import read_curves
from nmt_cli.plot import main

from .helpers import TINY_MODEL_FLAGS, run_forked


@pytest.fixture(scope="module")
def training_run(tiny_data, tmp_path_factory):
    """12 updates, validated (loss and BLEU) every 4, logged as JSON lines and to TensorBoard."""
    root = tmp_path_factory.mktemp("run")
    args = [
        tiny_data,
        "--save-dir",
        str(root / "ckpt"),
        "--max-tokens",
        "256",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--warmup-updates",
        "10",
        "--lr",
        "0.003",
        "--max-update",
        "12",
        "--validate-interval-updates",
        "4",
        "--eval-bleu",
        "--no-epoch-checkpoints",
        "--tensorboard-logdir",
        str(root / "tb"),
        *TINY_MODEL_FLAGS,
    ]
    result = run_forked("nmt_cli.train", args, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    log = root / "train.log"
    log.write_text(
        "output that is not a record\n" + result.stdout, encoding="utf-8"
    )  # e.g. stdout and stderr saved together
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return log, root / "tb", records


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_json_log_curves_are_the_logged_records(training_run) -> None:
    log, _, records = training_run
    curves = read_curves(str(log))
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    assert len(train) == 12 and len(valid) == 3
    for name, rows, key in (
        ("train loss", train, "loss"),
        ("learning rate", train, "lr"),
        ("valid loss", valid, "valid_loss"),
        ("valid BLEU", valid, "valid_bleu"),
    ):
        assert curves[name].updates.tolist() == [r["update"] for r in rows]
        assert curves[name].values.tolist() == [r[key] for r in rows]
        assert curves[name].times.tolist() == [r["time"] for r in rows]


def test_tensorboard_curves_equal_the_json_ones(training_run) -> None:
    log, tensorboard, _ = training_run
    from_json, from_events = read_curves(str(log)), read_curves(str(tensorboard))
    assert (
        from_events.keys()
        == from_json.keys()
        == {"train loss", "valid loss", "valid BLEU", "learning rate"}
    )
    for name, series in from_json.items():
        assert from_events[name].updates.tolist() == series.updates.tolist()
        np.testing.assert_allclose(
            from_events[name].values, series.values, rtol=1e-6
        )  # float32 in event files
        np.testing.assert_allclose(from_events[name].times, series.times, atol=1.0)


@pytest.mark.parametrize("which", ["json", "tensorboard"])
def test_nmt_plot_writes_a_png(training_run, tmp_path, which) -> None:
    log, tensorboard, _ = training_run
    output = tmp_path / "curves.png"
    assert main([str(log if which == "json" else tensorboard), "-o", str(output)]) == 0
    assert png_size(output) == (
        1200,
        900,
    )  # 3 rows (loss, BLEU, lr) x 2 columns (updates, minutes), 6x3 in at 100 dpi
    from matplotlib.image import imread

    rgb = np.round(imread(str(output))[..., :3] * 255).astype(np.uint8)  # (H, W, 3)
    # The curves are drawn: pixels of matplotlib's first two line colours (train loss, valid loss).
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert (rgb == colour).all(axis=-1).sum() > 100, colour


def test_bad_logs_are_one_line_errors(tmp_path, capsys) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("no records here\n", encoding="utf-8")
    broken = tmp_path / "broken.log"
    broken.write_text(
        '{"kind": "train", "update": 1, "loss": 2.0}\n{"kind": "tr\n{"kind": "train", "update": 2, "loss": 1.0}\n',
        encoding="utf-8",
    )
    cut = tmp_path / "cut.log"
    cut.write_text(
        '{"kind": "train", "update": 1, "loss": 2.0, "lr": 0.1}\n{"kind": "train", "upd',
        encoding="utf-8",
    )
    (tmp_path / "nothing").mkdir()
    for argv, message in (
        ([str(empty)], "empty.log: no training records"),
        ([str(broken)], "broken.log:2: not a JSON record"),
        ([str(tmp_path / "missing.log")], "missing.log: no such file or directory"),
        ([str(tmp_path / "nothing")], "nothing: no TensorBoard event files"),
    ):
        assert main([*argv, "-o", str(tmp_path / "x.png")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("nmt-plot: error: ") and message in err[-1], err
    assert not (tmp_path / "x.png").exists()
    curves = read_curves(
        str(cut)
    )  # a killed run's last line is cut short: skipped, the rest is plotted
    assert (
        curves["train loss"].updates.tolist() == [1] and np.isnan(curves["train loss"].times).all()
    )
    assert main([str(cut), "-o", str(tmp_path / "cut.png")]) == 0
    assert png_size(tmp_path / "cut.png") == (
        600,
        600,
    )  # no wall clock in this log: one column (loss, lr)


def test_missing_matplotlib_is_a_one_line_error(
    training_run, tmp_path, capsys, monkeypatch
) -> None:
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    assert main([str(training_run[0]), "-o", str(tmp_path / "x.png")]) == 1
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == "nmt-plot: error: nmt-plot needs matplotlib (pip install 'nmt[plot]')"
    )


def test_tensorboard_logdir_without_tensorboard_is_a_one_line_error(tiny_data, tmp_path) -> None:
    hide = (
        "import sys; sys.modules['tensorboard'] = sys.modules['torch.utils.tensorboard'] = None; "
    )
    run = "from nmt_cli.train import main; sys.exit(main(sys.argv[1:]))"
    argv = [
        tiny_data,
        "--save-dir",
        str(tmp_path / "ckpt"),
        "--max-update",
        "1",
        "--tensorboard-logdir",
        str(tmp_path / "tb"),
        *TINY_MODEL_FLAGS,
    ]
    result = subprocess.run(
        [sys.executable, "-c", hide + run, *argv], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "nmt-train: error: --tensorboard-logdir: the tensorboard package is not installed (pip install 'nmt[tensorboard]')"
    )
    assert not (tmp_path / "tb").exists()


def test_output_over_the_log_is_refused(tmp_path, capsys) -> None:
    """Issue 28: no command destroys its own input; nmt-plot LOG -o LOG used to replace the log."""
    log = tmp_path / "train.log"
    log.write_text('{"kind": "train", "update": 1, "loss": 2.0, "lr": 0.1}\n', encoding="utf-8")
    before = log.read_bytes()
    (tmp_path / "link.log").symlink_to(log)
    for output in (log, tmp_path / "link.log"):
        assert main([str(log), "-o", str(output)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"nmt-plot: error: --output {output}: is LOGDIR_OR_JSONLOG {log}, an input of this command that "
            "writing it would destroy; choose another --output"
        ]
    assert log.read_bytes() == before and (tmp_path / "link.log").is_symlink()
