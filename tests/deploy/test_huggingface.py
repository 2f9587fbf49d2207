"""nmt-export --format huggingface and nmt-import --from huggingface: transformers' MarianMTModel and
MarianTokenizer load what we write with nothing missing or unexpected, its logits equal ours both
ways, and what cannot be converted is a one-line error. Models are tiny and random or tiny and
trained (tests/eval's); nothing is downloaded."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import random
import shutil

import pytest
import sentencepiece as sentencepiece_lib
import torch

from nmt.checkpoint_io import atomic_torch_save, load_checkpoint
from nmt.config import ModelConfig
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, SentencePieceModel
from nmt.deploy.huggingface import export_huggingface, import_marian, our_logits
from nmt.eval import Translator
from nmt.model import build_model
from nmt_cli.export import main as export_main
from nmt_cli.import_model import main as import_main

from ..helpers import tiny_model_config

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _random_checkpoint(tiny, path, **overrides) -> str:
    """A random model of ours over the tiny vocabulary, biases and norms perturbed so that a
    wrongly mapped one shows."""
    state = load_checkpoint(tiny.checkpoint)
    vocab_size = state["model_config"]["src_vocab_size"]
    values = dict(decoder_attention_heads=2, max_source_positions=40, max_target_positions=48)
    cfg = tiny_model_config(vocab_size, **{**values, **overrides})  # shares what the caller says
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    atomic_torch_save(
        {**state, "model": model.state_dict(), "model_config": dataclasses.asdict(cfg)}, str(path)
    )
    return str(path)


def _batch(spm: SentencePieceModel, sources: list[str], targets: list[str]):
    src = [ids + [EOS_ID] for ids in spm.encode(sources)]
    tgt = [[BOS_ID] + ids for ids in spm.encode(targets)]
    src_len = torch.tensor([len(s) for s in src])
    src_t = torch.full((len(src), int(src_len.max())), PAD_ID)
    for i, s in enumerate(src):
        src_t[i, : len(s)] = torch.tensor(s)
    width = max(len(t) for t in tgt)
    prev = torch.full((len(tgt), width), EOS_ID)  # teacher-forced prefixes of one length
    for i, t in enumerate(tgt):
        prev[i, : len(t)] = torch.tensor(t)
    return src_t, src_len, prev


def _hf_logits(hf_model, src, src_len, prev):
    mask = (torch.arange(src.shape[1])[None, :] < src_len[:, None]).long()
    with torch.no_grad():
        return hf_model(input_ids=src, attention_mask=mask, decoder_input_ids=prev).logits


def test_export_loads_in_transformers_with_our_logits_tokens_and_translations(tiny, tmp_path):
    out = tmp_path / "hf"
    assert export_main([tiny.checkpoint, "--format", "huggingface", "--output-dir", str(out)]) == 0
    assert sorted(os.listdir(out)) == [
        ".nmt-made-by",  # what nmt-export --force may replace
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "tokenizer_config.json",
        "vocab.json",
    ]
    model, info = transformers.MarianMTModel.from_pretrained(str(out), output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    ours = Translator.from_checkpoint(tiny.checkpoint)
    spm = ours.src_spm
    assert [tokenizer(line).input_ids for line in tiny.test_src] == [
        ids + [EOS_ID] for ids in spm.encode(tiny.test_src)
    ]
    src, src_len, prev = _batch(spm, tiny.test_src[:8], tiny.test_tgt[:8])
    expected = our_logits(tiny.model, src, src_len, prev)
    assert (expected - _hf_logits(model.eval(), src, src_len, prev)).abs().max() < 1e-4
    # generate(num_beams=5) with the exported generation config: our beam search's translations
    batch = tokenizer(tiny.test_src, return_tensors="pt", padding=True)
    generated = model.generate(**batch, num_beams=5, max_new_tokens=40)
    theirs = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert theirs == ours.translate(tiny.test_src, beam=5, max_len_a=0, max_len_b=40)
    card = (out / "README.md").read_text()
    assert "en" in card and "Positions" in card  # fairseq's sinusoids: the stored-table caveat


def test_the_stored_position_table_is_what_makes_logits_equal(tiny, tmp_path):
    """transformers #29807/#31387: MarianMT computes its own sinusoids, not fairseq's (ours). Without
    the table the export stores, the loaded model's logits are not ours."""
    out = tmp_path / "hf"
    export_huggingface([tiny.checkpoint], str(out))
    weights = load_file(str(out / "model.safetensors"))
    assert "model.encoder.embed_positions.weight" in weights
    src, src_len, prev = _batch(
        Translator.from_checkpoint(tiny.checkpoint).src_spm, tiny.test_src[:4], tiny.test_tgt[:4]
    )
    expected = our_logits(tiny.model, src, src_len, prev)
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        del weights[key]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    reloaded = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    assert (expected - _hf_logits(reloaded, src, src_len, prev)).abs().max() > 1e-2


