"""nmt-import --from fairseq: a checkpoint in fairseq's layout (its documented parameter names, its
args as an argparse.Namespace, built here: fairseq itself is not installed) imports with fairseq's
logits, computed by a reference forward written from fairseq's TransformerModel; errors are one line."""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import pathlib
import sys
import types
import zipfile

import pytest
import sentencepiece as sentencepiece_lib
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import load_checkpoint
from nmt.config import ModelConfig
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, SentencePieceModel
from nmt.deploy.fairseq import read_dictionary
from nmt.deploy.huggingface import our_logits
from nmt.model import build_model
from nmt_cli.import_model import main as import_main

DIM, FFN, HEADS, MAX_POS = 32, 64, 4, 64
FAIRSEQ_PAD, FAIRSEQ_EOS = 1, 2


def _fairseq_sinusoids(num: int, dim: int, padding_idx: int) -> torch.Tensor:
    """fairseq's SinusoidalPositionalEmbedding.get_embedding."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(num, dtype=torch.float)[:, None] * freqs[None, :]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    table[padding_idx] = 0
    return table


def _state(vocab: int, *, learned: bool, prenorm: bool, layers: int = 2) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state: dict[str, torch.Tensor] = {}

    def linear(name: str, out_dim: int, in_dim: int) -> None:
        state[f"{name}.weight"] = torch.randn(out_dim, in_dim) * in_dim**-0.5
        state[f"{name}.bias"] = torch.randn(out_dim) * 0.1

    def norm(name: str) -> None:
        state[f"{name}.weight"] = 1 + torch.randn(DIM) * 0.1
        state[f"{name}.bias"] = torch.randn(DIM) * 0.1

    embed = torch.randn(vocab, DIM) * DIM**-0.5
    embed[FAIRSEQ_PAD] = 0
    for side in ("encoder", "decoder"):
        state[f"{side}.embed_tokens.weight"] = embed  # --share-all-embeddings
        if learned:
            state[f"{side}.embed_positions.weight"] = torch.randn(MAX_POS + 2, DIM) * 0.1
        else:
            state[f"{side}.embed_positions._float_tensor"] = torch.zeros(1)
        state[f"{side}.version"] = torch.tensor([3.0])
        for index in range(layers):
            prefix = f"{side}.layers.{index}"
            attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for attention in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(f"{prefix}.{attention}.{proj}", DIM, DIM)
                norm(f"{prefix}.{attention}_layer_norm")
            linear(f"{prefix}.fc1", FFN, DIM)
            linear(f"{prefix}.fc2", DIM, FFN)
            norm(f"{prefix}.final_layer_norm")
        if prenorm:
            norm(f"{side}.layer_norm")
    state["decoder.output_projection.weight"] = embed
    return state


def _attention(state, prefix, x, memory, key_padding, causal):
    """fairseq's MultiheadAttention: q scaled after its projection, key bias kept."""
    q = F.linear(x, state[f"{prefix}.q_proj.weight"], state[f"{prefix}.q_proj.bias"])
    k = F.linear(memory, state[f"{prefix}.k_proj.weight"], state[f"{prefix}.k_proj.bias"])
    v = F.linear(memory, state[f"{prefix}.v_proj.weight"], state[f"{prefix}.v_proj.bias"])
    batch, tq, tk = x.shape[0], x.shape[1], memory.shape[1]
    q = q.view(batch, tq, HEADS, -1).transpose(1, 2) * (DIM // HEADS) ** -0.5
    k = k.view(batch, tk, HEADS, -1).transpose(1, 2)
    v = v.view(batch, tk, HEADS, -1).transpose(1, 2)
    scores = q @ k.transpose(-1, -2)
    if key_padding is not None:
        scores = scores.masked_fill(key_padding[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(tq, tk, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, tq, DIM)
    return F.linear(out, state[f"{prefix}.out_proj.weight"], state[f"{prefix}.out_proj.bias"])


def _reference_logits(state, src, prev, *, learned, prenorm, layers=2):
    """fairseq's TransformerModel forward (eval), src/prev in fairseq ids; prev starts with EOS."""

    def ln(name, x):
        return F.layer_norm(x, (DIM,), state[f"{name}.weight"], state[f"{name}.bias"])

    def embed(side, tokens):
        mask = tokens.ne(FAIRSEQ_PAD).long()
        positions = torch.cumsum(mask, dim=1) * mask + FAIRSEQ_PAD  # make_positions: from pad + 1
        table = (
            state[f"{side}.embed_positions.weight"]
            if learned
            else _fairseq_sinusoids(MAX_POS + 2, DIM, FAIRSEQ_PAD)
        )
        return state[f"{side}.embed_tokens.weight"][tokens] * math.sqrt(DIM) + table[positions]

    def block(name, x, sublayer):
        if prenorm:
            return x + sublayer(ln(name, x))
        return ln(name, x + sublayer(x))

    def ffn(prefix, h):
        hidden = F.relu(F.linear(h, state[f"{prefix}.fc1.weight"], state[f"{prefix}.fc1.bias"]))
        return F.linear(hidden, state[f"{prefix}.fc2.weight"], state[f"{prefix}.fc2.bias"])

    padding = src.eq(FAIRSEQ_PAD)
    x = embed("encoder", src)
    for index in range(layers):
        p = f"encoder.layers.{index}"
        x = block(
            f"{p}.self_attn_layer_norm",
            x,
            lambda h, p=p: _attention(state, f"{p}.self_attn", h, h, padding, False),
        )
        x = block(f"{p}.final_layer_norm", x, lambda h, p=p: ffn(p, h))
    memory = ln("encoder.layer_norm", x) if prenorm else x
    y = embed("decoder", prev)
    for index in range(layers):
        p = f"decoder.layers.{index}"
        y = block(
            f"{p}.self_attn_layer_norm",
            y,
            lambda h, p=p: _attention(state, f"{p}.self_attn", h, h, None, True),
        )
        y = block(
            f"{p}.encoder_attn_layer_norm",
            y,
            lambda h, p=p: _attention(state, f"{p}.encoder_attn", h, memory, padding, False),
        )
        y = block(f"{p}.final_layer_norm", y, lambda h, p=p: ffn(p, h))
    if prenorm:
        y = ln("decoder.layer_norm", y)
    return y @ state["decoder.output_projection.weight"].T


@pytest.fixture(scope="module")
def fairseq_vocab(tmp_path_factory):
    """A SentencePiece model as spm_train makes it (unk 0, bos 1, eos 2) and fairseq's dict.txt over
    it: pieces by count, padded to a multiple of 8 with madeupwords as fairseq-preprocess does."""
    root = tmp_path_factory.mktemp("fairseq")
    lines = [
        f"the {w} sees a {v} near the {u}"
        for w in ("dog", "cat", "man", "boy")
        for v in ("tree", "ball", "house")
        for u in ("lake", "road", "park", "city")
    ] * 5
    model = io.BytesIO()
    sentencepiece_lib.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=40,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (root / "spm.model").write_bytes(model.getvalue())
    processor = sentencepiece_lib.SentencePieceProcessor(model_proto=model.getvalue())
    counts: dict[str, int] = {}
    for line in lines:
        for piece in processor.encode(line, out_type=str):
            counts[piece] = counts.get(piece, 0) + 1
    entries = sorted(counts, key=lambda piece: (-counts[piece], piece))
    padding = (-(len(entries) + 4)) % 8
    text = "".join(f"{piece} {counts[piece]}\n" for piece in entries)
    text += "".join(f"madeupword{index:04d} 0\n" for index in range(padding))
    (root / "dict.txt").write_text(text, encoding="utf-8")
    return root, lines, processor


def _fairseq_args(*, learned, prenorm, layers=2, **changes):
    """fairseq's args of a transformer as ``_state`` makes it; ``changes`` override (None: absent)."""
    args = argparse.Namespace(
        arch="transformer",
        encoder_embed_dim=DIM,
        decoder_embed_dim=DIM,
        encoder_ffn_embed_dim=FFN,
        decoder_ffn_embed_dim=FFN,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        activation_fn="relu",
        dropout=0.3,
        attention_dropout=0.0,
        activation_dropout=0.0,
        encoder_normalize_before=prenorm,
        decoder_normalize_before=prenorm,
        encoder_learned_pos=learned,
        decoder_learned_pos=learned,
        max_source_positions=MAX_POS,
        max_target_positions=MAX_POS,
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        no_scale_embedding=False,
        layernorm_embedding=False,
        source_lang="en",
        target_lang="de",
    )
    for name, value in changes.items():
        if value is None:
            delattr(args, name)
        else:
            setattr(args, name, value)
    return args


def _save_fairseq(path, state, *, learned, prenorm, layers=2, **changes):
    args = _fairseq_args(learned=learned, prenorm=prenorm, layers=layers, **changes)
    torch.save(
        {"args": args, "model": state, "optimizer_history": [], "extra_state": {"epoch": 3}},
        str(path),
    )


@pytest.mark.parametrize("learned,prenorm", [(False, False), (True, True)])
def test_fairseq_checkpoint_imports_with_fairseq_logits(fairseq_vocab, tmp_path, learned, prenorm):
    root, lines, processor = fairseq_vocab
    pieces = read_dictionary(str(root / "dict.txt"))
    assert len(pieces) % 8 == 0
    state = _state(len(pieces), learned=learned, prenorm=prenorm)
    _save_fairseq(tmp_path / "checkpoint_best.pt", state, learned=learned, prenorm=prenorm)
    assert (
        import_main(
            [
                str(tmp_path / "checkpoint_best.pt"),
                "--from",
                "fairseq",
                "--dict",
                str(root / "dict.txt"),
                "--spm-model",
                str(root / "spm.model"),
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    ours = load_checkpoint(str(tmp_path / "out" / "checkpoint.pt"))
    cfg = ModelConfig(**ours["model_config"])
    assert cfg.decoder_start_id == EOS_ID and cfg.share_all_embeddings
    model = build_model(cfg).eval()
    model.load_state_dict(ours["model"])
    fairseq_id = {piece: index for index, piece in enumerate(pieces)}
    spm = SentencePieceModel(bytes(ours["vocab"]["src_spm"].numpy()))
    sources = [lines[0], lines[7], "the dog sees a ball"]
    fs_src = [
        [fairseq_id[p] for p in processor.encode(s, out_type=str)] + [FAIRSEQ_EOS] for s in sources
    ]
    width = max(map(len, fs_src))
    src = torch.full((3, width), FAIRSEQ_PAD)
    for row, ids in enumerate(fs_src):
        src[row, : len(ids)] = torch.tensor(
            ids
        )  # fairseq pads on the right with left_pad_source False
    target = [fairseq_id[p] for p in processor.encode(lines[3], out_type=str)]
    prev = torch.tensor([[FAIRSEQ_EOS] + target] * 3)
    expected = _reference_logits(state, src, prev, learned=learned, prenorm=prenorm)
    # ours: the same text through our SentencePiece model; ids differ, the pieces do not
    our_src = [ids + [EOS_ID] for ids in spm.encode(sources)]
    assert [[spm.processor.id_to_piece(i) for i in ids] for ids in our_src] == [
        [pieces[i] for i in ids] for ids in fs_src
    ]
    src_ours = torch.full((3, width), PAD_ID)
    for row, ids in enumerate(our_src):
        src_ours[row, : len(ids)] = torch.tensor(ids)
    prev_ours = torch.tensor([[BOS_ID] + spm.encode([lines[3]])[0]] * 3)
    logits = our_logits(model, src_ours, torch.tensor(list(map(len, our_src))), prev_ours)
    ours_of_fairseq = [spm.processor.piece_to_id(piece) for piece in pieces]
    ours_of_fairseq[:4] = [BOS_ID, PAD_ID, EOS_ID, 3]
    assert (logits[..., torch.tensor(ours_of_fairseq)] - expected).abs().max() < 1e-4


class _RunsCode:
    """Unpickling it makes a directory: proof that code from the file ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _save_with_omegaconf(path, state):
    """A checkpoint whose cfg pickle names omegaconf.DictConfig (omegaconf is not installed here)."""
    module = types.ModuleType("omegaconf")

    class DictConfig(dict):
        pass

    DictConfig.__module__, DictConfig.__qualname__ = "omegaconf", "DictConfig"
    module.DictConfig = DictConfig
    sys.modules["omegaconf"] = module  # pickle finds the class by its module to save it
    try:
        return _save(path, {"model": state, "cfg": DictConfig(model={})})
    finally:
        del sys.modules["omegaconf"]


@dataclasses.dataclass
class _Good:
    """What a bad input is made from: a good checkpoint's weights and file, its dict.txt."""

    state: dict
    checkpoint: pathlib.Path
    dictionary: pathlib.Path


def _write(path, data):
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data, encoding="utf-8")
    return path


def _checkpoint_with(path, good, **changes):
    """The good checkpoint with some args changed and ``model`` given or built by ``edit``."""
    edit = changes.pop("edit", None)
    state = dict(good.state)
    if edit:
        edit(state)
    _save_fairseq(path, state, learned=False, prenorm=False, **changes)
    return path


def _resized(key, shape):
    def edit(state):
        state[key] = torch.zeros(shape)

    return edit


def _truncated_legacy(directory, good):
    path = directory / "model.pt"
    torch.save({"model": good.state}, str(path), _use_new_zipfile_serialization=False)
    return _write(path, path.read_bytes()[: path.stat().st_size // 2])


def _zip_of_text(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes/readme.txt", "not a checkpoint")
    return path


def _save(path, payload):
    torch.save(payload, str(path))
    return path


ARGS = _fairseq_args(learned=False, prenorm=False)
QKV = "encoder.layers.0.self_attn.q_proj/k_proj/v_proj.weight"
# case -> (make the bad checkpoint file in a directory from the good inputs, the error after "PATH: ")
BAD_CHECKPOINTS = {
    "missing": (lambda d, g: d / "nothing.pt", "no such checkpoint file"),
    "directory": (lambda d, g: d, "a directory, not a checkpoint file"),
    "text": (
        lambda d, g: _write(d / "model.pt", "a checkpoint\n"),
        "not a fairseq checkpoint (a text file)",
    ),
    "empty": (lambda d, g: _write(d / "model.pt", b""), "not a fairseq checkpoint (an empty file)"),
    "binary": (
        lambda d, g: _write(d / "model.pt", bytes(range(256))),
        "not a fairseq checkpoint (neither a zip archive nor a pickle, as torch.save writes)",
    ),
    "truncated": (
        lambda d, g: _write(d / "model.pt", g.checkpoint.read_bytes()[:-100]),
        "not a fairseq checkpoint (a truncated or damaged zip archive)",
    ),
    "truncated-legacy-format": (
        _truncated_legacy,
        "not a fairseq checkpoint (truncated or damaged: unexpected EOF, expected ",
    ),
    "other-zip": (
        lambda d, g: _zip_of_text(d / "model.pt"),
        "not a fairseq checkpoint (a zip archive without torch's data.pkl)",
    ),
    "runs-code": (
        lambda d, g: _save(d / "model.pt", {"model": g.state, "x": _RunsCode(str(d / "ran"))}),
        f"not a fairseq checkpoint (loading it would import {os.mkdir.__module__}.mkdir; only "
        "tensors and plain data are loaded, so that no code from a file runs)",
    ),
    "omegaconf": (
        lambda d, g: _save_with_omegaconf(d / "model.pt", g.state),
        "not a fairseq checkpoint (loading it would import omegaconf.DictConfig; only tensors and "
        "plain data are loaded, so that no code from a file runs); a checkpoint holding omegaconf "
        "objects can be rewritten with plain dicts by fairseq's "
        "checkpoint_utils.torch_persistent_save after OmegaConf.to_container",
    ),
    "no-model": (
        lambda d, g: _save(d / "model.pt", {"args": ARGS}),
        "not a fairseq checkpoint (no 'model' entry)",
    ),
    "model-not-tensors": (
        lambda d, g: _save(d / "model.pt", {"args": ARGS, "model": {"encoder.layers.0.fc1": 1}}),
        "not a fairseq checkpoint (its 'model' is not a dict of tensors)",
    ),
    "no-options": (
        lambda d, g: _save(d / "model.pt", {"model": g.state}),
        "a fairseq checkpoint without its model options ('args' or 'cfg')",
    ),
    "lstm": (
        lambda d, g: _checkpoint_with(d / "model.pt", g, arch="lstm"),
        "a fairseq lstm model; nmt imports fairseq's transformer (--arch transformer*)",
    ),
    "decoder-only": (
        lambda d, g: _save(
            d / "model.pt",
            {"args": ARGS, "model": {k: v for k, v in g.state.items() if k.startswith("decoder")}},
        ),
        "not a fairseq transformer (no encoder.layers.* weights)",
    ),
    "option-missing": (
        lambda d, g: _checkpoint_with(d / "model.pt", g, encoder_layers=None),
        "fairseq option encoder_layers is missing (not a transformer's options?)",
    ),
    "option-not-a-number": (
        lambda d, g: _checkpoint_with(d / "model.pt", g, encoder_ffn_embed_dim="wide"),
        "fairseq option encoder_ffn_embed_dim is 'wide', not a number (not a transformer's options?)",
    ),
    "options-make-no-model": (
        lambda d, g: _checkpoint_with(d / "model.pt", g, encoder_attention_heads=5),
        f"its options make no nmt model (--encoder-embed-dim: ({DIM}) must be divisible by "
        "--encoder-attention-heads (5))",
    ),
    "unsupported-option": (
        lambda d, g: _checkpoint_with(d / "model.pt", g, layernorm_embedding=True),
        "fairseq's --layernorm-embedding has no counterpart in nmt's transformer",
    ),
    "missing-tensor": (
        lambda d, g: _checkpoint_with(
            d / "model.pt", g, edit=lambda s: s.pop("encoder.layers.1.fc2.bias")
        ),
        "no encoder.layers.1.fc2.bias in the checkpoint (not the transformer its options describe)",
    ),
    "extra-tensor": (
        lambda d, g: _checkpoint_with(
            d / "model.pt", g, edit=_resized("encoder.layernorm_embedding.weight", (DIM,))
        ),
        "encoder.layernorm_embedding.weight has no counterpart in nmt's transformer",
    ),
    "tensor-of-another-size": (
        lambda d, g: _checkpoint_with(
            d / "model.pt", g, edit=_resized("encoder.layers.0.fc1.weight", (FFN + 1, DIM))
        ),
        f"its tensors do not fit its options (nmt's encoder.layers.0.ffn.fc1.weight would be "
        f"({FFN + 1}, {DIM}), its options make it ({FFN}, {DIM}))",
    ),
    "projections-of-other-sizes": (
        lambda d, g: _checkpoint_with(
            d / "model.pt",
            g,
            edit=_resized("encoder.layers.0.self_attn.k_proj.weight", (DIM, DIM + 1)),
        ),
        f"{QKV} differ in shape (({DIM}, {DIM}), ({DIM}, {DIM + 1}), ({DIM}, {DIM}))",
    ),
}


@pytest.fixture()
def good(fairseq_vocab, tmp_path):
    root, _, _ = fairseq_vocab
    state = _state(len(read_dictionary(str(root / "dict.txt"))), learned=False, prenorm=False)
    _save_fairseq(tmp_path / "ok.pt", state, learned=False, prenorm=False)
    return _Good(state=state, checkpoint=tmp_path / "ok.pt", dictionary=root / "dict.txt")


def _one_line_error(argv, capsys):
    assert import_main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _import_argv(checkpoint, dictionary, good, tmp_path):
    return [
        str(checkpoint),
        "--from",
        "fairseq",
        "--dict",
        str(dictionary),
        "--spm-model",
        str(good.dictionary.parent / "spm.model"),
        "--output-dir",
        str(tmp_path / "out"),
    ]


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_each_bad_checkpoint_is_one_line_naming_it(good, tmp_path, capsys, case):
    make, message = BAD_CHECKPOINTS[case]
    bad = tmp_path / "bad"
    bad.mkdir()
    path = make(bad, good)
    line = _one_line_error(_import_argv(path, good.dictionary, good, tmp_path), capsys)
    assert line.startswith(f"nmt-import: error: {path}: {message}"), line
    assert not (bad / "ran").exists()
    assert not (tmp_path / "out").exists()


def _dictionary(good, edit):
    lines = good.dictionary.read_text(encoding="utf-8").split("\n")
    return "\n".join(edit(lines))


# case -> (the --dict file's content, or None for none at all; the error after "nmt-import: error: ")
BAD_DICTIONARIES = {
    "missing": (None, "--dict: cannot read {path}: No such file or directory"),
    "not-piece-count": (
        lambda g: _dictionary(g, lambda lines: lines[:2] + ["▁the"] + lines[2:]),
        "{path}, line 3: not 'piece count' (a fairseq dict.txt?)",
    ),
    "count-not-a-number": (
        lambda g: _dictionary(g, lambda lines: [lines[0].split(" ")[0] + " many"] + lines[1:]),
        "{path}, line 1: not 'piece count' (a fairseq dict.txt?)",
    ),
    "piece-twice": (
        lambda g: _dictionary(g, lambda lines: lines[:4] + [lines[1]] + lines[4:]),
        "{path}, line 5: {piece} again (also in line 2)",
    ),
    "special-symbol": (
        lambda g: _dictionary(g, lambda lines: ["</s> 7"] + lines),
        "{path}, line 1: '</s>' again (also in fairseq's special symbols)",
    ),
    "not-utf8": (lambda g: b"\xff\xfe 3\n", "{path}: not a fairseq dictionary (not UTF-8 text)"),
    "empty": (lambda g: "", "{path}: an empty fairseq dictionary (no 'piece count' line)"),
    "another-models": (
        lambda g: _dictionary(g, lambda lines: lines[:10]),
        "{path} with {spm}: the vocabulary and the SentencePiece model do not match",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DICTIONARIES))
def test_each_bad_dictionary_is_one_line_naming_it(good, tmp_path, capsys, case):
    content, message = BAD_DICTIONARIES[case]
    path = tmp_path / "dict.txt"
    if content is not None:
        _write(path, content(good))
    piece = good.dictionary.read_text(encoding="utf-8").split("\n")[1].split(" ")[0]
    line = _one_line_error(_import_argv(good.checkpoint, path, good, tmp_path), capsys)
    expected = message.format(
        path=path, spm=good.dictionary.parent / "spm.model", piece=repr(piece)
    )
    assert line.startswith(f"nmt-import: error: {expected}"), line
    assert not (tmp_path / "out").exists()
