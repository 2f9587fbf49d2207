"""Every figure README.md and the example READMEs publish between markers is what its results file
(results/*.json) gives, and none is typed into their prose without one: scripts/published.py
--check, and that a changed or unbacked figure fails it; --publish."""

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from nmt.results import read_results, write_results

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "published.py"
_spec = importlib.util.spec_from_file_location("published", SCRIPT)
published = importlib.util.module_from_spec(_spec)
sys.modules["published"] = published  # dataclasses look their module up there
_spec.loader.exec_module(published)

TABLE = {"columns": ["layout", "tok/s", "vs padded"], "rows": [["packed", "4,062", "1.02x"]]}


def test_the_published_figures_equal_their_results_files():
    differences = published.regenerate(str(ROOT), write=False)
    assert not differences, "\n".join(map(str, differences)) + "\nrun: python scripts/published.py"


def test_the_readmes_type_no_figure_without_a_results_file():
    found = published.unbacked(str(ROOT))
    assert not found, "\n".join(map(str, found)) + "\npublish each from a results file or remove it"


def _repository(
    tmp_path: pathlib.Path, readme: str, figures: dict, hypotheses=None
) -> pathlib.Path:
    (tmp_path / "results").mkdir()
    write_results(
        str(tmp_path / "results" / "bench.json"),
        figures=figures,
        hypotheses=hypotheses,
        command=["benchmarks/bench.py", "--updates", "12"],
    )
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    return tmp_path


README = """# title

<!-- results:bench -->
<!-- /results:bench -->

Packed runs at <!-- figure:bench:ratio --><!-- /figure -->x padded, <!-- figure:bench:updates --><!-- /figure --> updates.
"""


def test_regenerate_fills_the_blocks_then_a_changed_figure_fails_the_check(tmp_path):
    root = _repository(tmp_path, README, {"table": TABLE, "ratio": 1.0234, "updates": 1432})
    assert [d.what for d in published.regenerate(str(root), write=True)] == [
        "figure:bench:ratio",
        "figure:bench:updates",
        "results:bench",
    ]
    text = (root / "README.md").read_text(encoding="utf-8")
    assert "| packed | 4,062 | 1.02x |" in text
    assert "x padded, <!-- figure:bench:updates -->1,432<!-- /figure --> updates" in text
    assert "<!-- figure:bench:ratio -->1.02<!-- /figure -->" in text
    assert "`benchmarks/bench.py --updates 12` (`results/bench.json`" in text
    assert published.regenerate(str(root), write=False) == []

    (root / "README.md").write_text(text.replace("4,062", "4,100"), encoding="utf-8")
    assert [str(d) for d in published.regenerate(str(root), write=False)] == [
        "README.md:3: results:bench differs from its results file"
    ]
    (root / "README.md").write_text(text.replace("-->1.02<", "-->1.40<"), encoding="utf-8")
    line = text[: text.index("Packed runs")].count("\n") + 1
    assert [str(d) for d in published.regenerate(str(root), write=False)] == [
        f"README.md:{line}: figure:bench:ratio differs from its results file"
    ]


def test_a_re_measured_results_file_fails_the_check_until_regenerated(tmp_path):
    root = _repository(tmp_path, README, {"table": TABLE, "ratio": 1.02, "updates": 1432})
    published.regenerate(str(root), write=True)
    path = root / "results" / "bench.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    record["figures"]["updates"] = 1260
    path.write_text(json.dumps(record), encoding="utf-8")
    assert [d.what for d in published.regenerate(str(root), write=False)] == [
        "figure:bench:updates"
    ]
    published.regenerate(str(root), write=True)
    assert "1,260<!-- /figure --> updates" in (root / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "readme, message",
    [
        (
            "a\n<!-- results:gone -->\n<!-- /results:gone -->\n",
            "README.md:2: results/gone.json: no such results file",
        ),
        (
            "a\n\n<!-- results:bench -->\n",
            "README.md:3: <!-- results:bench --> has no <!-- /results:bench -->",
        ),
        (
            "<!-- figure:bench:nothing --><!-- /figure -->",
            "README.md:1: .*bench.json: no figure 'nothing'",
        ),
    ],
)
def test_a_bad_marker_is_one_line_naming_the_file_and_line(tmp_path, readme, message):
    root = _repository(tmp_path, readme, {"table": TABLE})
    with pytest.raises(ValueError, match=message):
        published.regenerate(str(root), write=False)


