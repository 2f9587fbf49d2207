"""Terminology end to end: a tiny corpus preprocessed, a few updates trained with
--term-annotation-rate 0.5 (its batches carry <term>), then a glossary applied with the PyTorch
checkpoint and with its CTranslate2 export, the annotated source reaching each decoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.data import plan as plan_module
from nmt.data.spm import EOS_ID, TERM_TAG
from nmt.eval import Translator

from ..helpers import TINY_MODEL_FLAGS, random_pairs, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, the source batches training read) of 4 updates with --term-annotation-rate 0.5."""
    from nmt_cli.preprocess import main as preprocess_main
    from nmt_cli.train import main as train_main

    root = tmp_path_factory.mktemp("terms")
    src, tgt = random_pairs(200, seed=5)
    prefix = write_corpus(str(root), "train", src, tgt)
    assert (
        preprocess_main(
            ["-s", "en", "-t", "de", "--trainpref", prefix, "--validpref", prefix]
            + ["--destdir", str(root / "data"), "--spm-vocab-size", "60", "--workers", "1"]
        )
        == 0
    )
    batches = []
    make = plan_module._BatchMaker.__call__

    def spy(self, indices):
        batch = make(self, indices)
        batches.append(batch["src_tokens"].clone())
        return batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module._BatchMaker, "__call__", spy)
        assert (
            train_main(
                [str(root / "data"), "--save-dir", str(root / "ck"), "--max-update", "4"]
                + [
                    "--max-tokens",
                    "512",
                    "--term-annotation-rate",
                    "0.5",
                    "--seed",
                    "3",
                    "--layout",
                    "padded",
                ]
                + [
                    "--no-epoch-checkpoints",
                    "--no-progress-bar",
                    "--device",
                    "cpu",
                    *TINY_MODEL_FLAGS,
                ]
            )
            == 0
        )
    return str(root / "ck" / "checkpoint_last.pt"), batches


def test_training_batches_carry_reference_terms(trained) -> None:
    checkpoint, batches = trained
    tag = Translator.from_checkpoint(checkpoint).src_spm.tags[TERM_TAG]
    assert batches
    with_tag = sum(int((batch == tag).any(dim=1).sum()) for batch in batches)
    rows = sum(batch.shape[0] for batch in batches)
    assert 0.3 < with_tag / rows < 0.7


def expected_source(translator: Translator, sentence: str, term: str) -> list[int]:
    spm = translator.src_spm
    return spm.encode([sentence])[0] + [spm.tags[TERM_TAG], *spm.encode([term])[0], EOS_ID]


def spy_on_pytorch_search(translator: Translator, monkeypatch) -> list[list[int]]:
    """The source ids each batch brings to the PyTorch search, filled as it runs."""
    reached: list[list[int]] = []
    searcher = translator.backend.searcher

    def spying_searcher(cfg, **options):
        search = searcher(cfg, **options)

        def spy(batch, *args):
            reached.extend(source.tolist() for source in batch)
            return search(batch, *args)

        return spy

    monkeypatch.setattr(translator.backend, "searcher", spying_searcher)
    return reached


def spy_on_ctranslate2_search(translator: Translator, monkeypatch) -> list[list[str]]:
    """The source pieces each batch brings to CTranslate2's translate_batch, filled as it runs."""
    reached: list[list[str]] = []
    search = translator.backend._search

    def spy(tokens, *args, **kwargs):
        reached.extend(tokens)
        return search(tokens, *args, **kwargs)

    monkeypatch.setattr(translator.backend, "_search", spy)
    return reached


def test_a_glossary_reaches_the_pytorch_model_annotated(trained, monkeypatch) -> None:
    translator = Translator.from_checkpoint(trained[0])
    reached = spy_on_pytorch_search(translator, monkeypatch)
    tag = translator.src_spm.tags[TERM_TAG]
    translator.translate(["a red dog", "the cat"])
    assert reached and not any(tag in source for source in reached)
    reached.clear()
    translator.translate(["a red dog", "the cat"], glossary={"dog": "hund"})
    plain_source = translator.src_spm.encode(["the cat"])[0] + [EOS_ID]
    assert sorted(reached) == sorted(
        [expected_source(translator, "a red dog", "hund"), plain_source]
    )
    # hard constraints: the term is in the output whatever the model learnt
    output = translator.translate("a red dog", glossary={"dog": "katzekatze"}, glossary_mode="both")
    assert "katzekatze" in output


@pytest.fixture(scope="module")
def ct2_export(trained, tmp_path_factory) -> str:
    """The annotated model exported to CTranslate2 once, for every test that decodes it there."""
    pytest.importorskip("ctranslate2")
    from nmt.deploy.ct2 import export_ctranslate2

    directory = str(tmp_path_factory.mktemp("ct2") / "export")
    export_ctranslate2([trained[0]], directory)
    return directory


