"""nmt-eval and the Translator on a multilingual model: -s/-t choose the direction (the checkpoint
knows where its tag goes), every direction in one table, tags never in the output, a tag typed in
the text stays text, and an export decodes as its checkpoint does."""

import os

import numpy as np
import pytest

from nmt.eval.translate import Translator
from nmt_cli.eval import main as eval_main

from ..helpers import MULTI_PAIRS, MULTI_WORDS

SENTENCES = ["the dog runs on the mat", "a big red ball", "the old man sits"]


def _table_rows(text):
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in (*MULTI_PAIRS.split(","), "mean"):
            rows[cells[0]] = [float(cell) for cell in cells[1:]]
    return rows


@pytest.mark.parametrize("placement", ["encoder", "decoder"])
def test_every_direction_in_one_table(multi_data, multi_models, capsys, placement):
    code = eval_main([multi_data, "--path", multi_models[placement], "--beam", "2"])
    out = capsys.readouterr().out
    assert code == 0
    rows = _table_rows(out)
    assert list(rows) == [*MULTI_PAIRS.split(","), "mean"]
    for pair in MULTI_PAIRS.split(","):
        bleu, chrf, off_target = rows[pair]
        # it learned each direction (langid's off-target % is meaningless on these toy words)
        assert bleu > 50 and 0 <= off_target <= 100, (pair, rows[pair])
    assert rows["mean"][0] == pytest.approx(
        sum(rows[p][0] for p in MULTI_PAIRS.split(",")) / 4, abs=0.01
    )


