"""The recipes (examples/*/run.py): the step runner of nmt.recipe, and each recipe's steps run for
real at tiny scale (a few hundred Multi30k pairs, a tiny model, a few updates)."""

import gzip
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from nmt import recipe

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_MODEL = [
    *("--encoder-layers", "1", "--decoder-layers", "1"),
    *("--encoder-embed-dim", "32", "--decoder-embed-dim", "32"),
    *("--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"),
]


# --- the step runner


def _step(calls: list[str], name: str, output: pathlib.Path, **identity) -> recipe.Step:
    def run() -> None:
        calls.append(name)
        output.write_text(name)

    return recipe.Step(name, identity, [str(output)], run)


def test_a_done_step_is_skipped_and_an_unfinished_one_runs_again(tmp_path):
    calls: list[str] = []
    first = _step(calls, "first", tmp_path / "first.txt", minutes=5)
    recipe.run_steps(str(tmp_path), [first])
    record = json.loads((tmp_path / recipe.RECORD_NAME).read_text())
    record["steps"]["first"]["done"] = False  # as after a kill -9 inside the step
    (tmp_path / recipe.RECORD_NAME).write_text(json.dumps(record))
    second = _step(calls, "second", tmp_path / "second.txt")

    recipe.run_steps(str(tmp_path), [first, second])
    recipe.run_steps(str(tmp_path), [first, second])

    assert calls == ["first", "first", "second"]


def test_a_step_made_otherwise_is_refused_before_anything_runs(tmp_path):
    calls: list[str] = []
    recipe.run_steps(str(tmp_path), [_step(calls, "model", tmp_path / "model.pt", minutes=5)])

    with pytest.raises(ValueError) as refused:
        recipe.run_steps(
            str(tmp_path),
            [
                _step(calls, "data", tmp_path / "data.txt"),  # would run: refused first
                _step(calls, "model", tmp_path / "model.pt", minutes=6),
            ],
        )

    assert str(refused.value) == (
        f"{tmp_path}: model was made with other settings (minutes: 5 then, 6 now): "
        "use another --out"
    )
    assert calls == ["model"]


def test_a_step_refused_before_its_output_binds_nothing(tmp_path):
    def refused() -> None:
        raise recipe.StepFailed("nmt-train exited with 1")  # e.g. a mistyped flag

    with pytest.raises(recipe.StepFailed):
        recipe.run_steps(
            str(tmp_path),
            [recipe.Step("model", {"flags": ["--bad"]}, [str(tmp_path / "m")], refused)],
        )
    calls: list[str] = []
    recipe.run_steps(str(tmp_path), [_step(calls, "model", tmp_path / "m", flags=["--good"])])

    assert calls == ["model"]


def test_an_output_made_before_the_record_is_taken_as_it_is(tmp_path):
    (tmp_path / "data").mkdir()  # an older recipe's dataset, or one linked in from another --out
    (tmp_path / "data" / "manifest.json").write_text("{}")
    calls: list[str] = []

    recipe.run_steps(str(tmp_path), [_step(calls, "data", tmp_path / "data" / "manifest.json")])

    assert calls == []
    with pytest.raises(ValueError, match="data was made with other settings"):
        recipe.run_steps(
            str(tmp_path), [_step(calls, "data", tmp_path / "data" / "manifest.json", corpus="x")]
        )


@pytest.mark.parametrize(
    "minutes, max_update, given, count",
    [(12, 0, None, 1), (20, 0, None, 5), (0, 2999, None, 1), (0, 3000, None, 5), (5, 0, 3, 3)],
)
def test_the_averaging_rule(minutes, max_update, given, count):
    assert recipe.average_last(minutes=minutes, max_update=max_update, given=given) == count


# --- the recipes, for real


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """The first 300 training pairs of Multi30k (4 languages), 20 of val and test, and 200 of the
    first caption file, under a directory whose name holds a space."""
    base = tmp_path_factory.mktemp("corpus") / "multi 30k"
    for source, lines in [("multi30k", {"train": 300, "val": 20, "test_2016_flickr": 20})]:
        (base / "text").mkdir(parents=True)
        for split, count in lines.items():
            for lang in ("en", "de", "fr", "cs"):
                _head(ROOT / "data" / source / f"{split}.{lang}.gz", base / "text", count)
    (base / "captions").mkdir()
    for lang in ("en", "de"):
        _head(ROOT / "data" / "multi30k-captions" / f"train.1.{lang}.gz", base / "captions", 200)
    return base


