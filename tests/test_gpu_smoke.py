"""benchmarks/gpu.py's orchestration, run on the CPU (--dry-run-cpu): every step under a hard time
limit (SIGTERM, then SIGKILL after the grace period, the step's whole process group), one table,
one JSON file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu.py"


def smoke(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(GPU), "--dry-run-cpu", "--work", str(tmp_path / "work")]
        + ["--json", str(report), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return result, json.loads(report.read_text()) if report.exists() else {}


def alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for a parent that does not reap is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def table_row(stdout: str, name: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(f"{name} "))


def test_a_step_deaf_to_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    """The ddp step's child (--hang) ignores SIGTERM and so does the process it started: both are
    gone after the limit and the grace period, and the row says so; the data step it needs ran
    for real before it."""
    started = time.monotonic()
    result, report = smoke(
        tmp_path, "--steps", "ddp", "--hang", "ddp", "--budget", "ddp=3", "--grace", "2"
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert [row["name"] for row in report["steps"]] == ["data", "ddp"]
    data, ddp = report["steps"]
    assert data["status"] == "pass"
    assert ddp["status"] == "timeout" and ddp["killed"] is True
    # SIGTERM at 3 s, SIGKILL at 3 + 2: not before, and not much after.
    assert 5 <= ddp["seconds"] < 15, ddp
    assert elapsed < 120
    assert ddp["detail"].startswith("stopped at its 3 s limit (SIGKILL 2 s after SIGTERM)")
    # What the step reported before its limit is kept: here, its own and its child's pids.
    pids = ddp["figures"]["pids"]
    assert ddp["detail"].endswith(f"; done before: hanging: pid {pids[0]}, child pid {pids[1]}")
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)
    assert "timeout" in table_row(result.stdout, "ddp")
    assert "SIGKILL 2 s after SIGTERM" in table_row(result.stdout, "ddp")
    assert re.match(r"data +Multi30k dataset +pass ", table_row(result.stdout, "data"))


def test_a_step_that_obeys_sigterm_ends_within_the_grace_period(tmp_path: Path) -> None:
    result, report = smoke(tmp_path, "--steps", "cuda-tests", "--budget", "cuda-tests=2")
    (row,) = report["steps"]
    assert row["status"] == "timeout" and row["killed"] is False, row
    assert 2 <= row["seconds"] < 10  # pytest ends at SIGTERM, long before the 10 s of grace
    assert "(SIGTERM ended it)" in row["detail"]
    assert result.returncode == 1


def test_budgets_over_the_limit_are_one_line(tmp_path: Path) -> None:
    result, report = smoke(tmp_path, "--limit", "60")
    assert result.returncode == 2 and report == {}
    assert result.stderr.strip().splitlines()[-1] == (
        "benchmarks/gpu.py: error: --budget: the steps' budgets sum to 1690 s, over the smoke's "
        "60 s (--limit)"
    )
    result, _ = smoke(tmp_path, "--budget", "ddp=abc")
    assert result.stderr.strip().splitlines()[-1] == (
        "benchmarks/gpu.py: error: argument --budget: must be a positive number, got 'abc'"
    )
    result, _ = smoke(tmp_path, "--smoke", "--hang", "ddp", "--steps", "data")
    assert result.stderr.strip().splitlines()[-1] == (
        "benchmarks/gpu.py: error: --hang: only with --dry-run-cpu, and one of its --steps"
    )


@pytest.mark.slow
def test_every_step_runs_on_the_cpu(tmp_path: Path) -> None:
    """The whole smoke, tiny: each step passes and reports its figures."""
    result, report = smoke(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["name"]: row for row in report["steps"]}
    assert list(rows) == ["data", "cuda-tests", "ddp", "throughput", "compile", "recipe"]
    assert all(row["status"] == "pass" for row in rows.values())
    assert "skipped" in rows["cuda-tests"]["detail"]  # no CUDA here
    assert rows["ddp"]["figures"]["worst_relative_difference"] < 1e-4
    throughput = rows["throughput"]["figures"]
    assert set(throughput) == {"packed 256", "packed 512", "padded 256", "padded 512"}
    assert all(f["process_tok_s"] > 0 and f["step_tok_s"] > 0 for f in throughput.values())
    assert rows["compile"]["figures"]["compiled"]["shapes"] >= 1
    assert 0 <= rows["recipe"]["figures"]["bleu"] <= 100
    assert report["seconds"] <= report["limit_s"]
    for row in rows.values():
        assert row["title"] in table_row(result.stdout, row["name"])


def test_the_recipe_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    recipe = ROOT / "examples" / "multi30k-gpu" / "run.py"
    for args, message in (
        (
            ["--minutes", "nan"],
            "argument --minutes: must be a positive number, not 'nan'",
        ),
        (["--average-last", "0"], "--average-last: must be >= 1, got 0"),
        (["--data", str(tmp_path)], f"--data {tmp_path}: no manifest.json there"),
    ):
        result = subprocess.run(
            [sys.executable, str(recipe), "--out", str(tmp_path / "out"), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2
        assert (
            result.stderr.strip()
            .splitlines()[-1]
            .startswith(f"examples/multi30k-gpu/run.py: error: {message}")
        )
        assert not (tmp_path / "out").exists()  # refused before anything was written


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_sigterm_to_the_recipe_stops_its_nmt_train(tmp_path: Path) -> None:
    """`timeout` or a job scheduler signals the recipe's process alone: nmt-train goes too."""
    result, report = smoke(tmp_path, "--steps", "data")
    assert result.returncode == 0, result.stdout + result.stderr
    recipe = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "multi30k-gpu" / "run.py")]
        + ["--data", str(tmp_path / "work" / "data"), "--out", str(tmp_path / "out")]
        + ["--device", "cpu", "--minutes", "10", "--", "--encoder-layers", "1"]
        + ["--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert recipe.stdout is not None
    for line in recipe.stdout:  # nmt-train has started once it logs its rank line
        if "rank 0/1 on cpu" in line:
            break
    (train,) = children(recipe.pid)
    recipe.terminate()
    recipe.stdout.read()
    assert recipe.wait(timeout=120) == 143
    assert not alive(train)