def test_a_glossary_reaches_the_ctranslate2_export_annotated(ct2_export, monkeypatch) -> None:
    translator = Translator.from_checkpoint(ct2_export)
    reached = spy_on_ctranslate2_search(translator, monkeypatch)
    translator.translate("a red dog", glossary={"dog": "hund"})
    pieces = translator.src_spm.processor.id_to_piece
    annotated = [pieces(i) for i in expected_source(translator, "a red dog", "hund")[:-1]]
    # (a sentence that runs to its length limit is searched again: the same tokens)
    assert reached and all(tokens == annotated for tokens in reached)
    with pytest.raises(ValueError, match="CTranslate2 export, which has no lexical constraints"):
        translator.translate("a red dog", glossary={"dog": "hund"}, glossary_mode="constrain")


def test_a_glossary_mode_the_model_cannot_apply_is_one_line(trained, monkeypatch) -> None:
    from nmt.data.spm import SentencePieceModel

    translator = Translator.from_checkpoint(trained[0])
    with pytest.raises(ValueError, match="glossary mode: must be one of annotate, constrain, both"):
        translator.translate("a dog", glossary={"dog": "hund"}, glossary_mode="soft")
    monkeypatch.setattr(SentencePieceModel, "tags", property(lambda self: {}))
    with pytest.raises(ValueError) as error:
        translator.translate("a dog", glossary={"dog": "hund"})
    assert str(error.value).startswith(
        "glossary mode annotate: this model's vocabulary has no <term>"
    )
    assert "\n" not in str(error.value)
    assert "hund" in translator.translate(
        "a dog", glossary={"dog": "hund"}, glossary_mode="constrain"
    )


def test_nmt_eval_applies_a_glossary_file(trained, tmp_path, capsys) -> None:
    from nmt_cli.eval import main

    (tmp_path / "in.en").write_text("a red dog\nthe cat\n", encoding="utf-8")
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("dog\tkatzekatze\n", encoding="utf-8")
    common = ["--path", trained[0], "--input", str(tmp_path / "in.en"), "--glossary", str(glossary)]
    out = str(tmp_path / "out.de")
    assert main([*common, "--glossary-mode", "both", "--output", out]) == 0
    first, second = open(out, encoding="utf-8").read().split("\n")[:2]
    assert "katzekatze" in first and "katzekatze" not in second
    capsys.readouterr()
    glossary.write_text("dog\tHund\ncat Katze\n", encoding="utf-8")
    assert main(common) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"nmt-eval: error: {glossary}:2: expected 'source term<TAB>target term', got 1 "
        "tab-separated fields"
    )
    data_dir = str(Path(trained[0]).parent.parent / "data")
    assert main(["--path", trained[0], data_dir, "--glossary", str(glossary)]) == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith(
            "nmt-eval: error: --glossary: its terms are found in the text of each line, so give --input"
        )
    )


def test_target_constraints_reach_the_pytorch_model_annotated(trained, monkeypatch) -> None:
    translator = Translator.from_checkpoint(trained[0])
    reached = spy_on_pytorch_search(translator, monkeypatch)
    lines = ["a red dog", "the cat"]
    translator.translate(lines, constraints=[["hund"], []], constraints_mode="annotate")
    plain_source = translator.src_spm.encode(["the cat"])[0] + [EOS_ID]
    assert sorted(reached) == sorted(
        [expected_source(translator, "a red dog", "hund"), plain_source]
    )
    reached.clear()
    # both: annotated and searched under the constraint, which any model then meets
    output = translator.translate(
        "a red dog", constraints=["katzekatze"], constraints_mode="both", beam=3
    )
    assert reached == [expected_source(translator, "a red dog", "katzekatze")]
    assert "katzekatze" in output
    with pytest.raises(ValueError, match="constraints of sentence 1"):
        translator.translate("a dog", constraints=[" "], constraints_mode="annotate")
    with pytest.raises(ValueError, match="constraints mode: must be one of annotate, constrain"):
        translator.translate("a dog", constraints=["hund"], constraints_mode="soft")


def test_target_constraints_reach_the_ctranslate2_export_annotated(ct2_export, monkeypatch) -> None:
    translator = Translator.from_checkpoint(ct2_export)
    reached = spy_on_ctranslate2_search(translator, monkeypatch)
    translator.translate("a red dog", constraints=["hund"], constraints_mode="annotate")
    pieces = translator.src_spm.processor.id_to_piece
    annotated = [pieces(i) for i in expected_source(translator, "a red dog", "hund")[:-1]]
    assert reached and all(tokens == annotated for tokens in reached)
    with pytest.raises(ValueError) as error:
        translator.translate("a red dog", constraints=["hund"], constraints_mode="both")
    assert str(error.value).startswith("constraints mode both: ") and "\n" not in str(error.value)
    assert "CTranslate2 export, which has no lexical constraints" in str(error.value)


def test_annotating_constraints_needs_the_term_tag(trained, monkeypatch) -> None:
    from nmt.data.spm import SentencePieceModel

    translator = Translator.from_checkpoint(trained[0])
    monkeypatch.setattr(SentencePieceModel, "tags", property(lambda self: {}))
    with pytest.raises(ValueError) as error:
        translator.translate("a dog", constraints=["hund"], constraints_mode="annotate")
    assert str(error.value).startswith(
        "constraints mode annotate: this model's vocabulary has no <term>"
    )
    assert "\n" not in str(error.value)


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(monkeypatch, script: str, arguments: list[str]) -> None:
    """benchmarks/SCRIPT as its command line runs it, with ``arguments``."""
    import runpy
    import sys

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [script, *arguments])
    runpy.run_path(str(BENCHMARKS / script), run_name="__main__")