def _head(path: pathlib.Path, directory: pathlib.Path, count: int) -> None:
    with gzip.open(path, "rt", encoding="utf-8") as source:
        lines = [next(source) for _ in range(count)]
    with gzip.open(directory / path.name, "wt", encoding="utf-8") as target:
        target.writelines(lines)


def _run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples" / script / "run.py"), *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def _updates(checkpoint: pathlib.Path) -> int:
    return recipe.num_updates(str(checkpoint))


@pytest.mark.slow
def test_multi30k_recipe_trains_scores_and_resumes_after_kill_9(tmp_path, corpus):
    out = tmp_path / "my runs" / "multi30k"
    args = [
        *("examples/multi30k/run.py", "--max-update", "6", "--out", str(out)),
        *("--corpus", str(corpus / "text"), "--", *TINY_MODEL, "--save-interval-updates", "1"),
    ]
    # Killed at its first checkpoint, as a machine that went down.
    process = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while not (out / "ckpt" / "checkpoint_last.pt").exists() and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _updates(out / "ckpt" / "checkpoint_last.pt") < 6
    saved = {path: path.stat().st_mtime_ns for path in (out / "ckpt").glob("checkpoint_*_*.pt")}
    assert saved

    result = _run("multi30k", *args[1:])

    assert _updates(out / "ckpt" / "checkpoint_last.pt") == 6
    # Continued, not started over: the updates saved before the kill were not made again.
    assert {path: path.stat().st_mtime_ns for path in saved} == saved
    assert len((out / "test.hyp.de").read_text().splitlines()) == 20
    # The recipe's scores are values computed from the hypotheses: the ones nmt-eval printed.
    figures = json.loads((out / "results.json").read_text())["figures"]
    assert f"BLEU = {figures['bleu']:.2f} " in result.stdout
    assert f"chrF2 = {figures['chrf']:.2f}\n" in result.stdout
    assert figures["updates"] == 6
    again = _run("multi30k", *args[1:])  # a finished run is only evaluated
    assert _updates(out / "ckpt" / "checkpoint_last.pt") == 6
    assert f"test2016 after 6 updates: BLEU {figures['bleu']:.2f}, " in again.stdout