def test_one_direction_scores_as_its_table_row(multi_data, multi_models, capsys):
    path = multi_models["encoder"]
    eval_main([multi_data, "--path", path, "--beam", "2"])
    table = _table_rows(capsys.readouterr().out)
    code = eval_main(
        [
            multi_data,
            "--path",
            path,
            "--beam",
            "2",
            "-s",
            "en",
            "-t",
            "fr",
            "--quiet",
            "--off-target",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    bleu = float(out.split("BLEU = ")[1].split()[0])
    assert bleu == pytest.approx(table["en-fr"][0], abs=0.01)
    assert f"off-target {table['en-fr'][2]:.2f}%" in out


@pytest.mark.parametrize("placement", ["encoder", "decoder"])
def test_direction_chooses_the_output_language(multi_models, placement):
    translator = Translator.from_checkpoint(multi_models[placement])
    tags = set(translator.languages.tags.values())
    for target in ("de", "fr"):
        nbest = translator.translate_nbest(
            SENTENCES, source_lang="en", target_lang=target, beam=3, nbest=3
        )
        words = set(MULTI_WORDS[target])
        other = set(MULTI_WORDS["fr" if target == "de" else "de"]) - words
        in_target = total = 0
        for hypotheses in nbest:
            for hypothesis in hypotheses:
                assert not set(hypothesis.tokens) & tags  # tags never in any output
            best = hypotheses[0].text.split()
            # A 400-update model may borrow a word ("der hund rennt sur der matte", on one CPU
            # kind), but each output is in the language asked for, not the other one.
            assert sum(w in words for w in best) > 2 * sum(w in other for w in best), (target, best)
            in_target += sum(w in words for w in best)
            total += len(best)
        assert in_target >= 0.8 * total, (target, nbest)


def test_tag_typed_in_text_is_text(multi_models):
    translator = Translator.from_checkpoint(multi_models["encoder"])
    tags = translator.languages.tags
    direction = translator.direction("en", "de")
    ids = translator.encode(["<2fr> the dog <2de>"], direction=direction)[0].tolist()
    assert ids[0] == tags["<2de>"]  # the direction's tag, by id
    assert not set(ids[1:]) & set(tags.values())  # the typed ones are ordinary pieces
    assert "fr" in translator.src_spm.decode([ids[1:]])[0]  # ("<" is unknown to the toy vocabulary)


def test_stdin_and_files_with_s_t(multi_models, tmp_path, capsys):
    path = multi_models["decoder"]
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in SENTENCES), encoding="utf-8")
    code = eval_main(
        ["--path", path, "-s", "en", "-t", "fr", "--input", str(source), "--beam", "2"]
    )
    assert code == 0
    expected = Translator.from_checkpoint(path).translate(
        SENTENCES, source_lang="en", target_lang="fr", beam=2
    )
    assert capsys.readouterr().out.splitlines() == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["-s", "en", "-t", "cs"],
            "direction en-cs: not in the model (it has en-de, de-en, en-fr, fr-en",
        ),
        (["-s", "de", "-t", "fr"], "untrained pairs of its languages need --zero-shot"),
        ([], "a multilingual model: give the direction with -s/--source-lang and -t/--target-lang"),
        (["-s", "en"], "a direction needs both"),
    ],
)
def test_direction_not_in_the_model_is_one_line(multi_models, tmp_path, capsys, args, message):
    source = tmp_path / "in.txt"
    source.write_text("the dog\n", encoding="utf-8")
    code = eval_main(["--path", multi_models["encoder"], "--input", str(source), *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nmt-eval")]
    assert code == 1 and len(err) == 1 and message in err[0], err


def test_zero_shot_only_with_the_flag(multi_models, capsys, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("der hund\n", encoding="utf-8")
    code = eval_main(
        [
            "--path",
            multi_models["encoder"],
            "--input",
            str(source),
            "-s",
            "de",
            "-t",
            "fr",
            "--zero-shot",
        ]
    )
    assert code == 0 and capsys.readouterr().out.strip()


def test_dataset_direction_missing_is_one_line(multi_data, multi_models, capsys):
    code = eval_main(
        [multi_data, "--path", multi_models["encoder"], "-s", "de", "-t", "fr", "--zero-shot"]
    )
    err = capsys.readouterr().err
    assert code == 1 and "has no direction de-fr (it has en-de, de-en, en-fr, fr-en)" in err


@pytest.mark.parametrize("placement", ["encoder", "decoder"])
def test_ctranslate2_export_keeps_the_tags(multi_models, tmp_path, placement):
    pytest.importorskip("ctranslate2")
    from nmt.deploy.ct2 import export_ctranslate2

    export = str(tmp_path / "export")
    export_ctranslate2([multi_models[placement]], export)
    exported = Translator.from_checkpoint(export)
    assert exported.languages.placement == placement
    assert exported.languages.pairs == tuple(MULTI_PAIRS.split(","))
    checkpoint = Translator.from_checkpoint(multi_models[placement])
    for target in ("de", "fr"):
        options = dict(source_lang="en", target_lang=target, beam=1)
        assert exported.translate(SENTENCES, **options) == checkpoint.translate(
            SENTENCES, **options
        )
    assert os.path.isfile(os.path.join(export, "nmt_export.json"))


def test_bilingual_model_checks_s_t(tiny, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("the dog\n", encoding="utf-8")
    assert (
        eval_main(["--path", tiny.checkpoint, "--input", str(source), "-s", "en", "-t", "de"]) == 0
    )
    capsys.readouterr()
    assert (
        eval_main(["--path", tiny.checkpoint, "--input", str(source), "-s", "en", "-t", "fr"]) == 1
    )
    assert "direction en-fr: not in the model (it has en-de)" in capsys.readouterr().err


def test_forced_decoding_with_a_decoder_side_tag_scores_what_the_search_found(multi_models):
    from nmt.data.spm import EOS_ID

    translator = Translator.from_checkpoint(multi_models["decoder"])
    direction = translator.direction("en", "fr")
    sources = translator.encode(SENTENCES, direction=direction)
    first_tokens = translator.first_tokens(direction, len(sources))
    lenpen = 0.6
    found = [
        nbest[0]
        for nbest in translator.generate(sources, beam=1, lenpen=lenpen, first_tokens=first_tokens)
    ]
    targets = [hypothesis.tokens + [EOS_ID] for hypothesis in found]
    scored = translator.score_targets(sources, targets, first_tokens=first_tokens)
    for hypothesis, result in zip(found, scored):
        # The tag is read, not scored: one score per hypothesis token and EOS, the search's score.
        assert len(result.token_scores) == len(hypothesis.tokens) + 1
        assert float(result.token_scores.sum()) / len(
            result.token_scores
        ) ** lenpen == pytest.approx(hypothesis.score, abs=1e-4)
    untagged = translator.score_targets(sources, targets)
    assert any(
        abs(float(a.token_scores.sum()) - float(b.token_scores.sum())) > 1e-3
        for a, b in zip(scored, untagged)
    )  # without the tag the decoder reads another prefix


def test_fairseq_format_and_score_reference_with_a_decoder_side_tag(
    multi_data, multi_models, tmp_path, capsys
):
    path = multi_models["decoder"]
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in SENTENCES), encoding="utf-8")
    code = eval_main(
        ["--path", path, "-s", "en", "-t", "fr", "--input", str(source), "--format", "fairseq"]
    )
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    hypotheses = [line for line in lines if line[0].startswith("H-")]
    positional = [line for line in lines if line[0].startswith("P-")]
    assert len(hypotheses) == len(positional) == len(SENTENCES)
    for h, p in zip(hypotheses, positional):
        scores = [float(x) for x in p[1].split(" ")]
        assert len(scores) == len(h[2].split(" ")) + 1  # the tokens and EOS, no tag
        assert sum(scores) / len(scores) == pytest.approx(float(h[1]), abs=2e-3)
        assert not h[2].startswith("<2")
    code = eval_main([multi_data, "--path", path, "-s", "en", "-t", "fr", "--score-reference"])
    captured = capsys.readouterr()
    scores = [float(line) for line in captured.out.splitlines()]
    with open(os.path.join(os.path.dirname(multi_data), "test.fr"), encoding="utf-8") as handle:
        references = handle.read().split("\n")[:-1]
    assert code == 0 and len(scores) == len(references) and max(scores) < 0
    assert "reference log-probability per token" in captured.err


@pytest.mark.parametrize("placement", ["encoder", "decoder"])
def test_back_translation_with_one_direction_of_a_multilingual_model(
    multi_data, multi_models, tmp_path, capsys, placement
):
    from nmt.data.corpus import ParallelCorpus
    from nmt.data.manifest import load_manifest
    from nmt.data.spm import BT_TAG
    from nmt_cli.preprocess import main as preprocess_main

    with open(os.path.join(os.path.dirname(multi_data), "test.de"), encoding="utf-8") as handle:
        german = handle.read().split("\n")[:-1]
    (tmp_path / "mono.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    mono = str(tmp_path / "mono-data")
    spm = os.path.join(multi_data, "spm.model")
    common = ["--trainpref", str(tmp_path / "mono"), "--spm-model", spm, "--workers", "1"]
    assert preprocess_main(["--only-source", "-s", "de", *common, "--destdir", mono]) == 0
    path = multi_models[placement]
    bt_args = [mono, "--path", path, "--split", "train", "--beam", "2", "--cpu"]
    assert eval_main([*bt_args, "--output-dataset", str(tmp_path / "none")]) == 1
    assert (
        "give the direction with -s/--source-lang and -t/--target-lang" in capsys.readouterr().err
    )
    out = str(tmp_path / "bt")
    assert (
        eval_main([*bt_args, "-s", "de", "-t", "en", "--output-dataset", out, "--tag-source"]) == 0
    )
    manifest = load_manifest(out)
    assert (manifest.source_lang, manifest.target_lang) == ("en", "de")
    translator = Translator.from_checkpoint(path)
    expected = translator.translate(german, source_lang="de", target_lang="en", beam=2)
    corpus = ParallelCorpus(out, "train")
    tags = dict(translator.tgt_spm.tags)
    bt_tag = tags.pop(BT_TAG)
    assert len(corpus) > 0
    for index, line in enumerate(np.asarray(corpus.line_numbers)):
        synthetic = corpus[index][0]
        assert synthetic[0] == bt_tag and not set(synthetic.tolist()) & set(tags.values())
        assert translator.tgt_spm.decode([synthetic[1:-1].tolist()])[0] == expected[int(line)]