def test_marian_sinusoids_export_natively_and_survive_save_pretrained(tiny, tmp_path):
    checkpoint = _random_checkpoint(
        tiny,
        tmp_path / "m.pt",
        sinusoidal_positions="marian",
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
    )
    out = tmp_path / "hf"
    checked = export_huggingface([checkpoint], str(out))
    assert checked["native_positions"] and checked["max_logit_difference"] < 1e-4
    assert not any("embed_positions" in key for key in load_file(str(out / "model.safetensors")))
    hf_model = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    hf_model.save_pretrained(str(tmp_path / "resaved"))
    resaved = transformers.MarianMTModel.from_pretrained(str(tmp_path / "resaved")).eval()
    state = load_checkpoint(checkpoint)
    ours = build_model(ModelConfig(**state["model_config"])).eval()
    ours.load_state_dict(state["model"])
    spm = SentencePieceModel(bytes(state["vocab"]["src_spm"].numpy()))
    src, src_len, prev = _batch(spm, tiny.test_src[:4], tiny.test_tgt[:4])
    expected = our_logits(ours, src, src_len, prev)
    assert (expected - _hf_logits(resaved, src, src_len, prev)).abs().max() < 1e-4


VARIANTS = {
    "post-norm, shared, fairseq sinusoids": dict(
        share_all_embeddings=True, share_decoder_input_output_embed=True
    ),
    "learned positions, gelu, untied": dict(
        encoder_learned_pos=True, decoder_learned_pos=True, activation_fn="gelu"
    ),
    "swish, tied decoder, no scaling, marian sinusoids": dict(
        activation_fn="swish",
        share_decoder_input_output_embed=True,
        no_scale_embedding=True,
        sinusoidal_positions="marian",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_round_trip_nmt_hf_nmt_keeps_logits_and_config(tiny, tmp_path, variant):
    # One position table size in Marian: a model with two would come back with the larger one.
    checkpoint = _random_checkpoint(
        tiny, tmp_path / "m.pt", max_source_positions=48, **VARIANTS[variant]
    )
    export_huggingface([checkpoint], str(tmp_path / "hf"))
    result = import_marian(str(tmp_path / "hf"), str(tmp_path / "back"))
    assert result["max_logit_difference"] < 1e-4
    original = load_checkpoint(checkpoint)
    back = load_checkpoint(str(tmp_path / "back" / "checkpoint.pt"))
    assert back["vocab"]["src_spm"].equal(original["vocab"]["src_spm"])  # ids kept as ours
    cfg, cfg_back = (ModelConfig(**state["model_config"]) for state in (original, back))
    assert dataclasses.replace(cfg_back, dropout=cfg.dropout) == cfg
    models = []
    for state, config in ((original, cfg), (back, cfg_back)):
        model = build_model(config).eval()
        model.load_state_dict(state["model"])
        models.append(model)
    spm = SentencePieceModel(bytes(original["vocab"]["src_spm"].numpy()))
    src, src_len, prev = _batch(spm, tiny.test_src[:6], tiny.test_tgt[:6])
    assert (
        our_logits(models[0], src, src_len, prev) - our_logits(models[1], src, src_len, prev)
    ).abs().max() < 1e-4


# ----------------------------------------------------------------------------- an OPUS-MT-like model
def _multi30k(lang: str, count: int) -> list[str]:
    with gzip.open(
        os.path.join(REPO, "data", "multi30k", f"train.{lang}.gz"), "rt", encoding="utf-8"
    ) as handle:
        return [next(handle).rstrip("\n") for _ in range(count)]


def _marian_spm(lines: list[str]) -> bytes:
    """SentencePiece as Marian trains it: its default ids (unk 0, bos 1, eos 2), no pad."""
    model = io.BytesIO()
    sentencepiece_lib.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=300, minloglevel=2
    )
    return model.getvalue()


@pytest.fixture(scope="module")
def opus_like(tmp_path_factory) -> str:
    """A random MarianMTModel saved by transformers, laid out as OPUS-MT's are: a SentencePiece model
    per language, one joint vocab.json (</s> 0, <unk> 1, pieces, <pad> last = the decoder start),
    shared embeddings, swish, a non-zero final_logits_bias."""
    directory = tmp_path_factory.mktemp("opus") / "opus-mt-en-de"
    directory.mkdir()
    protos = {lang: _marian_spm(_multi30k(lang, 3000)) for lang in ("en", "de")}
    pieces: list[str] = ["</s>", "<unk>"]
    for proto in protos.values():
        processor = sentencepiece_lib.SentencePieceProcessor(model_proto=proto)
        for index in range(processor.get_piece_size()):
            piece = processor.id_to_piece(index)
            if (
                not processor.is_control(index)
                and not processor.is_unknown(index)
                and piece not in pieces
            ):
                pieces.append(piece)
    random.Random(0).shuffle(pieces[2:])
    pieces.append("<pad>")
    (directory / "source.spm").write_bytes(protos["en"])
    (directory / "target.spm").write_bytes(protos["de"])
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "separate_vocabs": False})
    )
    pad = len(pieces) - 1
    config = transformers.MarianConfig(
        vocab_size=len(pieces),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
    model.save_pretrained(str(directory))
    return str(directory)


def test_import_of_an_opus_mt_like_model_has_its_logits(opus_like, tmp_path):
    result = import_marian(opus_like, str(tmp_path / "imported"))
    assert result["max_logit_difference"] < 1e-4
    assert result["spm_files"] == ["spm.en.model", "spm.de.model"]  # one id space, two segmenters
    cfg = result["model_config"]
    assert cfg.output_bias and cfg.decoder_start_id == PAD_ID and cfg.activation_fn == "swish"
    assert cfg.sinusoidal_positions == "marian" and cfg.share_all_embeddings
    # Our source SentencePiece model segments as transformers' tokenizer does, ids mapped
    tokenizer = transformers.MarianTokenizer.from_pretrained(opus_like)
    ours = SentencePieceModel.load(str(tmp_path / "imported" / "spm.en.model"))
    # A character source.spm does not know comes out of it as itself, which transformers then
    # looks up in the joint vocabulary (another language's piece); ours is <unk>. Such lines aside:
    original = sentencepiece_lib.SentencePieceProcessor(
        model_file=os.path.join(opus_like, "source.spm")
    )
    lines = [
        line
        for line in _multi30k("en", 3200)[3000:]
        if original.unk_id() not in original.encode(line)
    ]
    assert len(lines) > 150
    for line in lines:
        theirs = tokenizer.convert_ids_to_tokens(tokenizer(line).input_ids)
        mine = [ours.processor.id_to_piece(i) for i in ours.encode([line])[0] + [EOS_ID]]
        assert mine == theirs, line


@pytest.mark.slow
def test_opus_mt_like_model_fine_tunes_and_exports_back(opus_like, tmp_path):
    """The issue's path: import, a dataset with the model's SentencePiece models, 50 updates of
    nmt-train from the imported weights, export to Hugging Face, loaded by transformers."""
    from nmt_cli.preprocess import main as preprocess_main
    from nmt_cli.train import main as train_main

    imported = tmp_path / "imported"
    assert import_main([opus_like, "--from", "huggingface", "--output-dir", str(imported)]) == 0
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("\n".join(_multi30k(lang, 2000)) + "\n")
    spm_models = f"{imported}/spm.en.model,{imported}/spm.de.model"
    assert (
        preprocess_main(
            [
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                str(tmp_path / "train"),
                "--validpref",
                str(tmp_path / "train"),
                "--destdir",
                str(tmp_path / "data"),
                "--spm-model",
                spm_models,
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert (
        train_main(
            [
                str(tmp_path / "data"),
                "--restore-file",
                str(imported / "checkpoint.pt"),
                "--save-dir",
                str(tmp_path / "ckpt"),
                "--max-update",
                "50",
                "--max-tokens",
                "1024",
                "--no-progress-bar",
                "--no-epoch-checkpoints",
                "--device",
                "cpu",
                "--lr",
                "1e-3",
                "--warmup-updates",
                "10",
            ]
        )
        == 0
    )
    tuned = load_checkpoint(str(tmp_path / "ckpt" / "checkpoint_last.pt"))
    assert tuned["num_updates"] == 50
    start = load_checkpoint(str(imported / "checkpoint.pt"))
    assert tuned["model_config"] == start["model_config"]
    assert not tuned["model"]["output_projection.bias"].equal(
        start["model"]["output_projection.bias"]
    )
    out = tmp_path / "hf"
    assert (
        export_main(
            [
                str(tmp_path / "ckpt" / "checkpoint_last.pt"),
                "--format",
                "huggingface",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    model, info = transformers.MarianMTModel.from_pretrained(str(out), output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert not any("embed_positions" in k for k in load_file(str(out / "model.safetensors")))
    assert (
        model.config.decoder_start_token_id == model.config.pad_token_id == PAD_ID
    )  # Marian's way
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    assert tokenizer.batch_decode(
        model.generate(**tokenizer(["A dog."], return_tensors="pt"), max_new_tokens=5),
        skip_special_tokens=True,
    )


# ----------------------------------------------------------------------------- one-line errors
def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_what_cannot_be_converted_is_a_one_line_error(tiny, opus_like, tmp_path, capsys):
    prenorm = _random_checkpoint(
        tiny, tmp_path / "pre.pt", encoder_normalize_before=True, decoder_normalize_before=True
    )
    assert (
        export_main([prenorm, "--format", "huggingface", "--output-dir", str(tmp_path / "x")]) == 1
    )
    assert "post-norm only" in _error(capsys) and not (tmp_path / "x").exists()

    not_marian = tmp_path / "bart"
    not_marian.mkdir()
    (not_marian / "config.json").write_text(json.dumps({"model_type": "bart"}))
    assert (
        import_main([str(not_marian), "--from", "huggingface", "--output-dir", str(tmp_path / "o")])
        == 1
    )
    assert "not a MarianMT model" in _error(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        import_main([str(empty), "--from", "huggingface", "--output-dir", str(tmp_path / "o")]) == 1
    )
    assert "no config.json" in _error(capsys)
    # An output inside the directory being imported is refused by the output guard.
    inside = str(not_marian / "o")
    assert import_main([str(not_marian), "--from", "huggingface", "--output-dir", inside]) == 1
    assert "lies inside SOURCE" in _error(capsys)

    broken = tmp_path / "no-spm"
    broken.mkdir()
    for name in os.listdir(opus_like):
        if name != "source.spm":
            (broken / name).write_bytes(open(os.path.join(opus_like, name), "rb").read())
    assert (
        import_main([str(broken), "--from", "huggingface", "--output-dir", str(tmp_path / "o")])
        == 1
    )
    assert "source.spm: missing" in _error(capsys)

    mismatched = tmp_path / "other-vocab"
    mismatched.mkdir()
    for name in os.listdir(opus_like):
        (mismatched / name).write_bytes(open(os.path.join(opus_like, name), "rb").read())
    other = [
        f"piece{index}"
        for index in range(len(json.load(open(os.path.join(opus_like, "vocab.json")))))
    ]
    other[0], other[1], other[-1] = "</s>", "<unk>", "<pad>"
    (mismatched / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(other)}))
    assert (
        import_main([str(mismatched), "--from", "huggingface", "--output-dir", str(tmp_path / "o")])
        == 1
    )
    assert "do not match" in _error(capsys)
    assert not (tmp_path / "o").exists()

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert (
        export_main([tiny.checkpoint, "--format", "huggingface", "--output-dir", str(taken)]) == 1
    )
    assert "--force" in _error(capsys) and (taken / "keep.txt").read_text() == "mine"
    assert import_main([opus_like, "--from", "huggingface", "--output-dir", str(taken)]) == 1
    assert "--force" in _error(capsys) and os.listdir(taken) == ["keep.txt"]
    # --force replaces only what nmt-import made itself, never a directory of the user's.
    assert (
        import_main([opus_like, "--from", "huggingface", "--output-dir", str(taken), "--force"])
        == 1
    )
    assert "not a directory nmt-import made" in _error(capsys) and os.listdir(taken) == ["keep.txt"]
    ours = tmp_path / "imported"
    for flags in ([], ["--force"]):
        command = [opus_like, "--from", "huggingface", "--output-dir", str(ours), *flags]
        assert import_main(command) == 0
    assert sorted(os.listdir(ours)) == [
        ".nmt-made-by",
        "checkpoint.pt",
        "spm.de.model",
        "spm.en.model",
    ]


def test_an_imported_opus_mt_like_model_exports_to_ctranslate2_with_our_translations(
    opus_like, tmp_path
):
    """Output bias, swish, a decoder that starts from PAD's row: CTranslate2 decodes as we do."""
    from nmt.deploy.ct2 import export_ctranslate2

    import_marian(opus_like, str(tmp_path / "imported"))
    checkpoint = str(tmp_path / "imported" / "checkpoint.pt")
    export_ctranslate2([checkpoint], str(tmp_path / "ct2"))
    import ctranslate2
    import torch.nn.functional as F

    from nmt.eval.ct2_model import pieces

    state = load_checkpoint(checkpoint)
    model = build_model(ModelConfig(**state["model_config"])).eval()
    model.load_state_dict(state["model"])
    src_spm = SentencePieceModel.load(str(tmp_path / "imported" / "spm.en.model"))
    tgt_spm = SentencePieceModel.load(str(tmp_path / "imported" / "spm.de.model"))
    sources = src_spm.encode(_multi30k("en", 3006)[3000:])
    targets = tgt_spm.encode(_multi30k("de", 3006)[3000:])
    src_vocab, tgt_vocab = pieces(src_spm), pieces(tgt_spm)
    scored = ctranslate2.Translator(str(tmp_path / "ct2")).score_batch(
        [[src_vocab[i] for i in s] for s in sources], [[tgt_vocab[i] for i in t] for t in targets]
    )
    for source, target, result in zip(sources, targets, scored):  # teacher-forced log-probs
        src = torch.tensor([source + [EOS_ID]])
        prev = torch.tensor([[BOS_ID] + target])
        log_probs = F.log_softmax(our_logits(model, src, torch.tensor([src.shape[1]]), prev)[0], -1)
        expected = log_probs.gather(1, torch.tensor(target + [EOS_ID])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=2e-4, rtol=0)


# ----------------------------------------------------------------------------- bad files, one line each
def _edit_json(name: str, **changes):
    """Set (or, with ..., delete) fields of a JSON file of the directory."""

    def edit(directory) -> None:
        values = json.loads((directory / name).read_text())
        for key, value in changes.items():
            if value is ...:
                del values[key]
            else:
                values[key] = value
        (directory / name).write_text(json.dumps(values))

    return edit


def _write(name: str, data: bytes):
    return lambda directory: (directory / name).write_bytes(data)


def _truncate(name: str):
    def edit(directory) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[: len(data) // 2])

    return edit


def _edit_weights(edit_tensors):
    def edit(directory) -> None:
        weights = load_file(str(directory / "model.safetensors"))
        edit_tensors(weights)
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})

    return edit


def _as_bin(then=None):
    """The weights as pytorch_model.bin (transformers' other format), then ``then`` applied."""

    def edit(directory) -> None:
        weights = load_file(str(directory / "model.safetensors"))
        (directory / "model.safetensors").unlink()
        torch.save(weights, str(directory / "pytorch_model.bin"))
        if then:
            then(directory)

    return edit


BAD_FILES = {
    "no weights": (
        lambda d: (d / "model.safetensors").unlink(),
        "model.safetensors: missing, and no pytorch_model.bin either",
    ),
    "truncated safetensors": (
        _truncate("model.safetensors"),
        "model.safetensors: not a complete safetensors file (Error while deserializing header: "
        "incomplete metadata",
    ),
    "safetensors of zeros": (
        _write("model.safetensors", bytes(64)),
        "model.safetensors: not a complete safetensors file",
    ),
    "a tensor of another shape": (
        _edit_weights(lambda w: w.update({"model.encoder.layers.0.fc1.bias": torch.zeros(3)})),
        "model.safetensors: does not hold the model config.json describes (mismatched_keys "
        "[('model.encoder.layers.0.fc1.bias'",
    ),
    "a tensor missing": (
        _edit_weights(lambda w: w.pop("model.encoder.layers.1.fc2.weight")),
        "model.safetensors: does not hold the model config.json describes (missing_keys "
        "['model.encoder.layers.1.fc2.weight']",
    ),
    "more layers than weights": (
        _edit_json("config.json", encoder_layers=3),
        "model.safetensors: does not hold the model config.json describes (missing_keys",
    ),
    "truncated pytorch_model.bin": (
        _as_bin(_truncate("pytorch_model.bin")),
        "pytorch_model.bin: not a PyTorch state dict (a truncated or damaged zip archive)",
    ),
    "text as pytorch_model.bin": (
        _as_bin(_write("pytorch_model.bin", b"not weights\n" * 10)),
        "pytorch_model.bin: not a PyTorch state dict",
    ),
    "pytorch_model.bin not a state dict": (
        _as_bin(lambda d: torch.save([1, 2], str(d / "pytorch_model.bin"))),
        "pytorch_model.bin: not a PyTorch state dict (name -> tensor)",
    ),
    "config.json not JSON": (
        _write("config.json", b'{"model_type": "marian",'),
        "config.json: not valid JSON",
    ),
    "config.json not text": (_write("config.json", b"\xff\xfe\x00"), "config.json: not valid JSON"),
    "unknown activation": (
        _edit_json("config.json", activation_function="mish"),
        "config.json: activation_function 'mish' has no counterpart here",
    ),
    "no d_model": (_edit_json("config.json", d_model=...), "config.json: no d_model"),
    "d_model not a number": (
        _edit_json("config.json", d_model="32"),
        "config.json: d_model '32' is not a positive integer",
    ),
    "heads that do not divide d_model": (
        _edit_json("config.json", decoder_attention_heads=5),
        "config.json: d_model 32 is not divisible by decoder_attention_heads 5",
    ),
    "dropout above 1": (
        _edit_json("config.json", dropout=2),
        "config.json: dropout 2 is not a probability",
    ),
    "flag not a boolean": (
        _edit_json("config.json", scale_embedding="yes"),
        "config.json: scale_embedding 'yes' is not true or false",
    ),
    "pre-norm asked of Marian": (
        _edit_json("config.json", normalize_before=True),
        "config.json: normalize_before true: transformers' MarianMT ignores it",
    ),
    "no eos id": (
        _edit_json("config.json", eos_token_id=[]),
        "config.json: eos_token_id [] is not an id of vocab.json",
    ),
    "tokenizer_config.json not an object": (
        _write("tokenizer_config.json", b"[]"),
        "tokenizer_config.json: not a JSON object",
    ),
    "separate_vocabs not a boolean": (
        _edit_json("tokenizer_config.json", separate_vocabs="no"),
        "tokenizer_config.json: separate_vocabs 'no' is not true or false",
    ),
    "source_lang not a code": (
        _edit_json("tokenizer_config.json", source_lang=7),
        "tokenizer_config.json: source_lang 7 is not a language code",
    ),
    "lang_pairs not pairs": (
        _edit_json("tokenizer_config.json", lang_pairs=["en"]),
        "tokenizer_config.json: lang_pairs: 'en' is not a pair SRC-TGT",
    ),
    "vocab.json not JSON": (_write("vocab.json", b"{"), "vocab.json: not valid JSON"),
    "vocab.json an entry short": (
        lambda d: (d / "vocab.json").write_text(
            json.dumps({p: i for p, i in json.loads((d / "vocab.json").read_text()).items() if i})
        ),
        "vocab.json: the ids are not 0..",
    ),
    "vocab.json of a larger model": (
        _edit_json("vocab.json", **{"▁extra": 534}),  # ids 0..533 are the model's
        "vocab.json: 535 entries, the model's embeddings 534 rows",
    ),
    "source.spm not SentencePiece": (
        _write("source.spm", b"\x00garbage"),
        "source.spm (with vocab.json): not a SentencePiece model",
    ),
    "truncated target.spm": (
        _truncate("target.spm"),
        "target.spm (with vocab.json): not a SentencePiece model",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_every_bad_file_is_one_line_naming_it(opus_like, tmp_path, capsys, case):
    break_it, expected = BAD_FILES[case]
    broken = tmp_path / "opus-mt-en-de"
    shutil.copytree(opus_like, broken)
    break_it(broken)
    out = tmp_path / "out"
    assert import_main([str(broken), "--from", "huggingface", "--output-dir", str(out)]) == 1
    line = _error(capsys)
    assert line.startswith(f"nmt-import: error: {broken}/") and expected in line, line
    assert not out.exists()