def _multilingual_recipe():
    """examples/multi30k-multilingual/run.py as a module (its directory is not a package)."""
    path = ROOT / "examples" / "multi30k-multilingual" / "run.py"
    spec = importlib.util.spec_from_file_location("multilingual_recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multilingual_selection_takes_the_highest_mean_and_the_first_of_a_tie():
    choose = _multilingual_recipe().choose

    def scores(*bleu: float) -> dict:
        return {pair: {"bleu": value} for pair, value in zip(("en-de", "de-en"), bleu)}

    assert choose({"a": scores(30, 10), "b": scores(9, 32), "c": scores(25, 14)}) == "b"
    assert choose({"a": scores(20, 10), "b": scores(10, 20), "c": scores(0, 29)}) == "a"


@pytest.mark.slow
def test_multilingual_recipe_selects_on_val_scores_alike_and_reruns_only_evaluating(
    tmp_path, corpus
):
    out = tmp_path / "out"
    pairs = ["en-de", "de-en", "en-fr", "fr-en", "en-cs", "cs-en"]
    common = [
        *("--out", str(out), "--corpus", str(corpus / "text"), "--beam", "1"),
        *("--average-last", "2", "--", "--save-interval-updates", "1", *TINY_MODEL),
    ]

    _run("multi30k-multilingual", "--max-update", "12", *common)

    results = json.loads((out / "results.json").read_text())
    figures = results["figures"]
    selection = figures["selection"]
    assert list(selection) == ["encoder-tag", "decoder-tag", "en-x-upsampled"]
    means = {name: sum(s["bleu"] for s in found.values()) / 6 for name, found in selection.items()}
    assert all(sorted(found) == sorted(pairs) for found in selection.values())
    assert figures["chosen"] == next(name for name in means if means[name] == max(means.values()))
    chosen = figures["chosen"]
    assert figures["valid"]["multi"] == selection[chosen]
    # Equal compute (U and U/6 updates) and one checkpoint rule: each model's 2 newest, averaged.
    assert figures["updates"] == {
        "multi": {name: 12 for name in selection},
        "bilingual": {pair: 2 for pair in pairs},
    }
    for system, models in figures["checkpoints"].items():
        for model, files in models.items():
            ckpt = out / ("multi/" + model if system == "multi" else model) / "ckpt"
            reached = figures["updates"][system][model]
            assert [_updates(ckpt / name) for name in files] == [reached, reached - 1], model
    # Every file scored is named, with a line per sentence; only the chosen candidate saw test.
    hypotheses = results["hypotheses"]
    for split in ("valid", "test"):
        for pair in pairs:
            assert {
                f"{split}.{system}.{pair}" for system in ("multi", "bilingual", "reference")
            } <= set(hypotheses)
    assert {f"valid.{name}.{pair}" for name in selection for pair in pairs} <= set(hypotheses)
    assert {"test.multi.de-fr", "test.reference.de-fr"} <= set(hypotheses)
    assert hypotheses["valid.multi.en-de"] == hypotheses[f"valid.{chosen}.en-de"]
    assert not [name for name in hypotheses if name.startswith(f"test.{chosen}.")]
    tested = {path.name.split(".")[1] for path in (out / "hypotheses").glob("test.*")}
    assert tested == {chosen, "bilingual"}
    for name, path in hypotheses.items():
        assert len((out / path).read_text().splitlines()) == 20, name
    # The scores are those of the named files: the same references for both systems.
    references = (out / hypotheses["test.reference.en-cs"]).read_text().splitlines()
    for system in ("multi", "bilingual"):
        found = recipe.scores(str(out / hypotheses[f"test.{system}.en-cs"]), references)
        assert found["bleu"] == figures["test"][system]["en-cs"]["bleu"]
    rows = {(row[0], row[1]): row for row in figures["table"]["rows"]}
    assert sorted(rows) == sorted(
        [*(("val", name) for name in selection if name != chosen), ("val", f"{chosen} (chosen)")]
        + [("val", "bilingual"), ("test", f"multilingual ({chosen})"), ("test", "bilingual")]
    )
    assert rows["val", f"{chosen} (chosen)"][-2] == f"{means[chosen]:.2f}"
    assert rows["test", "bilingual"][2:4] == [
        f"{figures['test']['bilingual'][pair]['bleu']:.2f}" for pair in ("en-de", "de-en")
    ]
    assert "| de-fr (zero-shot) | " in (out / "table.md").read_text()

    # A rerun trains nothing and decodes nothing again: it scores the same files alike.
    made = {path: path.stat().st_mtime_ns for path in out.glob("**/checkpoint*.pt")}
    made.update({path: path.stat().st_mtime_ns for path in out.glob("hypotheses/*.??")})
    _run("multi30k-multilingual", "--max-update", "12", *common)
    assert {path: path.stat().st_mtime_ns for path in made} == made
    assert json.loads((out / "results.json").read_text())["figures"] == figures

    refused = _run("multi30k-multilingual", "--max-update", "18", *common, check=False)

    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"examples/multi30k-multilingual/run.py: error: {out}: the encoder-tag model was made "
        "with other settings (--max-update: 12 then, 18 now): use another --out"
    ]
    assert {path: path.stat().st_mtime_ns for path in made} == made


@pytest.mark.parametrize("minutes", ["abc", "0", "-5", "nan", "inf"])
def test_recipes_refuse_a_bad_budget_before_anything_runs(tmp_path, minutes):
    for script in ("multi30k", "multi30k-multilingual", "multi30k-bt"):
        out = tmp_path / script
        result = _run(script, "--minutes", minutes, "--out", str(out), check=False)
        assert result.returncode == 2
        assert f"--minutes: must be a positive number, not '{minutes}'" in result.stderr
        assert not out.exists()


def test_multilingual_recipe_refuses_an_update_budget_without_a_sixth_for_each_bilingual_model(
    tmp_path,
):
    out = tmp_path / "out"
    result = _run("multi30k-multilingual", "--max-update", "5", "--out", str(out), check=False)

    assert result.returncode == 2
    assert "--max-update: must be a whole number of at least 6, not '5'" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--reverse-bt", "no model.pt"], "--reverse-bt no model.pt: no such checkpoint file"),
        (["--forward-translate", "no.pt"], "--forward-translate no.pt: no such checkpoint file"),
        (
            ["--side-by-side", "--filter", "0.8"],
            "--side-by-side trains the baseline beside the final model, but --filter needs the "
            "baseline first",
        ),
    ],
)
def test_bt_recipe_refuses_impossible_options_in_one_line_before_anything_runs(
    tmp_path, args, message
):
    result = _run("multi30k-bt", "--out", str(tmp_path / "out"), *args, check=False)

    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"examples/multi30k-bt/run.py: error: {message}"]
    assert not (tmp_path / "out").exists()