def test_the_command_exits_1_naming_the_block_and_0_once_regenerated(tmp_path):
    root = _repository(tmp_path, README, {"table": TABLE, "ratio": 1.02, "updates": 1432})

    def run(*args):
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--root", str(root), *args],
            capture_output=True,
            text=True,
        )

    check = run("--check")
    assert check.returncode == 1
    assert "README.md:3: results:bench differs from its results file" in check.stdout
    assert run().returncode == 0
    assert run("--check").returncode == 0


def test_a_comparative_claim_carries_the_paired_bootstrap_p_value_of_its_hypotheses(tmp_path):
    reference = [f"ein Hund läuft über die Wiese Nummer {i} ." for i in range(60)]
    # The system gets every sentence right; the baseline loses words in most of them.
    system = list(reference)
    baseline = [
        line if i % 5 == 0 else " ".join(line.split()[::2]) for i, line in enumerate(reference)
    ]
    near = [
        line if i != 3 else "ein Hund" for i, line in enumerate(reference)
    ]  # one sentence worse
    files = {}
    for name, lines in (
        ("reference", reference),
        ("baseline", baseline),
        ("system", system),
        ("near", near),
    ):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    readme = (
        "wins (p = <!-- figure:bench:bootstrap-bleu:baseline:system --><!-- /figure -->), "
        "tie (p = <!-- figure:bench:bootstrap-bleu:near:system --><!-- /figure -->), "
        "itself (p = <!-- figure:bench:bootstrap-bleu:system:system --><!-- /figure -->)\n"
    )
    root = _repository(tmp_path, readme, {}, hypotheses={k: str(v) for k, v in files.items()})
    published.regenerate(str(root), write=True)
    text = (root / "README.md").read_text(encoding="utf-8")
    assert (
        "wins (p = <!-- figure:bench:bootstrap-bleu:baseline:system -->0.001<!-- /figure -->)"
        in text
    )
    tie = re.search(r"bootstrap-bleu:near:system -->(0\.\d{3})<", text)
    assert tie and float(tie[1]) > 0.05, text
    # the same outputs differ by nothing (sacreBLEU alone would give them its smallest p-value)
    assert "bootstrap-bleu:system:system -->1.000<" in text, text


def test_each_direction_is_bootstrapped_against_its_own_reference(tmp_path):
    de = [f"ein Hund läuft über die Wiese Nummer {i} ." for i in range(60)]
    fr = [f"un chien court dans le pré numéro {i} ." for i in range(60)]
    files = {
        "ref-de": de,
        "ref-fr": fr,
        "bilingual-de": [" ".join(line.split()[::2]) for line in de],
        "multilingual-de": de,
        "bilingual-fr": fr,
        "multilingual-fr": [line if i != 3 else "un chien" for i, line in enumerate(fr)],
    }
    for name, lines in files.items():
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    hypotheses = {name: str(tmp_path / f"{name}.txt") for name in files}
    readme = "".join(
        f"{lang}: p = <!-- figure:bench:bootstrap-bleu:bilingual-{lang}:multilingual-{lang}"
        f":ref-{lang} --><!-- /figure -->\n"
        for lang in ("de", "fr")
    )
    root = _repository(tmp_path, readme, {}, hypotheses)
    published.regenerate(str(root), write=True)
    text = (root / "README.md").read_text(encoding="utf-8")
    p_values = re.findall(r"-->(\d\.\d{3})<", text)
    # de: the multilingual system is its reference, the bilingual one lost half the words; fr: the
    # two differ in one sentence, a tie against ref-fr (and not against ref-de, on which both fail).
    assert p_values[0] == "0.001" and float(p_values[1]) > 0.05, text

    for key, message in (
        ("bootstrap-bleu:bilingual-de:multilingual-de", r"no hypotheses named 'reference'"),
        ("bootstrap-bleu:a:b:c:d", r"bootstrap-METRIC:BASELINE:SYSTEM\[:REFERENCE\] expected"),
    ):
        (root / "README.md").write_text(f"<!-- figure:bench:{key} --><!-- /figure -->\n")
        with pytest.raises(ValueError, match=f"README.md:1: .*{message}"):
            published.regenerate(str(root), write=False)


