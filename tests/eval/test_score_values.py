"""The values nmt prints are sacreBLEU's and langid's, checked number by number (issue 49).

BLEU, chrF2 and the lowercased 13a-tokenized BLEU of ``nmt.eval.score`` and of what ``nmt-eval``
prints equal sacreBLEU's own API (``sacrebleu.corpus_bleu``, ``sacrebleu.corpus_chrf``,
``BLEU(lowercase=True, tokenize="13a")``) on the hypotheses nmt-eval wrote, to the printed precision,
with the signatures written out here; the off-target rate is checked on outputs whose languages are
known (7 German, 2 English, 1 French: 30.00% off target for German), through the function and
through nmt-eval's single-direction line and its all-directions table.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU
from sacrebleu.metrics.bleu import BLEUScore
from sacrebleu.metrics.chrf import CHRFScore

from nmt.eval.language_id import detect, off_target_rate
from nmt.eval.score import TOKENIZED_LOWERCASE_LABEL, score
from nmt.eval.translate import Translator
from nmt_cli.eval import main as eval_main

from ..helpers import train_multilingual

VERSION = sacrebleu.__version__
# Written out rather than asked of sacreBLEU: a changed default (tokenizer, smoothing, chrF's
# n-gram orders) must fail here, not follow silently.
SIGNATURES = {
    "BLEU": f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{VERSION}",
    "chrF2": f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{VERSION}",
    TOKENIZED_LOWERCASE_LABEL: f"nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:{VERSION}",
}

# (hypotheses, references): each case where a wrong tokenizer, case or alignment changes a value.
CASES = {
    "unicode, quotes and dashes": (
        [
            "Der Hund läuft über die Straße.",
            "„Ça va“, dit-il — très bien !",
            "Ein Kind isst Äpfel.",
        ],
        [
            "Der Hund rennt über die Straße.",
            "« Ça va », dit-il — très bien !",
            "Ein Kind isst Äpfel.",
        ],
    ),
    "empty lines on either side": (
        ["ein Mann fährt Fahrrad .", "", "zwei Hunde spielen im Schnee", ""],
        ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau lacht."],
    ),
    "case only": (
        ["DER MANN TRÄGT EINEN ROTEN HUT UND GEHT NACH HAUSE ."],
        ["Der Mann trägt einen roten Hut und geht nach Hause."],
    ),
    "a single sentence": (
        ["Eine Gruppe von Menschen steht vor einem Gebäude"],
        ["Eine Gruppe Menschen steht vor einem großen Gebäude."],
    ),
    "identical": (
        ["Zwei Kinder spielen mit einem roten Ball.", "", "Ça — c'est « très » bien !"],
        ["Zwei Kinder spielen mit einem roten Ball.", "", "Ça — c'est « très » bien !"],
    ),
}

LANGUAGES = ["de", "en", "fr"]
# Clearly one language each (langid says so with confidence 1.0 among de/en/fr; checked below).
GERMAN = [
    "Der Hund läuft über die Straße und bellt laut.",
    "Eine Frau sitzt auf einer Bank im Park und liest ein Buch.",
    "Zwei Kinder spielen mit einem roten Ball auf der Wiese.",
    "Ein Mann mit einem blauen Hemd fährt Fahrrad.",
    "Die Katze schläft auf dem Sofa neben dem Fenster.",
    "Eine Gruppe von Menschen wartet an der Bushaltestelle.",
    "Das Mädchen trägt einen gelben Hut und lacht.",
]
ENGLISH = [
    "A man in a blue shirt is riding his bicycle down the street.",
    "Two children are playing with a red ball in the park.",
]
FRENCH = ["Une femme est assise sur un banc et lit un livre."]
# Ten outputs in an order that mixes them; off target: 3 of 10 for de, 8 for en, 9 for fr.
OUTPUTS = [*GERMAN[:3], ENGLISH[0], *GERMAN[3:5], FRENCH[0], *GERMAN[5:], ENGLISH[1]]
OFF_TARGET = {"de": 30.0, "en": 80.0, "fr": 90.0}


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> dict[str, object]:
    """The three scores from sacreBLEU's own API, keyed by the name nmt prints."""
    return {
        "BLEU": sacrebleu.corpus_bleu(hypotheses, [references]),
        "chrF2": sacrebleu.corpus_chrf(hypotheses, [references]),
        TOKENIZED_LOWERCASE_LABEL: BLEU(lowercase=True, tokenize="13a").corpus_score(
            hypotheses, [references]
        ),
    }