def _bt(
    out: pathlib.Path,
    corpus: pathlib.Path,
    *args: str,
    train_flags: tuple[str, ...] = (),
    check: bool = True,
) -> subprocess.CompletedProcess:
    tiny = ["--max-update", "2", *TINY_MODEL]
    return _run(
        "multi30k-bt",
        *("--minutes", "3", "--out", str(out), "--corpus", str(corpus / "text")),
        *("--captions-dir", str(corpus / "captions"), "--bt", "beam"),
        *("--reverse-flags", " ".join(tiny), *args, "--", *tiny, *train_flags),
        check=check,
    )


@pytest.fixture(scope="module")
def bt_run(corpus, tmp_path_factory) -> pathlib.Path:
    """A back-translation run without the tag, with its baseline, back-translating with the
    exported de->en model: the en->de model.pt it leaves teaches the iterative and forward runs."""
    out = tmp_path_factory.mktemp("bt") / "first run"
    _bt(out, corpus, "--baseline", "--no-tag", "--ct2")
    return out


@pytest.mark.slow
def test_bt_recipe_without_the_tag_scores_both_models(bt_run):
    rows = [line.split("\t") for line in (bt_run / "scores.tsv").read_text().splitlines()]
    assert [row[0] for row in rows] == ["baseline", "bt-beam-c1-ct2-w0.5"]
    assert all(row[2] == "2" for row in rows)  # updates
    assert (bt_run / "model.pt").is_file()
    results = json.loads((bt_run / "results.json").read_text())
    assert results["figures"]["baseline"]["bleu"] == float(rows[0][3])
    # every model on val (where variants are chosen) and test (reported), with the references
    assert results["hypotheses"] == {
        f"{split}.{name}": f"{name}.{split}.de"
        for split in ("valid", "test")
        for name in ("baseline", rows[1][0], "reference")
    }
    synthetic = (bt_run / "bt-beam-c1-ct2" / "manifest.json").read_text()
    assert "<bt>" not in synthetic  # tagged: its manifest names the source tag (test below)


@pytest.mark.slow
def test_bt_recipe_iterative_and_forward_translation_without_ct2(bt_run, corpus, tmp_path):
    teacher = tmp_path / "en-de model.pt"
    teacher.write_bytes((bt_run / "model.pt").read_bytes())
    out = tmp_path / "second run"

    _bt(out, corpus, "--reverse-bt", str(teacher), "--forward-translate", str(teacher))

    for dataset in ("en-bt-beam-tagged-c1", "bt-beam-tagged-c1-ibt", "ft-c1"):
        assert (out / dataset / "manifest.json").is_file(), dataset
    assert '"source_tag": "<bt>"' in (out / "bt-beam-tagged-c1-ibt" / "manifest.json").read_text()
    assert _updates(out / "de-en-ibt" / "checkpoint_last.pt") == 2
    (row,) = (out / "scores.tsv").read_text().splitlines()
    assert row.startswith("bt-beam-tagged-c1-ibt-ft-w0.5\t3\t2\t")

    other = tmp_path / "other model.pt"
    other.write_bytes((bt_run / "baseline" / "checkpoint_last.pt").read_bytes())
    refused = _bt(
        out, corpus, "--reverse-bt", str(other), "--forward-translate", str(teacher), check=False
    )
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(
        f"examples/multi30k-bt/run.py: error: {out}: the dataset en-bt-beam-tagged-c1 "
    )
    assert "(--reverse-bt sha256: " in line and line.endswith(": use another --out")


@pytest.mark.slow
def test_bt_recipe_refuses_other_flags_over_trained_models(bt_run, corpus):
    refused = _bt(
        bt_run,
        corpus,
        "--baseline",
        "--no-tag",
        "--ct2",
        train_flags=("--dropout", "0.3"),
        check=False,
    )

    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert "the model baseline was made with other settings (flags after --: " in line