@pytest.fixture
def benchmark_inputs(trained, tmp_path):
    """(the tiny checkpoint, its dataset directory, an output directory) for a benchmark run."""
    checkpoint = trained[0]
    return checkpoint, str(Path(checkpoint).parent.parent / "data"), tmp_path / "out"


@pytest.mark.slow
def test_the_terminology_benchmark_adds_the_annotated_model_rows(
    benchmark_inputs, monkeypatch, capsys
) -> None:
    """benchmarks/terminology.py --annotated-path on the tiny model (plain and annotated alike):
    one table and one results file with the CTranslate2 rows and the "both" row."""
    pytest.importorskip("ctranslate2")
    import json

    checkpoint, data_dir, out_dir = benchmark_inputs
    run_benchmark(
        monkeypatch,
        "terminology.py",
        ["--path", checkpoint, "--data", data_dir, "--splits", "valid"]
        + ["--annotated-path", checkpoint, "--beam", "2", "--out-dir", str(out_dir)],
    )
    printed = capsys.readouterr().out
    rows = ("plain", "constrained", "A-ct2 plain", "A-ct2 terms", "A-both")
    assert all(f"\nvalid  {row} " in printed for row in rows)
    results = json.loads((out_dir / "terminology.json").read_text(encoding="utf-8"))
    figures = results["figures"]
    valid = figures["valid"]
    # the references travel with the hypotheses, for scripts/published.py's paired bootstrap
    reference = (out_dir / results["hypotheses"]["valid.reference"]).read_text(encoding="utf-8")
    assert len(reference.split("\n")[:-1]) == valid["sentences"]
    assert valid["constraint_phrases"] > 0
    # one model on both sides, unannotated: CTranslate2 int8 scores near the PyTorch beam
    assert abs(valid["A-ct2 plain"]["bleu"] - valid["plain"]["bleu"]) < 10
    assert f"annotated model (CTranslate2) {valid['A-ct2 plain']['bleu']:.2f}" in printed
    # the constrained beam meets every drawn term, the annotated input notwithstanding
    assert valid["constrained"]["terms"] == valid["A-both"]["terms"] == 100.0
    hypotheses = (out_dir / "valid.A-ct2-terms.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == valid["sentences"]


def test_the_term_following_benchmark_scores_each_checkpoint_on_its_own_misses(
    benchmark_inputs, monkeypatch, capsys
) -> None:
    """benchmarks/term_following.py: per checkpoint, phrases its plain output misses, given after
    <term>; the figures are recomputable from the files it names."""
    import json

    checkpoint, data_dir, out_dir = benchmark_inputs
    run_benchmark(
        monkeypatch,
        "term_following.py",
        ["--data", data_dir, "--beam", "2", "--out-dir", str(out_dir)]
        + [f"first={checkpoint}", f"again={checkpoint}"],
    )
    printed = capsys.readouterr().out
    results = json.loads((out_dir / "term_following.json").read_text(encoding="utf-8"))
    figures, files = results["figures"], results["hypotheses"]

    def lines(name):
        return (out_dir / files[name]).read_text(encoding="utf-8").split("\n")[:-1]

    for name in ("first", "again"):
        row = figures[name]
        assert f"\n{name} " in printed and row["phrases"] > 0
        phrases = [line.split("\t") if line else [] for line in lines(f"{name}.constraints")]
        plain, terms = lines(f"{name}.plain"), lines(f"{name}.terms")
        assert len(plain) == len(terms) == len(phrases) == len(lines("reference"))
        assert not any(p in out for out, ps in zip(plain, phrases) for p in ps), "misses only"
        found = sum(p in out for out, ps in zip(terms, phrases) for p in ps)
        assert row["terms"] == pytest.approx(100.0 * found / row["phrases"])
        assert terms != plain, "the phrases reached the model"
    assert figures["first"] == figures["again"], "one checkpoint, one row"
    table = figures["table"]
    assert [row[0] for row in table["rows"]] == ["first", "again"]
    assert table["rows"][0][2] == f"{figures['first']['terms']:.1f}"


def test_the_term_following_benchmark_names_a_bad_model_argument(monkeypatch) -> None:
    for argument, message in [
        ("checkpoint.pt", "'checkpoint.pt': expected NAME=CHECKPOINT"),
        ("table=checkpoint.pt", "a NAME is a key of the results file"),
        ("u1.6k=checkpoint.pt", "a NAME is a key of the results file"),
        (
            "x=/nonexistent/checkpoint.pt",
            "error: x: /nonexistent/checkpoint.pt: no such checkpoint",
        ),
    ]:
        with pytest.raises(SystemExit, match=message):
            run_benchmark(monkeypatch, "term_following.py", [argument])
