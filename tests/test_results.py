"""nmt.results: a results file round-trips with its provenance, and the expected score per update."""

import json
import os
import subprocess
import sys

import pytest

from nmt.results import (
    Results,
    describe_expected,
    expected_at,
    expected_line,
    read_results,
    write_results,
)

CURVE = [
    {"updates": 200, "bleu": 10.0},
    {"updates": 600, "bleu": 30.0},
    {"updates": 1000, "bleu": 34.0},
]


def test_write_then_read_keeps_figures_command_and_hypotheses(tmp_path):
    hyps = tmp_path / "hyps" / "test.txt"
    hyps.parent.mkdir()
    hyps.write_text("ein Hund\n", encoding="utf-8")
    path = str(tmp_path / "results" / "recipe.json")
    write_results(
        path,
        figures={"bleu": 33.5, "by_update": CURVE},
        hypotheses={"test": str(hyps)},
        command=["run.py", "--minutes", "14"],
    )
    results = read_results(path)
    assert results.figures == {"bleu": 33.5, "by_update": CURVE}
    assert results.command == ["run.py", "--minutes", "14"]
    assert results.hypotheses == {"test": os.path.join("..", "hyps", "test.txt")}
    assert open(results.hypothesis_path("test"), encoding="utf-8").read() == "ein Hund\n"
    assert results.machine["cores"] == os.cpu_count()
    assert results.machine["cpu"]
    assert results.date.endswith("+00:00")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=os.path.dirname(__file__),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert results.revision.startswith(head)


def test_command_defaults_to_this_process_argv(tmp_path):
    path = str(tmp_path / "r.json")
    write_results(path, figures={"x": 1})
    assert read_results(path).command == sys.argv


def test_a_missing_hypothesis_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="hypotheses 'test': .*nothere.txt: no such file"):
        write_results(str(tmp_path / "r.json"), figures={}, hypotheses={"test": "nothere.txt"})


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", r"r.json:1: not JSON"),
        ('{"figures": {}}', "not a results file"),
        ('{"results_version": 1, "figures": {}}', "without command, revision, machine, date"),
    ],
)
def test_a_bad_results_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "r.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_results(str(path))


def test_by_update_points_must_increase(tmp_path):
    with pytest.raises(ValueError, match="increasing order of updates"):
        write_results(str(tmp_path / "r.json"), figures={"by_update": CURVE[::-1]})


def _results(points: list[dict]) -> Results:
    return Results(
        "r.json", [], "abc", {"cpu": "cpu"}, "2026-11-28T00:00:00+00:00", {"by_update": points}, {}
    )


@pytest.mark.parametrize(
    "updates, value, low, high, beyond",
    [
        (200, 10.0, 200, 200, False),
        (400, 20.0, 200, 600, False),
        (900, 33.0, 600, 1000, False),
        (1000, 34.0, 1000, 1000, False),
        (1400, 34.0, 1000, 1000, True),
    ],
)
def test_expected_score_is_read_between_the_recorded_update_counts(
    updates, value, low, high, beyond
):
    expected = expected_at(_results(CURVE), updates)
    assert expected is not None
    assert expected.value == pytest.approx(value)
    assert (expected.low, expected.high, expected.beyond) == (low, high, beyond)


def test_no_expected_score_before_the_first_point_or_without_the_metric():
    assert expected_at(_results(CURVE), 100) is None
    assert expected_at(_results(CURVE), 500, metric="chrf2") is None
    assert "no expected bleu at 100 updates" in describe_expected(_results(CURVE), 100)


def test_describe_expected_names_the_value_and_its_source():
    line = describe_expected(_results(CURVE), 900)
    assert line.startswith("expected bleu at 900 updates: 33.00 (from 600-1000 updates in r.json")
    assert "its last point, 1000 updates" in describe_expected(_results(CURVE), 1400)


def test_results_file_is_plain_json(tmp_path):
    path = tmp_path / "r.json"
    write_results(str(path), figures={"ratio": 1.5})
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["results_version"] == 1 and record["figures"] == {"ratio": 1.5}


def test_expected_line_reads_the_file_or_says_there_is_none(tmp_path):
    path = str(tmp_path / "multi30k.json")
    assert (
        expected_line(path, 900)
        == f"no expected bleu at 900 updates: {path} has not been measured yet"
    )
    write_results(path, figures={"by_update": CURVE})
    assert expected_line(path, 900).startswith("expected bleu at 900 updates: 33.00 (from 600-1000")