BLEU_LINE = re.compile(
    r"= (?P<score>\S+) (?P<p1>\S+)/(?P<p2>\S+)/(?P<p3>\S+)/(?P<p4>\S+) "
    r"\(BP = (?P<bp>\S+) ratio = (?P<ratio>\S+) hyp_len = (?P<hyp>\d+) ref_len = (?P<ref>\d+)\)$"
)


def assert_printed_as(summary: str, expected: object) -> None:
    """The summary's printed numbers are sacreBLEU's values at the printed precision."""
    if isinstance(expected, CHRFScore):
        assert summary.rsplit(" = ", 1)[1] == f"{expected.score:.2f}", summary
        return
    assert isinstance(expected, BLEUScore)
    match = BLEU_LINE.search(summary)
    assert match, summary
    printed = match.groupdict()
    ratio = expected.sys_len / expected.ref_len if expected.ref_len else 0.0
    assert printed == {
        "score": f"{expected.score:.2f}",
        **{f"p{n + 1}": f"{p:.1f}" for n, p in enumerate(expected.precisions)},
        "bp": f"{expected.bp:.3f}",
        "ratio": f"{ratio:.3f}",
        "hyp": str(expected.sys_len),
        "ref": str(expected.ref_len),
    }, summary


def printed_scores(text: str) -> dict[str, tuple[str, str]]:
    """nmt-eval's score lines: {name: (summary line, signature)}, a name being what precedes " = "."""
    lines = text.splitlines()
    found = {}
    for line, following in zip(lines, lines[1:]):
        if following.startswith("  signature: "):
            found[line.split(" = ", 1)[0]] = (line, following.removeprefix("  signature: "))
    return found


@pytest.mark.parametrize("case", CASES)
def test_score_equals_sacrebleus_api(case) -> None:
    hypotheses, references = CASES[case]
    expected = sacrebleu_scores(hypotheses, references)
    scores = score(hypotheses, references, tokenized_lowercase=True)
    assert [s.name for s in scores] == list(expected)
    for result in scores:
        assert result.score == expected[result.name].score, (case, result.name)
        assert result.signature == SIGNATURES[result.name]
        assert_printed_as(result.summary, expected[result.name])
        assert result.summary.startswith(f"{result.name} = ")
    if case == "identical":
        assert [s.score for s in scores] == pytest.approx([100.0, 100.0, 100.0])


def test_the_cases_tell_a_wrong_metric_apart() -> None:
    """Each metric option matters on some case, so a score computed otherwise fails above."""
    for wrong in (
        BLEU(lowercase=True, tokenize="intl"),
        BLEU(lowercase=True, tokenize="none"),
        BLEU(lowercase=False, tokenize="13a"),
    ):
        assert any(
            wrong.corpus_score(h, [r]).score
            != sacrebleu_scores(h, r)[TOKENIZED_LOWERCASE_LABEL].score
            for h, r in CASES.values()
        ), wrong


