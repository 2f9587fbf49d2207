"""A multilingual model through the Hugging Face bridge: its tags become MarianMT's >>xx<< tokens, so
MarianTokenizer and transformers' generate choose each direction as nmt does; the card lists the
directions; nmt-import restores them; a --lang-tok decoder model, which Marian cannot request, is
refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest

from nmt.checkpoint_io import load_checkpoint
from nmt.data.spm import EOS_ID
from nmt.eval import Translator
from nmt_cli.export import main as export_main
from nmt_cli.import_model import main as import_main

from ..helpers import MULTI_PAIRS

transformers = pytest.importorskip("transformers")

PAIRS = MULTI_PAIRS.split(",")


def _lines(multi_data: str, lang: str) -> list[str]:
    """The multi-way test set's lines in ``lang`` (line i is the same sentence in every language)."""
    with open(
        os.path.join(os.path.dirname(multi_data), f"test.{lang}"), encoding="utf-8"
    ) as handle:
        return handle.read().split("\n")[:-1][:8]


def _marian(directory: str):
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses"
        warnings.simplefilter("ignore")
        tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    return tokenizer, transformers.MarianMTModel.from_pretrained(directory).eval()


def _generate(tokenizer, model, target: str, lines: list[str]) -> list[str]:
    batch = tokenizer([f">>{target}<< {line}" for line in lines], return_tensors="pt", padding=True)
    generated = model.generate(**batch, num_beams=5, max_new_tokens=30)
    return tokenizer.batch_decode(generated, skip_special_tokens=True)


@pytest.fixture(scope="module")
def exported(multi_models, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("hf-multi") / "hf")
    command = [multi_models["encoder"], "--format", "huggingface", "--output-dir", out]
    assert export_main(command) == 0
    return out


def test_marian_tokens_choose_every_direction_as_nmt_does(multi_models, multi_data, exported):
    tokenizer, model = _marian(exported)
    vocab = load_checkpoint(multi_models["encoder"])["vocab"]
    assert tokenizer.supported_language_codes == [">>de<<", ">>en<<", ">>fr<<"]
    ours = Translator.from_checkpoint(multi_models["encoder"])
    english = _lines(multi_data, "en")
    # MarianTokenizer reads >>de<< as the tag nmt puts in front of the source
    assert tokenizer(f">>de<< {english[0]}").input_ids == [
        vocab["tags"]["<2de>"],
        *ours.src_spm.encode(english[:1])[0],
        EOS_ID,
    ]
    translations = {}
    for pair in PAIRS:
        source, target = pair.split("-")
        lines = _lines(multi_data, source)
        translations[pair] = _generate(tokenizer, model, target, lines)
        expected = ours.translate(
            lines, source_lang=source, target_lang=target, beam=5, max_len_a=0, max_len_b=30
        )
        assert translations[pair] == expected, pair
    assert translations["en-de"] != translations["en-fr"]  # the token, not the source, chose
    card = open(os.path.join(exported, "README.md"), encoding="utf-8").read()
    for pair in PAIRS:
        source, target = pair.split("-")
        assert f"| {source} → {target} | `>>{target}<<` |" in card


def test_import_restores_the_directions_and_translates_each_as_the_original(
    multi_models, multi_data, exported, tmp_path
):
    back = tmp_path / "back"
    assert import_main([exported, "--from", "huggingface", "--output-dir", str(back)]) == 0
    original = load_checkpoint(multi_models["encoder"])["vocab"]
    imported = load_checkpoint(str(back / "checkpoint.pt"))["vocab"]
    for key in ("source_lang", "target_lang", "lang_pairs", "tags", "lang_tok"):
        assert imported[key] == original[key], key
    assert imported["src_spm"].equal(original["src_spm"])  # the tags are control pieces again
    ours = Translator.from_checkpoint(multi_models["encoder"])
    theirs = Translator.from_checkpoint(str(back / "checkpoint.pt"))
    for pair in PAIRS:
        source, target = pair.split("-")
        lines = _lines(multi_data, source)
        assert theirs.translate(lines, source_lang=source, target_lang=target) == ours.translate(
            lines, source_lang=source, target_lang=target
        ), pair


def test_a_decoder_side_tag_is_refused_in_one_line(multi_models, tmp_path, capsys):
    out = tmp_path / "hf"
    command = [multi_models["decoder"], "--format", "huggingface", "--output-dir", str(out)]
    assert export_main(command) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--lang-tok decoder" in lines[0], lines
    assert "--lang-tok encoder" in lines[0] and not out.exists()


def _tag_made_normal(directory) -> None:
    """source.spm with <2de> an ordinary piece: text could then produce the tag."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((directory / "source.spm").read_bytes())
    next(piece for piece in proto.pieces if piece.piece == "<2de>").type = 1  # NORMAL
    (directory / "source.spm").write_bytes(proto.SerializeToString())


def _lang_pairs(pairs):
    def edit(directory) -> None:
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(
            json.dumps({**config, "lang_pairs": pairs})
        )

    return edit


BAD_MULTILINGUAL = {
    "a direction without its token": (
        _lang_pairs(["en-de", "en-es"]),
        [],
        "vocab.json: no >>es<<, the token of a target language of the lang_pairs",
    ),
    "a tag that text could produce": (
        _tag_made_normal,
        [],
        "source.spm: <2de> is not a control piece",
    ),
    "one direction asked of a multilingual model": (
        lambda directory: None,
        ["-s", "en", "-t", "de"],
        "--source-lang, --target-lang: ",
    ),
}


@pytest.mark.parametrize("case", list(BAD_MULTILINGUAL))
def test_a_multilingual_import_that_cannot_restore_the_directions_is_one_line(
    exported, tmp_path, capsys, case
):
    break_it, flags, expected = BAD_MULTILINGUAL[case]
    broken = tmp_path / "hf"
    shutil.copytree(exported, broken)
    break_it(broken)
    out = tmp_path / "out"
    command = [str(broken), "--from", "huggingface", "--output-dir", str(out), *flags]
    assert import_main(command) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not out.exists()