def test_hypotheses_of_another_length_than_the_reference_are_named(tmp_path):
    for name, count in (("reference", 3), ("baseline", 3), ("system", 2)):
        (tmp_path / f"{name}.txt").write_text("ein Hund\n" * count, encoding="utf-8")
    hypotheses = {
        name: str(tmp_path / f"{name}.txt") for name in ("reference", "baseline", "system")
    }
    root = _repository(
        tmp_path,
        "<!-- figure:bench:bootstrap-bleu:baseline:system --><!-- /figure -->",
        {},
        hypotheses,
    )
    with pytest.raises(
        ValueError, match=r"README.md:1: .*system.txt: 2 lines, the reference has 3"
    ):
        published.regenerate(str(root), write=False)


@pytest.mark.parametrize(
    "prose, figure",
    [
        ("the main job scored 33.47 on test", "33.47"),
        ("decoding is 2.4x fairseq's", "2.4x"),
        ("threads gave 1.27-1.73x the processes", "1.27-1.73x"),
        ("a 2x speed-up", "2x"),
        ("off-target rate 0.01% of lines", "0.01%"),
        ("95% identical", "95%"),
        ("+3.03 to +3.35 into English", "+3.03 to +3.35"),
        ("trained for 14 minutes", "14 minutes"),
        ("after 1,432 updates it stopped", "1,432 updates"),
        ("peak RSS 496 MiB on 2 cores", "496 MiB"),
        ("it decodes 194 sent/s", "194 sent/s"),
        ("a step takes 29 ms", "29 ms"),
        ("the model gets BLEU 31 there", "BLEU 31"),
        ("chrF2 = 55 on val", "chrF2 = 55"),
        ("a gain of 3 BLEU", "3 BLEU"),
        ("p = 0.054 for en-cs", "0.054"),
        ("defaults to dropout 0.1", "0.1"),
        ("a figure cut by the line: 12\nminutes of training", "12 minutes"),
        ("| model | updates |\n| --- | ---: |\n| baseline | **10,300** |", "10,300"),
        ("a stray ` backtick\n\nthen 2.4x, and a `span` after", "2.4x"),
    ],
)
def test_a_figure_typed_into_prose_is_unbacked(prose, figure):
    text = f"# title\n\nSome text.\n{prose}\n"
    line = 4 + prose[: prose.index(figure.split()[0])].count("\n")
    assert [str(hit) for hit in published.find_unbacked("README.md", text)] == [
        f'README.md:{line}: unbacked figure "{figure}"'
    ]


@pytest.mark.parametrize(
    "text",
    [
        "the main job scored `33.47` on test",
        "```bash\n# 2.4x fairseq, 14 minutes\nnmt-train --dropout 0.1\n```",
        "~~~\n1.5x\n~~~",
        "``a `1.5x` span``",
        "<!-- 33.47 before the speed-ups,\n2.4x fairseq -->",
        "<!-- results:bench -->\n| a | 1.02x | 10,300 |\n\n14 minutes\n<!-- /results:bench -->",
        "BLEU <!-- figure:bench:bleu -->33.47<!-- /figure --> after "
        "<!-- figure:bench:updates -->1,432<!-- /figure --> updates",
        "[the paper](https://arxiv.org/abs/1706.03762) and https://example.org/v1.5/x",
        "torch 2.13.0, fairseq 0.12.2, sacreBLEU 2.4.0, 127.0.0.1, Python >= 3.10, torch 2.11",
        "measured 2026-11-28 at 08:20 UTC for issue 49 (#2410), tests/test_readme.py line 12",
        "transformer_tiny: 3+3 layers x 128, FFN 512, 4 heads, 10M pairs, 4,096 tokens, fp32",
        "cased BLEU and chrF2 with their signatures; 6 directions, 2 ranks x 2 threads",
        "`--warmup-updates 4000` (every `--save-interval-updates 500`)",
    ],
)
def test_code_comments_generated_text_versions_and_counts_are_not_figures(text):
    assert published.find_unbacked("README.md", text) == []


