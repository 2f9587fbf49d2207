"""The results files of the back-translation and GPU recipes (examples/multi30k-{bt,gpu}/run.py),
run for real at tiny scale: every figure is the score of a hypothesis file the results file names,
against references it names too, so scripts/published.py can regenerate figures and p-values."""

import gzip
import importlib.util
import pathlib
import subprocess
import sys

import pytest
import sacrebleu

from nmt.results import Results, read_results

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_MODEL = [
    *("--encoder-layers", "1", "--decoder-layers", "1"),
    *("--encoder-embed-dim", "32", "--decoder-embed-dim", "32"),
    *("--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"),
]
NUM_EVAL_LINES = 12


def _published():
    """scripts/published.py (a script), under the name tests/test_published_figures.py gives it."""
    if "published" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "published", ROOT / "scripts" / "published.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["published"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["published"]


def _head(path: pathlib.Path, directory: pathlib.Path, count: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as source:
        lines = [next(source) for _ in range(count)]
    with gzip.open(directory / path.name, "wt", encoding="utf-8") as target:
        target.writelines(lines)
    return [line.rstrip("\n") for line in lines]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """The first 200 training pairs of Multi30k en-de, a few of val and test, 100 captions."""
    base = tmp_path_factory.mktemp("corpus")
    (base / "text").mkdir()
    (base / "captions").mkdir()
    for lang in ("en", "de"):
        for split, count in (
            ("train", 200),
            ("val", NUM_EVAL_LINES),
            ("test_2016_flickr", NUM_EVAL_LINES),
        ):
            _head(ROOT / "data" / "multi30k" / f"{split}.{lang}.gz", base / "text", count)
        _head(ROOT / "data" / "multi30k-captions" / f"train.1.{lang}.gz", base / "captions", 100)
    return base


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples" / script / "run.py"), *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def bt_run(corpus, tmp_path_factory) -> pathlib.Path:
    """A back-translation run with its baseline: two en->de systems to compare."""
    out = tmp_path_factory.mktemp("bt") / "out"
    tiny = ["--max-update", "2", *TINY_MODEL]
    _run(
        "multi30k-bt",
        *("--minutes", "3", "--out", str(out), "--corpus", str(corpus / "text")),
        *("--captions-dir", str(corpus / "captions"), "--bt", "beam", "--baseline"),
        *("--reverse-flags", " ".join(tiny), "--", *tiny),
    )
    return out


def _lines(results: Results, name: str) -> list[str]:
    with open(results.hypothesis_path(name), encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


def _corpus_lines(corpus: pathlib.Path, name: str) -> list[str]:
    with gzip.open(corpus / "text" / name, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


@pytest.mark.slow
def test_bt_results_name_both_systems_on_val_and_test_and_their_references(
    bt_run, corpus, tmp_path
):
    results = read_results(str(bt_run / "results.json"))
    systems = ["baseline", "bt-beam-tagged-c1-w0.5"]
    assert list(results.figures) == systems
    assert set(results.hypotheses) == {
        f"{split}.{name}" for split in ("valid", "test") for name in [*systems, "reference"]
    }
    # The references are Multi30k's own German lines, written under OUT (so a copy of OUT is
    # enough to recompute everything).
    assert _lines(results, "test.reference") == _corpus_lines(corpus, "test_2016_flickr.de.gz")
    assert _lines(results, "valid.reference") == _corpus_lines(corpus, "val.de.gz")
    assert all(
        pathlib.Path(results.hypothesis_path(name)).parent == bt_run for name in results.hypotheses
    )
    for system in systems:
        for prefix, split in (("", "test"), ("valid_", "valid")):
            hypotheses = _lines(results, f"{split}.{system}")
            references = [_lines(results, f"{split}.reference")]
            assert len(hypotheses) == NUM_EVAL_LINES
            figures = results.figures[system]
            # sacreBLEU's own API on the named files gives the published figures.
            bleu = sacrebleu.corpus_bleu(hypotheses, references).score
            chrf = sacrebleu.corpus_chrf(hypotheses, references).score
            assert figures[f"{prefix}bleu"] == pytest.approx(bleu, abs=0.005)
            assert figures[f"{prefix}chrf"] == pytest.approx(chrf, abs=0.005)
        assert results.figures[system]["updates"] == 2
    # Publishable as it is (its names are file names), and what README's
    # `bootstrap-METRIC:BASELINE:SYSTEM:REFERENCE` marker computes, from the published copy alone.
    published = _published().publish(str(tmp_path), str(bt_run / "results.json"), "bt")
    names = [f"test.{system}" for system in systems]
    p_value = _published().paired_bootstrap_p(published, "chrf", *names, "test.reference")
    assert 0 < p_value <= 1


@pytest.mark.slow
def test_gpu_recipe_results_score_its_val_and_test_hypotheses(bt_run, corpus, tmp_path):
    out = tmp_path / "gpu"
    data = bt_run / "data"  # a tiny Multi30k en-de dataset with val and test
    result = _run(
        "multi30k-gpu",
        *("--data", str(data), "--out", str(out), "--device", "cpu", "--minutes", "3"),
        *("--", *TINY_MODEL, "--max-tokens", "256", "--max-update", "4"),
        "--save-interval-updates",
        "2",
    )

    results = read_results(str(out / "results.json"))
    assert results.command[0] == "examples/multi30k-gpu/run.py"
    assert results.command[1:3] == ["--data", str(data)]
    assert results.hypotheses == {"valid": "valid.hyp.de", "test": "test.hyp.de"}
    figures = results.figures
    assert figures["updates"] == 4
    assert figures["average_last"] == 2  # the 2 numbered checkpoints a 4-update run saved
    for prefix, split, reference in (("valid_", "valid", "val"), ("", "test", "test_2016_flickr")):
        hypotheses = _lines(results, split)
        references = [_corpus_lines(corpus, f"{reference}.de.gz")]
        assert len(hypotheses) == NUM_EVAL_LINES
        assert figures[f"{prefix}bleu"] == pytest.approx(
            sacrebleu.corpus_bleu(hypotheses, references).score, abs=1e-9
        )
        assert figures[f"{prefix}chrf"] == pytest.approx(
            sacrebleu.corpus_chrf(hypotheses, references).score, abs=1e-9
        )
    assert f"test2016 BLEU {figures['bleu']:.2f} " in result.stdout


def test_bt_scores_of_an_earlier_revision_are_refused_in_one_line(tmp_path):
    """A --out whose scores.tsv has rows without val scores (written before val was scored) cannot
    give a results file with val figures for every model: one line says so and where."""
    spec = importlib.util.spec_from_file_location(
        "multi30k_bt", ROOT / "examples" / "multi30k-bt" / "run.py"
    )
    assert spec is not None and spec.loader is not None
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    scores = tmp_path / "scores.tsv"
    scores.write_text(
        "baseline\t5\t1140\t30.98\t54.20\t31.50\t55.10\nbt-sample-w0.5\t5\t1320\t26.64\t49.91\n"
    )

    with pytest.raises(ValueError) as refused:
        bt.read_scores(str(scores))

    assert str(refused.value) == (
        f"{scores}:2: 5 columns, not 7 (scores of an earlier revision, without val): use another --out"
    )
    scores.write_text("baseline\t5\t1140\t30.98\t54.20\t31.50\t55.10\n")
    (row,) = bt.read_scores(str(scores))
    assert bt.score_figures(row) == {
        "minutes": 5.0,
        "updates": 1140,
        "bleu": 30.98,
        "chrf": 54.20,
        "valid_bleu": 31.50,
        "valid_chrf": 55.10,
    }