def run_eval(argv: list[str], capsys) -> str:
    code = eval_main([*argv, "--cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def written_lines(path) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def assert_nmt_eval_scores(out: str, hypotheses: list[str], references: list[str]) -> None:
    """nmt-eval's three printed scores and signatures are sacreBLEU's on the written hypotheses."""
    printed = printed_scores(out)
    expected = sacrebleu_scores(hypotheses, references)
    assert list(printed) == list(expected), out
    for name, (line, signature) in printed.items():
        assert_printed_as(line, expected[name])
        assert signature == SIGNATURES[name]


def test_nmt_eval_split_prints_sacrebleus_values(tiny, tmp_path, capsys) -> None:
    output = tmp_path / "hyp.de"
    out = run_eval(
        [tiny.data_dir, "--path", tiny.checkpoint, "--split", "test", "--beam", "2"]
        + ["--output", str(output), "--score-tokenized-lowercase"],
        capsys,
    )
    hypotheses = written_lines(output)
    assert len(hypotheses) == len(tiny.test_tgt)
    assert_nmt_eval_scores(out, hypotheses, tiny.test_tgt)


def _file_case(tiny, name: str) -> tuple[list[str], list[str]]:
    """(source lines, reference lines) for nmt-eval --input/--reference."""
    src, tgt = tiny.test_src, tiny.test_tgt
    if name == "empty lines, unicode, capitals":
        return [src[0], "", src[1], src[2], ""], [
            tgt[0].capitalize() + " „Straße“ — über",
            "",
            tgt[1].upper(),
            "",
            "Ein Satz, den nichts übersetzt.",
        ]
    assert name == "a single sentence"
    return [src[3]], [tgt[3].capitalize() + ", äöü."]


@pytest.mark.parametrize("name", ["empty lines, unicode, capitals", "a single sentence"])
def test_nmt_eval_input_file_prints_sacrebleus_values(tiny, tmp_path, capsys, name) -> None:
    sources, references = _file_case(tiny, name)
    source_path, reference_path, output = (tmp_path / n for n in ("in.en", "ref.de", "out.de"))
    source_path.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    reference_path.write_text("".join(line + "\n" for line in references), encoding="utf-8")
    out = run_eval(
        ["--path", tiny.checkpoint, "--input", str(source_path), "--reference", str(reference_path)]
        + ["--output", str(output), "--score-tokenized-lowercase"],
        capsys,
    )
    hypotheses = written_lines(output)
    assert len(hypotheses) == len(sources)
    assert all(hypothesis == "" for source, hypothesis in zip(sources, hypotheses) if not source)
    assert_nmt_eval_scores(out, hypotheses, references)


def test_nmt_eval_against_its_own_output_prints_100(tiny, tmp_path, capsys) -> None:
    source_path, first, second = (tmp_path / n for n in ("in.en", "first.de", "second.de"))
    source_path.write_text("".join(line + "\n" for line in tiny.test_src), encoding="utf-8")
    run_eval(
        ["--path", tiny.checkpoint, "--input", str(source_path), "--output", str(first)], capsys
    )
    out = run_eval(
        ["--path", tiny.checkpoint, "--input", str(source_path), "--reference", str(first)]
        + ["--output", str(second), "--score-tokenized-lowercase"],
        capsys,
    )
    hypotheses = written_lines(second)
    assert hypotheses == written_lines(first)
    assert_nmt_eval_scores(out, hypotheses, hypotheses)
    assert [line.split(" = ")[1].split()[0] for line, _ in printed_scores(out).values()] == [
        "100.00"
    ] * 3


def test_off_target_rate_of_known_languages() -> None:
    assert [lang for lang, _ in detect(OUTPUTS, languages=LANGUAGES)] == [
        "de" if text in GERMAN else "en" if text in ENGLISH else "fr" for text in OUTPUTS
    ]
    for target, rate in OFF_TARGET.items():
        assert off_target_rate(OUTPUTS, target, languages=LANGUAGES) == pytest.approx(rate)
    # Empty outputs have no language: not counted either way.
    assert off_target_rate(["", *OUTPUTS, " "], "de", languages=LANGUAGES) == pytest.approx(30.0)
    assert off_target_rate(["", ""], "de", languages=LANGUAGES) == 0.0


@pytest.fixture(scope="module")
def multilingual_checkpoint(multi_data, tmp_path_factory) -> str:
    """A multilingual model (en-de, de-en, en-fr, fr-en) after a few updates: its outputs are
    replaced by OUTPUTS below, so only its languages and directions matter."""
    save_dir = tmp_path_factory.mktemp("off-target")
    train_multilingual(multi_data, save_dir, "--lang-tok", "encoder", updates=2)
    return str(save_dir / "checkpoint_last.pt")


@pytest.fixture
def known_outputs(monkeypatch) -> None:
    """The model's best translation of sentence i (of each decode) becomes OUTPUTS[i % 10]."""
    detokenize = Translator.detokenize

    def replaced(self, found, *args, **kwargs):
        return [
            [dataclasses.replace(nbest[0], text=OUTPUTS[index % len(OUTPUTS)]), *nbest[1:]]
            for index, nbest in enumerate(detokenize(self, found, *args, **kwargs))
        ]

    monkeypatch.setattr(Translator, "detokenize", replaced)


def test_nmt_eval_off_target_line(multilingual_checkpoint, known_outputs, tmp_path, capsys):
    source_path, output = tmp_path / "in.en", tmp_path / "out.de"
    source_path.write_text("the dog runs\n" * len(OUTPUTS), encoding="utf-8")
    out = run_eval(
        ["--path", multilingual_checkpoint, "-s", "en", "-t", "de", "--off-target"]
        + ["--input", str(source_path), "--output", str(output), "--beam", "1"],
        capsys,
    )
    assert written_lines(output) == OUTPUTS
    assert out.splitlines() == ["off-target 30.00% (langid among de,en,fr)"]


def test_nmt_eval_direction_table_off_target(
    multi_data, multilingual_checkpoint, known_outputs, capsys
):
    out = run_eval([multi_data, "--path", multilingual_checkpoint, "--beam", "1"], capsys)
    rows = {
        cells[0]: cells[3]
        for line in out.splitlines()
        if len(cells := [cell.strip() for cell in line.strip("|").split("|")]) == 4
    }
    # 20 test lines per direction, two rounds of OUTPUTS each
    assert rows == {
        "direction": "off-target %",
        "---": "---:",
        "en-de": "30.00",
        "de-en": "80.00",
        "en-fr": "90.00",
        "fr-en": "80.00",
        "mean": "70.00",
    }