def test_the_command_names_each_unbacked_figure_and_exits_1(tmp_path):
    readme = "# a\n\n```\n1.5x\n```\nIt runs 1.5x faster in\n14 minutes, `2x` in code.\n"
    root = _repository(tmp_path, readme, {"table": TABLE})
    for args in ([], ["--check"]):
        run = subprocess.run(
            [sys.executable, str(SCRIPT), "--root", str(root), *args],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 1
        assert run.stdout.splitlines() == [
            'README.md:6: unbacked figure "1.5x"',
            'README.md:7: unbacked figure "14 minutes"',
        ]
        assert "publish each figure from a results file" in run.stderr


def test_every_results_file_is_readable_and_used(tmp_path):
    """A results file no README publishes is a figure nobody sees, or a stale one left behind."""
    used = set()
    for file in published.published_files(str(ROOT)):
        text = (ROOT / file).read_text(encoding="utf-8")
        used |= {m["name"] for m in published.BLOCK.finditer(text)}
        used |= {m["name"] for m in published.FIGURE.finditer(text)}
    names = {p.stem for p in (ROOT / "results").glob("*.json")}
    assert names <= used, f"results files published nowhere: {sorted(names - used)}"
    assert os.path.isdir(ROOT / "results")


def _run(tmp_path: pathlib.Path, hypotheses: dict[str, list[str]], bleu: float) -> pathlib.Path:
    """A recipe's output directory: OUT/results.json naming hypotheses in OUT/test/."""
    out = tmp_path / "run"
    (out / "test").mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, lines in hypotheses.items():
        paths[name] = out / "test" / f"{name}.de"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_results(
        str(out / "results.json"),
        figures={"bleu": bleu},
        hypotheses={name: str(path) for name, path in paths.items()},
        command=["examples/multi30k/run.py", "--minutes", "12"],
    )
    return out / "results.json"


def test_publish_copies_the_results_file_and_its_hypotheses_into_results(tmp_path):
    reference = [f"ein Hund Nummer {i} ." for i in range(40)]
    worse = [" ".join(line.split()[:2]) for line in reference]
    source = _run(tmp_path, {"reference": reference, "base": worse, "system": reference}, 33.5)
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    published.publish(str(root), str(source), "multi30k")

    original = json.loads(source.read_text(encoding="utf-8"))
    copy = json.loads((root / "results" / "multi30k.json").read_text(encoding="utf-8"))
    assert copy["hypotheses"] == {
        name: f"multi30k/{name}.txt" for name in ("reference", "base", "system")
    }
    assert {k: v for k, v in copy.items() if k != "hypotheses"} == {
        k: v for k, v in original.items() if k != "hypotheses"
    }
    assert (root / "results" / "multi30k" / "system.txt").read_bytes() == (
        source.parent / "test" / "system.de"
    ).read_bytes()

    # The run's directory can go: the published figures come from results/ alone.
    shutil.rmtree(source.parent)
    (root / "README.md").write_text(
        "BLEU <!-- figure:multi30k:bleu --><!-- /figure --> "
        "(p = <!-- figure:multi30k:bootstrap-bleu:base:system --><!-- /figure -->)\n",
        encoding="utf-8",
    )
    published.regenerate(str(root), write=True)
    assert "-->33.50<" in (root / "README.md").read_text(encoding="utf-8")
    assert "-->0.001<" in (root / "README.md").read_text(encoding="utf-8")


def test_publish_replaces_a_publication_only_with_force(tmp_path):
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    first = _run(tmp_path / "first", {"reference": ["a"], "old": ["b"]}, 30.0)
    published.publish(str(root), str(first), "bt")
    before = (root / "results" / "bt.json").read_bytes()

    second = _run(tmp_path / "second", {"reference": ["a"], "new": ["c"]}, 31.0)
    with pytest.raises(ValueError, match=r"^results/bt.json: already published \(--force"):
        published.publish(str(root), str(second), "bt")
    assert (root / "results" / "bt.json").read_bytes() == before

    published.publish(str(root), str(second), "bt", force=True)
    assert read_results(str(root / "results" / "bt.json")).figures == {"bleu": 31.0}
    # The first run's hypotheses that the second does not name are not left behind.
    assert sorted(os.listdir(root / "results" / "bt")) == ["new.txt", "reference.txt"]


def test_publish_refuses_in_one_line_and_writes_nothing(tmp_path):
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    source = _run(tmp_path, {"reference": ["a"], "system": ["b"]}, 30.0)
    (source.parent / "test" / "system.de").unlink()

    def run(*args):
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--root", str(root), *args],
            capture_output=True,
            text=True,
        )

    for args, message in (
        (["--publish", str(source), "m"], r"published.py: error: .*system.de: no such file"),
        (["--publish", str(source), "../m"], r"published.py: error: --publish NAME '../m'"),
        (
            ["--publish", str(tmp_path / "none.json"), "m"],
            r"published.py: error: .*none.json: No such",
        ),
    ):
        result = run(*args)
        assert result.returncode == 1
        assert len(result.stderr.splitlines()) == 1 and re.match(message, result.stderr)
    assert os.listdir(root / "results") == []

    (source.parent / "test" / "system.de").write_text("b\n", encoding="utf-8")
    result = run("--publish", str(source), "m")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"results/m.json: published from {source}")
