"""transformers' MarianMT <-> our checkpoints: two pure mappings of state dicts, the tokenizer files,
and the proof, at every export and import, that the converted model's logits equal the source's.

How the two models correspond (``nmt.model.transformer`` and transformers' ``modeling_marian.py``):

- both are post-norm encoder-decoders with scaled embeddings, sinusoidal positions from 0, biased
  projections and no final layer norms; Marian has no pre-norm, so a pre-norm side is an error;
- attention: our fused QKV/KV projections split into q/k/v; our key bias is masked to zero (a key
  bias adds the same score to every key of a query, which softmax removes), so theirs is exported
  as zeros and dropped on import, exactly;
- token ids: an export keeps ours (pad 0, bos 1, eos 2, unk 3) and says so in config.json
  (``decoder_start_token_id`` 1: our decoder starts from BOS where Marian's starts from pad). An
  import reorders the vocabulary to ours (``nmt.deploy.foreign_vocab``): Marian's pad becomes our
  PAD and, when it is also the decoder start (OPUS-MT's convention: a zero embedding), the model's
  ``decoder_start_id`` is PAD; our BOS is then a new zero row the model never reads;
- positions: transformers computes Marian's sinusoids itself (10000^(-2i/d)), which are not
  fairseq's (10000^(-i/(d/2-1))) that our models use by default. A model with
  ``--sinusoidal-positions marian`` exports natively. Any other table (fairseq's sinusoids, learned
  positions) is written into model.safetensors as ``embed_positions.weight``: transformers loads a
  stored table (checked by the export's logits test), but its ``save_pretrained`` leaves that table
  out again (``_keys_to_ignore_on_save``), so a model re-saved by transformers gets Marian's
  sinusoids back: the model card says so;
- Marian's ``final_logits_bias`` is our output bias (``output_bias``), absent when zero;
- a multilingual model's target-language tag ``<2de>`` is, in vocab.json, the token OPUS-MT's
  multilingual models select the target with, ``>>de<<`` (same id): MarianTokenizer keeps a leading
  ``>>de<<`` whole, which is our ``--lang-tok encoder`` layout (``<2de> pieces EOS``).
  ``--lang-tok decoder`` (the tag forced as the first target token) has no Marian request: refused.
  tokenizer_config.json records the directions (``lang_pairs``), from which nmt-import restores
  the tags.

transformers and safetensors are imported lazily (``pip install 'nmt[hf]'``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from nmt.checkpoint_io import FORMAT, VERSION, bytes_to_tensor, load_torch_file
from nmt.config import ModelConfig
from nmt.data.spm import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_IDS,
    UNK_ID,
    SentencePieceModel,
)
from nmt.deploy.common import (
    built_aside,
    fused_projections,
    layer_pairs,
    load_for_export,
    write_import,
)
from nmt.deploy.foreign_vocab import convert_vocabulary
from nmt.languages import Languages, Pair, language_tag, parse_pairs
from nmt.model import TransformerModel, build_model
from nmt.model.transformer import sinusoidal_table

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
# Logits of a converted model may differ from the source's by float rounding only: relative to the
# largest logit, measured ~1e-6 on CPU (summation order differs between the two implementations).
LOGIT_TOLERANCE = 1e-4
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}


def marian_code(lang: str) -> str:
    """The token MarianMT's multilingual models select the target language ``lang`` with."""
    return f">>{lang}<<"


def _marian_codes(targets: Sequence[str]) -> dict[str, str]:
    """Our tag -> Marian's token, for each of ``targets`` (the target languages a tag can name)."""
    return {language_tag(lang): marian_code(lang) for lang in targets}


def _tagged_targets(languages: Languages) -> list[str]:
    """The target languages a request names by a tag (none for a model of one untagged direction)."""
    return list(languages.target_tags())


def import_transformers(what: str) -> Any:
    """The ``transformers`` module, or a one-line ValueError saying how to install it."""
    try:
        import safetensors  # noqa: F401  (model.safetensors)
        import transformers
    except ImportError:
        raise ValueError(
            f"{what} needs the transformers and safetensors packages: pip install 'nmt[hf]'"
        ) from None
    transformers.logging.set_verbosity_error()  # its load report is checked here, not printed
    transformers.utils.logging.disable_progress_bar()
    return transformers


# ----------------------------------------------------------------------------- the pure mappings
def to_marian(model: TransformerModel) -> dict[str, torch.Tensor]:
    """Our model -> the state dict of transformers' ``MarianMTModel`` (tied names included, key
    biases zero, the position tables ours)."""
    cfg, ours = model.cfg, model.state_dict()
    theirs: dict[str, torch.Tensor] = {}
    for side, num_layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for index in range(num_layers):
            mine, marian = f"{side}.layers.{index}", f"model.{side}.layers.{index}"
            for our_name, their_name in layer_pairs(side):
                theirs[f"{marian}.{their_name}"] = ours[f"{mine}.{our_name}"]
            for fused, attention, parts in fused_projections(side):
                for kind in ("weight", "bias"):
                    chunks = ours[f"{mine}.{fused}.{kind}"].chunk(len(parts), dim=0)
                    for part, chunk in zip(parts, chunks):
                        theirs[f"{marian}.{attention}.{part}.{kind}"] = (
                            torch.zeros_like(chunk)
                            if part == "k_proj" and kind == "bias"
                            else chunk
                        )
        embed = getattr(model, side).embed
        theirs[f"model.{side}.embed_tokens.weight"] = embed.tokens.weight.detach()
        theirs[f"model.{side}.embed_positions.weight"] = embed.positions.detach()
    if cfg.share_all_embeddings:
        theirs["model.shared.weight"] = theirs["model.encoder.embed_tokens.weight"]
    theirs["lm_head.weight"] = ours["output_projection.weight"]
    bias = ours.get("output_projection.bias")
    theirs["final_logits_bias"] = (
        torch.zeros(1, cfg.tgt_vocab_size) if bias is None else bias.detach()[None, :]
    )
    return theirs


def from_marian(
    theirs: dict[str, torch.Tensor],
    cfg: ModelConfig,
    *,
    src_ids: Sequence[int],
    tgt_ids: Sequence[int],
) -> dict[str, torch.Tensor]:
    """The state dict of ``MarianMTModel`` -> ours for ``cfg`` (``from_marian_config``). ``src_ids``
    and ``tgt_ids`` map each Marian id to ours; rows of ours that no Marian id fills stay zero."""
    ours: dict[str, torch.Tensor] = {}

    def rows(table: torch.Tensor, ids: Sequence[int], size: int) -> torch.Tensor:
        out = table.new_zeros(size, *table.shape[1:])
        out[torch.tensor(list(ids))] = table
        return out

    for side, num_layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for index in range(num_layers):
            mine, marian = f"{side}.layers.{index}", f"model.{side}.layers.{index}"
            for our_name, their_name in layer_pairs(side):
                ours[f"{mine}.{our_name}"] = theirs[f"{marian}.{their_name}"]
            for fused, attention, parts in fused_projections(side):
                for kind in ("weight", "bias"):
                    ours[f"{mine}.{fused}.{kind}"] = torch.cat(
                        [
                            torch.zeros_like(theirs[f"{marian}.{attention}.{part}.{kind}"])
                            if part == "k_proj" and kind == "bias"
                            else theirs[f"{marian}.{attention}.{part}.{kind}"]
                            for part in parts
                        ]
                    )
        ids, size = (
            (src_ids, cfg.src_vocab_size) if side == "encoder" else (tgt_ids, cfg.tgt_vocab_size)
        )
        ours[f"{side}.embed.tokens.weight"] = rows(
            theirs[f"model.{side}.embed_tokens.weight"], ids, size
        )
        if getattr(cfg, f"{side}_learned_pos"):
            ours[f"{side}.embed.positions"] = theirs[f"model.{side}.embed_positions.weight"]
    ours["output_projection.weight"] = rows(theirs["lm_head.weight"], tgt_ids, cfg.tgt_vocab_size)
    if cfg.output_bias:
        ours["output_projection.bias"] = rows(
            theirs["final_logits_bias"][0], tgt_ids, cfg.tgt_vocab_size
        )
    return ours


def marian_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json of ``MarianMTModel`` for our ``cfg`` (ValueError for what Marian cannot express)."""
    for side in ("encoder", "decoder"):
        if getattr(cfg, f"{side}_normalize_before"):
            raise ValueError(
                f"--{side}-normalize-before: MarianMT is post-norm only; a pre-norm model cannot be "
                "exported to it"
            )
    if cfg.encoder_embed_dim != cfg.decoder_embed_dim:
        raise ValueError(
            f"--decoder-embed-dim: MarianMT has one d_model; this model's encoder has "
            f"{cfg.encoder_embed_dim}, its decoder {cfg.decoder_embed_dim}"
        )
    return dict(
        architectures=["MarianMTModel"],
        model_type="marian",
        vocab_size=cfg.src_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        share_encoder_decoder_embeddings=cfg.share_all_embeddings,
        tie_word_embeddings=cfg.share_all_embeddings or cfg.share_decoder_input_output_embed,
        d_model=cfg.encoder_embed_dim,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.encoder_attention_heads,
        decoder_attention_heads=cfg.decoder_attention_heads,
        encoder_ffn_dim=cfg.encoder_ffn_embed_dim,
        decoder_ffn_dim=cfg.decoder_ffn_embed_dim,
        activation_function=cfg.activation_fn,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        max_position_embeddings=max(cfg.max_source_positions, cfg.max_target_positions),
        scale_embedding=not cfg.no_scale_embedding,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID if cfg.decoder_start_id is None else cfg.decoder_start_id,
    )


def from_marian_config(
    config: dict[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    positions: tuple[str, str],
    output_bias: bool,
    decoder_start_id: int | None,
) -> ModelConfig:
    """Our ``ModelConfig`` for a Marian config.json checked by ``_check_marian_config``.
    ``positions``: per side, "marian" (the table transformers computes), "fairseq" (our default
    sinusoids, as our exports store them) or "learned" (any other stored table)."""
    activation = _ACTIVATIONS[config.get("activation_function", "gelu")]
    share_embeddings = bool(config.get("share_encoder_decoder_embeddings", True))
    tied_output = bool(config.get("tie_word_embeddings", True))
    share_all = share_embeddings and tied_output and src_vocab_size == tgt_vocab_size
    sinusoids = {"marian", "fairseq"} & set(positions)
    if len(sinusoids) > 1:  # one formula per model: a fairseq table is kept as learned
        positions = tuple("learned" if kind == "fairseq" else kind for kind in positions)
    max_positions = int(config.get("max_position_embeddings", 1024))
    return ModelConfig(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=PAD_ID,
        encoder_layers=int(config["encoder_layers"]),
        decoder_layers=int(config["decoder_layers"]),
        encoder_embed_dim=int(config["d_model"]),
        decoder_embed_dim=int(config["d_model"]),
        encoder_ffn_embed_dim=int(config["encoder_ffn_dim"]),
        decoder_ffn_embed_dim=int(config["decoder_ffn_dim"]),
        encoder_attention_heads=int(config["encoder_attention_heads"]),
        decoder_attention_heads=int(config["decoder_attention_heads"]),
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        activation_fn=activation,
        encoder_learned_pos=positions[0] == "learned",
        decoder_learned_pos=positions[1] == "learned",
        sinusoidal_positions="marian" if "marian" in positions else "fairseq",
        max_source_positions=max_positions,
        max_target_positions=max_positions,
        no_scale_embedding=not config.get("scale_embedding", False),
        share_all_embeddings=share_all,
        share_decoder_input_output_embed=tied_output,
        output_bias=output_bias,
        decoder_start_id=decoder_start_id,
    )


def position_kind(table: torch.Tensor) -> str:
    """Which of our position encodings a Marian position table is: "marian", "fairseq" or "learned"."""
    for formula in ("marian", "fairseq"):
        if torch.allclose(table, sinusoidal_table(*table.shape, formula=formula), atol=1e-6):
            return formula
    return "learned"


# ----------------------------------------------------------------------------- the proof
def _probe(vocab_size: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of ordinary token ids (B, 23), the second padded after 17: padding and masks are tested."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab_size, (2, 23), generator=generator)
    tokens[:, -1] = EOS_ID
    tokens[1, 16] = EOS_ID
    tokens[1, 17:] = PAD_ID
    return tokens, torch.tensor([23, 17])


def _foreign_probe(
    vocab_size: int, specials: dict[str, int], *, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_probe`` in a foreign numbering: ordinary ids drawn among the non-special ones."""
    ordinary = torch.tensor(sorted(set(range(vocab_size)) - set(specials.values())))
    tokens, lengths = _probe(len(ordinary) + 4, seed=seed)
    tokens = ordinary[(tokens - 4).clamp(min=0)]
    tokens[:, -1] = specials["eos"]
    tokens[1, 16] = specials["eos"]
    tokens[1, 17:] = specials["pad"]
    return tokens, lengths


@torch.no_grad()
def our_logits(
    model: TransformerModel, src: torch.Tensor, src_lengths: torch.Tensor, prev: torch.Tensor
) -> torch.Tensor:
    """Teacher-forced logits (B, T, V) of our model, padded layout."""
    lengths = torch.full((prev.shape[0],), prev.shape[1])
    return model.output_projection(model(src, src_lengths, prev, lengths))


@torch.no_grad()
def marian_logits(
    hf_model: Any, src: torch.Tensor, src_lengths: torch.Tensor, prev: torch.Tensor
) -> torch.Tensor:
    mask = (torch.arange(src.shape[1])[None, :] < src_lengths[:, None]).long()
    return hf_model(input_ids=src, attention_mask=mask, decoder_input_ids=prev).logits


def check_logits(
    ours: torch.Tensor, theirs: torch.Tensor, *, tgt_ids: Sequence[int], name: str
) -> float:
    """Max |difference| of our logits at Marian's ids against Marian's; ValueError past the tolerance."""
    mapped = ours[..., torch.tensor(list(tgt_ids))]
    difference = float((mapped - theirs).abs().max())
    scale = max(1.0, float(theirs.abs().max()))
    if not difference <= LOGIT_TOLERANCE * scale:
        raise ValueError(
            f"{name}: the converted model's logits differ from the original's by {difference:.3g} "
            f"(largest logit {scale:.3g}); this transformers version computes something else"
        )
    return difference


# ----------------------------------------------------------------------------- export
def _directions_section(languages: Languages) -> list[str]:
    """The model card's list of directions and how to request each."""
    lines = [
        "## Directions",
        "",
        "Put the target language's token at the start of the source: MarianTokenizer keeps it "
        "whole and the model translates into that language (the source language is not given). "
        "The directions the model was trained on:",
        "",
        "| direction | start the source with |",
        "|---|---|",
    ]
    lines += [
        f"| {source} → {target} | `{marian_code(target)}` |"
        for source, target in ((pair.source, pair.target) for pair in languages.directions)
    ]
    return lines + [
        "",
        "Other pairs of these languages were never trained (zero-shot, if at all).",
    ]


def _card(
    loaded: Any,
    *,
    languages: Languages,
    output_dir: str,
    native_positions: bool,
    scores: str | None,
) -> str:
    title = f"{', '.join(languages.pairs)} translation model"
    request = marian_code(languages.first.target) + " " if languages.tagged else ""
    provenance = loaded.state.get("provenance") or {}
    command = provenance.get("command_line") or provenance.get("argv")
    if isinstance(command, list):
        command = shlex.join(command)
    train_config = loaded.state.get("train_config") or {}
    data_dir = (train_config.get("data") or {}).get("data_dir")
    cfg = loaded.model.cfg
    lines = [
        "---",
        "language:\n" + "\n".join(f"- {lang}" for lang in languages.codes),
        "tags:\n- translation\n- nmt",
        "library_name: transformers",
        "pipeline_tag: translation",
        "---",
        "",
        f"# {title} (nmt)",
        "",
        f"A transformer trained with [nmt](https://github.com/) and exported with `nmt-export "
        f"--format huggingface` from `{loaded.name}`: {cfg.encoder_layers}+{cfg.decoder_layers} layers, "
        f"d_model {cfg.encoder_embed_dim}, FFN {cfg.encoder_ffn_embed_dim}, "
        f"{cfg.encoder_attention_heads} heads, {cfg.activation_fn}, "
        f"{sum(p.numel() for p in loaded.model.parameters()) / 1e6:.1f}M parameters.",
        "",
        "## Use",
        "",
        "```python",
        "from transformers import MarianMTModel, MarianTokenizer",
        "",
        f'tokenizer = MarianTokenizer.from_pretrained("{os.path.basename(output_dir)}")',
        f'model = MarianMTModel.from_pretrained("{os.path.basename(output_dir)}")',
        f'batch = tokenizer(["{request}A dog runs on the beach."], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch, num_beams=5), skip_special_tokens=True))",
        "```",
        "",
        "nmt's search settings are in generation_config.json (beam 5, length penalty 1, PAD and BOS "
        "never generated). MarianTokenizer normalises punctuation with sacremoses when that package "
        "is installed; nmt did not, so leave sacremoses out to get nmt's tokens.",
        "",
        *(_directions_section(languages) + [""] if languages.tagged else []),
        "## Training",
        "",
        f"- data: {data_dir or 'not recorded in the checkpoint'}",
        f"- command: `{command}`" if command else "- command: not recorded in the checkpoint",
    ]
    versions = provenance.get("versions")
    if versions:
        lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    if provenance.get("git"):
        lines.append(f"- code revision: {provenance['git']}")
    lines += ["", "## Evaluation", ""]
    if scores:
        lines += [
            "nmt-eval's scores (sacreBLEU, with its signature):",
            "",
            "```",
            scores.strip(),
            "```",
        ]
    else:
        best = loaded.state.get("best")
        lines.append(
            "No test score was given to the export (`nmt-export --scores FILE`, the output of "
            "`nmt-eval ... --quiet`)."
            + (f" Best validation metric during training: {best}." if best is not None else "")
        )
    if not native_positions:
        lines += [
            "",
            "## Positions",
            "",
            "This model's position table is not the one MarianMT computes (nmt's default sinusoids "
            "follow fairseq), so it is stored in model.safetensors and loaded from there. "
            "transformers' `save_pretrained` does not save that table "
            "(`_keys_to_ignore_on_save`): a copy re-saved by transformers computes Marian's table "
            "instead and translates differently. Copy the files instead of re-saving, or train "
            "with `nmt-train --sinusoidal-positions marian` for a model MarianMT computes natively.",
        ]
    return "\n".join(lines) + "\n"


def _renamed(pieces: list[str], names: dict[str, str], *, name: str) -> list[str]:
    """``pieces`` with each key of ``names`` replaced by its value (ValueError when a new name is
    already a piece: two ids for one token)."""
    taken = set(pieces) & (set(names.values()) - set(names))
    if taken:
        raise ValueError(
            f"{name}: its vocabulary already has a piece {sorted(taken)[0]!r}, the name the language "
            "token needs"
        )
    return [names.get(piece, piece) for piece in pieces]


def _tokenizer_files(
    workdir: str,
    *,
    src_spm: SentencePieceModel,
    tgt_spm: SentencePieceModel,
    source_lang: str,
    target_lang: str,
    languages: Languages,
    model_max_length: int,
    name: str,
) -> None:
    from nmt.eval.ct2_model import pieces

    codes = _marian_codes(_tagged_targets(languages))
    src_pieces, tgt_pieces = (_renamed(pieces(spm), codes, name=name) for spm in (src_spm, tgt_spm))
    separate = src_pieces != tgt_pieces
    files = {"source.spm": src_spm.proto, "target.spm": tgt_spm.proto}
    for file_name, proto in files.items():
        with open(os.path.join(workdir, file_name), "wb") as handle:
            handle.write(proto)
    vocabularies = {"vocab.json": src_pieces}
    if separate:
        vocabularies["target_vocab.json"] = tgt_pieces
    for file_name, names in vocabularies.items():
        with open(os.path.join(workdir, file_name), "w", encoding="utf-8") as handle:
            json.dump(
                {piece: index for index, piece in enumerate(names)},
                handle,
                ensure_ascii=False,
                indent=1,
            )
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": source_lang,
        "target_lang": target_lang,
        "separate_vocabs": separate,
        "pad_token": tgt_pieces[PAD_ID],
        "eos_token": tgt_pieces[EOS_ID],
        "unk_token": tgt_pieces[UNK_ID],
        "model_max_length": model_max_length,
    }
    if languages.tagged:  # what nmt-import restores the directions from
        tokenizer_config["lang_pairs"] = list(languages.pairs)
    with open(os.path.join(workdir, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(tokenizer_config, handle, ensure_ascii=False, indent=2)


def _load_report(transformers: Any, directory: str) -> tuple[Any, dict[str, list[str]]]:
    # Tensors of the wrong shape are reported in ``info`` (not raised with a pointer to a log).
    model, info = transformers.MarianMTModel.from_pretrained(
        directory, output_loading_info=True, ignore_mismatched_sizes=True
    )
    problems = {
        kind: list(info.get(kind) or [])
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
    }
    return model.eval(), {kind: keys for kind, keys in problems.items() if keys}


def export_huggingface(
    checkpoints: Sequence[str], output_dir: str, *, force: bool = False, scores: str | None = None
) -> dict[str, Any]:
    """Write a MarianMT directory for transformers; returns what was checked (the logits' largest
    difference). Several checkpoints are averaged. The directory is built aside, loaded back with
    transformers and compared with our model, then renamed into place."""
    transformers = import_transformers("nmt-export --format huggingface")
    from safetensors.torch import load_file, save_file

    loaded = load_for_export(checkpoints, target="the Hugging Face export")
    model, name = loaded.model, loaded.name
    languages = Languages.from_vocab(loaded.state["vocab"])
    if languages.placement != "encoder":
        raise ValueError(
            f"{name}: --lang-tok {languages.placement}: the model reads its target-language tag as "
            "its first output token, which MarianMT cannot request (its >>xx<< token leads the "
            "source); export a model trained with --lang-tok encoder"
        )
    config = marian_config(model.cfg)
    for side, spm in (("src", loaded.src_spm), ("tgt", loaded.tgt_spm)):
        if getattr(model.cfg, f"{side}_vocab_size") != spm.vocab_size:
            raise ValueError(
                f"{name}: --{side}-vocab-size differs from its SentencePiece model's "
                f"{spm.vocab_size} pieces; MarianTokenizer needs one piece per embedding row"
            )
    scores_text = None
    if scores is not None:
        try:
            with open(scores, encoding="utf-8") as handle:
                scores_text = handle.read()
        except OSError as error:
            raise ValueError(f"--scores: cannot read {scores}: {error.strerror}") from None
    theirs = to_marian(model)
    hf_model = transformers.MarianMTModel(transformers.MarianConfig(**config)).eval()
    tables, native_positions = {}, True
    for side in ("encoder", "decoder"):  # one table size in Marian: the shorter side's is extended
        key = f"model.{side}.embed_positions.weight"
        computed = hf_model.state_dict()[key]  # the table transformers computes for itself
        table = computed.clone()
        table[: theirs[key].shape[0]] = theirs[key]
        native_positions &= torch.equal(table, computed)
        theirs[key] = tables[key] = table
    hf_model.load_state_dict(theirs, strict=True)
    hf_model.generation_config.update(
        num_beams=5,
        early_stopping=True,  # finished when the beam holds 5 hypotheses: fairseq's rule and ours
        length_penalty=1.0,
        bad_words_ids=[[PAD_ID], [BOS_ID]],  # never generated by nmt-eval either
        min_length=2,  # the start token and one more: nmt-eval's --min-len 1
        max_length=min(512, model.cfg.max_target_positions),
    )
    vocab = loaded.state["vocab"]
    with built_aside(
        output_dir,
        force=force,
        made_by="nmt-export",
        inputs=[("CKPT", path) for path in checkpoints],
    ) as workdir:
        hf_model.save_pretrained(workdir)
        if not native_positions:
            weights_path = os.path.join(workdir, "model.safetensors")
            weights = load_file(weights_path)
            weights.update({key: table.contiguous() for key, table in tables.items()})
            save_file(weights, weights_path, metadata={"format": "pt"})
        _tokenizer_files(
            workdir,
            src_spm=loaded.src_spm,
            tgt_spm=loaded.tgt_spm,
            source_lang=vocab["source_lang"],
            target_lang=vocab["target_lang"],
            languages=languages,
            model_max_length=model.cfg.max_source_positions,
            name=name,
        )
        with open(os.path.join(workdir, "README.md"), "w", encoding="utf-8") as handle:
            handle.write(
                _card(
                    loaded,
                    languages=languages,
                    output_dir=output_dir,
                    native_positions=native_positions,
                    scores=scores_text,
                )
            )
        reloaded, problems = _load_report(transformers, workdir)
        if problems:
            kind, keys = next(iter(problems.items()))
            raise ValueError(f"{name}: transformers loads the export with {kind} {keys[:3]}")
        src, src_lengths = _probe(model.cfg.src_vocab_size, seed=0)
        prev, _ = _probe(model.cfg.tgt_vocab_size, seed=1)
        prev[prev == PAD_ID] = EOS_ID  # teacher-forced prefixes have no padding in this probe
        prev[:, 0] = config["decoder_start_token_id"]
        difference = check_logits(
            our_logits(model, src, src_lengths, prev),
            marian_logits(reloaded, src, src_lengths, prev),
            tgt_ids=range(model.cfg.tgt_vocab_size),
            name=name,
        )
        _check_tokenizer(transformers, workdir, loaded.src_spm, languages=languages, name=name)
    logger.info(
        "exported %s to %s (MarianMT, logits within %.2g of ours, positions %s)",
        name,
        output_dir,
        difference,
        "computed by transformers" if native_positions else "stored",
    )
    return {"max_logit_difference": difference, "native_positions": native_positions}


def _check_tokenizer(
    transformers: Any,
    directory: str,
    spm: SentencePieceModel,
    *,
    languages: Languages,
    name: str,
) -> None:
    """MarianTokenizer of the export gives our ids (pieces + EOS) on text made of our pieces, and
    with each target's ``>>xx<<`` in front, that direction's tag first."""
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses": see the model card
        warnings.simplefilter("ignore")
        tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    processor = spm.processor
    usable = [  # pieces segmentation can produce (an import's other-language pieces are UNUSED)
        index
        for index in range(spm.vocab_size)
        if not (
            processor.is_unused(index) or processor.is_control(index) or processor.is_unknown(index)
        )
    ]
    ids, _ = _probe(len(usable) + 4, seed=2)
    text = spm.decode([[usable[i - 4] for i in ids[0, :-1].tolist()]])[0]
    expected = spm.encode([text])[0] + [EOS_ID]
    if tokenizer(text).input_ids != expected:
        raise ValueError(f"{name}: MarianTokenizer of the export does not give our token ids")
    for tag, code in _marian_codes(_tagged_targets(languages)).items():
        if tokenizer(f"{code} {text}").input_ids != [languages.tags[tag], *expected]:
            raise ValueError(f"{name}: MarianTokenizer of the export does not read {code} as {tag}")


# ----------------------------------------------------------------------------- import
@dataclasses.dataclass
class MarianDirectory:
    config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    source_spm: bytes
    target_spm: bytes
    vocab: list[str]  # pieces by Marian id (source side)
    target_vocab: list[str] | None  # separate vocabularies only


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


# What a config.json must say for the model to be built at all: transformers would otherwise build
# its defaults' shape (d_model 1024...) and fail on the weights, or ours would.
_MARIAN_SIZES = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)
_OPTIONAL_SIZES = ("decoder_vocab_size", "max_position_embeddings")  # null: transformers' default
_PROBABILITIES = ("dropout", "attention_dropout", "activation_dropout")
_FLAGS = ("scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings")
# Fields of BART-era Marian configs that transformers' MarianMT ignores: true would be a model that
# neither transformers nor nmt computes.
_IGNORED_IF_FALSE = ("normalize_before", "add_final_layer_norm", "normalize_embedding")


def _check_marian_config(config: dict[str, Any], *, path: str) -> None:
    """ValueError naming ``path`` and the field for a config.json that does not describe a MarianMT
    model nmt can import: a size missing or not a positive integer, a dropout outside [0, 1], a flag
    that is not true/false, an activation with no counterpart, heads that do not divide d_model."""
    for key in _MARIAN_SIZES:
        if key not in config:
            raise ValueError(
                f"{path}: no {key} (a MarianMT config.json gives {', '.join(_MARIAN_SIZES)})"
            )
    for key in (*_MARIAN_SIZES, *_OPTIONAL_SIZES):
        value = config.get(key)
        if (key in _MARIAN_SIZES or value is not None) and not (type(value) is int and value > 0):
            raise ValueError(f"{path}: {key} {value!r} is not a positive integer")
    for key in _PROBABILITIES:
        value = config.get(key, 0.0)
        if type(value) not in (int, float) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{path}: {key} {value!r} is not a probability (0 to 1)")
    for key in _FLAGS:
        if type(config.get(key, False)) is not bool:
            raise ValueError(f"{path}: {key} {config[key]!r} is not true or false")
    for key in _IGNORED_IF_FALSE:
        if config.get(key, False) is not False:
            raise ValueError(
                f"{path}: {key} {json.dumps(config[key])}: transformers' MarianMT ignores it (it "
                "computes the model as if false), so the model it loads is not the one described"
            )
    activation = config.get("activation_function", "gelu")
    if not isinstance(activation, str) or activation not in _ACTIVATIONS:
        raise ValueError(
            f"{path}: activation_function {activation!r} has no counterpart here "
            f"({', '.join(_ACTIVATIONS)})"
        )
    for side in ("encoder", "decoder"):
        heads = config[f"{side}_attention_heads"]
        if config["d_model"] % heads:
            raise ValueError(
                f"{path}: d_model {config['d_model']} is not divisible by "
                f"{side}_attention_heads {heads}"
            )


# The weights transformers reads, in its order of preference (sharded ones: their index).
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _marian_weights(directory: str) -> str:
    """The weights file transformers will load from ``directory``, checked to be readable as what
    its name says (ValueError naming it: missing, truncated, damaged, not a state dict)."""
    path = next(
        (
            os.path.join(directory, name)
            for name in _WEIGHT_FILES
            if os.path.isfile(os.path.join(directory, name))
        ),
        None,
    )
    if path is None:
        raise ValueError(
            f"{os.path.join(directory, 'model.safetensors')}: missing, and no pytorch_model.bin "
            "either: the model's weights"
        )
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(path, framework="pt") as handle:
                handle.keys()
        except SafetensorError as error:
            raise ValueError(
                f"{path}: not a complete safetensors file ({_first_line(error)}): truncated or "
                "damaged?"
            ) from None
    elif path.endswith(".bin"):
        state = load_torch_file(path, what="a PyTorch state dict")
        if not isinstance(state, dict) or not all(
            isinstance(value, torch.Tensor) for value in state.values()
        ):
            raise ValueError(f"{path}: not a PyTorch state dict (name -> tensor)")
    return path


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _pieces_by_id(mapping: Any, path: str) -> list[str]:
    if not isinstance(mapping, dict) or not all(isinstance(v, int) for v in mapping.values()):
        raise ValueError(f"{path}: not a Marian vocabulary (a JSON object of piece -> id)")
    if sorted(mapping.values()) != list(range(len(mapping))):
        raise ValueError(f"{path}: the ids are not 0..{len(mapping) - 1}, each once")
    by_id = [""] * len(mapping)
    for piece, index in mapping.items():
        by_id[index] = piece
    return by_id


def read_marian_directory(directory: str) -> MarianDirectory:
    """The files of a MarianMT directory, checked to be one (one-line errors naming the file)."""
    config_path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such directory")
    if not os.path.isfile(config_path):
        raise ValueError(f"{directory}: not a Hugging Face model directory (no config.json)")
    config = _read_json(config_path)
    if not isinstance(config, dict) or config.get("model_type") != "marian":
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise ValueError(
            f"{config_path}: not a MarianMT model (model_type {kind!r}, nmt-import reads 'marian')"
        )
    _check_marian_config(config, path=config_path)
    tokenizer_config_path = os.path.join(directory, "tokenizer_config.json")
    tokenizer_config = (
        _read_json(tokenizer_config_path) if os.path.isfile(tokenizer_config_path) else {}
    )
    if not isinstance(tokenizer_config, dict):
        raise ValueError(f"{tokenizer_config_path}: not a JSON object")
    for key in ("source_lang", "target_lang"):
        if not isinstance(tokenizer_config.get(key, ""), str):
            raise ValueError(
                f"{tokenizer_config_path}: {key} {tokenizer_config[key]!r} is not a language code"
            )
    separate = tokenizer_config.get("separate_vocabs", False)
    if type(separate) is not bool:
        raise ValueError(
            f"{tokenizer_config_path}: separate_vocabs {separate!r} is not true or false"
        )
    needed = ["source.spm", "target.spm", "vocab.json"] + (
        ["target_vocab.json"] if separate else []
    )
    for file_name in needed:
        if not os.path.isfile(os.path.join(directory, file_name)):
            raise ValueError(
                f"{os.path.join(directory, file_name)}: missing; a MarianMT directory needs "
                f"{', '.join(needed)} beside config.json (transformers #13706: save the tokenizer too)"
            )

    def read_bytes(file_name: str) -> bytes:
        with open(os.path.join(directory, file_name), "rb") as handle:
            return handle.read()

    vocab_path = os.path.join(directory, "vocab.json")
    target_vocab_path = os.path.join(directory, "target_vocab.json")
    return MarianDirectory(
        config=config,
        tokenizer_config=tokenizer_config,
        source_spm=read_bytes("source.spm"),
        target_spm=read_bytes("target.spm"),
        vocab=_pieces_by_id(_read_json(vocab_path), vocab_path),
        target_vocab=_pieces_by_id(_read_json(target_vocab_path), target_vocab_path)
        if separate
        else None,
    )


def _marian_specials(
    pieces: list[str], config: dict[str, Any], tokenizer_config: dict[str, Any], *, path: str
) -> tuple[dict[str, int], int | None]:
    """Marian's special ids in ``pieces`` for our vocabulary, and the decoder start mapped to ours
    (None: our BOS)."""
    pad = config.get("pad_token_id")
    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos
    start = config.get("decoder_start_token_id", pad)
    unk_piece = tokenizer_config.get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if unk_piece not in pieces:
        raise ValueError(f"{path}: the unknown piece {unk_piece!r} is not in the vocabulary")
    for role, index in (
        ("pad_token_id", pad),
        ("eos_token_id", eos),
        ("decoder_start_token_id", start),
    ):
        if type(index) is not int or not 0 <= index < len(pieces):
            raise ValueError(
                f"{os.path.join(os.path.dirname(path), 'config.json')}: {role} {index!r} is not an "
                f"id of {os.path.basename(path)} (0 to {len(pieces) - 1})"
            )
    specials = {"pad": pad, "eos": eos, "unk": pieces.index(unk_piece)}
    if start not in specials.values():
        return {**specials, "bos": start}, None
    ours = {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID}
    return specials, next(ours[role] for role, index in specials.items() if index == start)


def _lang_pairs(tokenizer_config: dict[str, Any], *, directory: str) -> list[Pair]:
    """The tagged directions an nmt export records in tokenizer_config.json (none: a model of one
    untagged direction)."""
    pairs = tokenizer_config.get("lang_pairs")
    if pairs is None:
        return []
    option = f"{os.path.join(directory, 'tokenizer_config.json')}: lang_pairs"
    if not isinstance(pairs, list) or not pairs or not all(isinstance(p, str) for p in pairs):
        raise ValueError(f'{option}: not a list of directions like "en-de" ({pairs!r})')
    return parse_pairs(",".join(pairs), option=option)


def _import_languages(
    files: MarianDirectory,
    directory: str,
    *,
    source_lang: str | None,
    target_lang: str | None,
) -> tuple[str, str, list[Pair]]:
    """The checkpoint's source_lang and target_lang, and a tagged model's directions (none: one
    untagged direction) whose tag ids are read later, from the converted vocabulary."""
    pairs = _lang_pairs(files.tokenizer_config, directory=directory)
    if pairs:
        if source_lang or target_lang:
            raise ValueError(
                f"--source-lang, --target-lang: {directory} is a multilingual model "
                f"({', '.join(map(str, pairs))}); its directions come from its tokenizer_config.json"
            )
        sources, targets = sorted({p.source for p in pairs}), sorted({p.target for p in pairs})
        return ",".join(sources), ",".join(targets), pairs
    source_lang = source_lang or files.tokenizer_config.get("source_lang")
    target_lang = target_lang or files.tokenizer_config.get("target_lang")
    if not source_lang or not target_lang or source_lang == target_lang:
        raise ValueError(
            f"{directory}: tokenizer_config.json names no distinct source_lang/target_lang; "
            "give them with --source-lang and --target-lang"
        )
    return source_lang, target_lang, []


def _targets(pairs: list[Pair]) -> list[str]:
    return sorted({pair.target for pair in pairs})


def _restored(pairs: list[Pair], proto: bytes, *, directory: str) -> dict[str, Any]:
    """The checkpoint's entries of a tagged model (none without ``pairs``), the tags read from the
    converted SentencePiece model, where each must be a control piece (entering a sequence by id
    only, as in training)."""
    tags = SentencePieceModel(proto, name=directory).tags
    for lang in _targets(pairs):
        if language_tag(lang) not in tags:
            raise ValueError(
                f"{os.path.join(directory, 'source.spm')}: {language_tag(lang)} is not a control "
                "piece (a tag of an nmt export is): not the SentencePiece model nmt exported"
            )
    if not pairs:
        return {}
    return Languages(pairs=tuple(pair.name for pair in pairs), tags=tags).to_vocab()


def import_marian(
    directory: str,
    output_dir: str,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    force: bool = False,
    command_line: Sequence[str] = (),
) -> dict[str, Any]:
    """A MarianMT directory -> ``output_dir`` with ``checkpoint.pt`` (an nmt checkpoint: weights,
    config, vocabulary) and our SentencePiece model(s) for ``nmt-preprocess --spm-model``. The
    converted model's logits are compared with transformers' before anything is written."""
    transformers = import_transformers("nmt-import --from huggingface")
    files = read_marian_directory(directory)
    vocab_path = os.path.join(directory, "vocab.json")
    target_path = os.path.join(
        directory, "target_vocab.json" if files.target_vocab else "vocab.json"
    )
    source_lang, target_lang, pairs = _import_languages(
        files, directory, source_lang=source_lang, target_lang=target_lang
    )
    # Marian's >>de<< back to our tag <2de>: an nmt export's vocabulary is then its own again.
    tags = {code: tag for tag, code in _marian_codes(_targets(pairs)).items()}
    missing = [code for code in tags if code not in files.vocab]
    if missing:
        raise ValueError(
            f"{vocab_path}: no {missing[0]}, the token of a target language of the lang_pairs in "
            "tokenizer_config.json"
        )
    src_pieces = _renamed(files.vocab, tags, name=vocab_path)
    tgt_pieces = _renamed(files.target_vocab or files.vocab, tags, name=target_path)
    src_specials, _ = _marian_specials(
        src_pieces, files.config, files.tokenizer_config, path=vocab_path
    )
    tgt_specials, start_id = _marian_specials(
        tgt_pieces, files.config, files.tokenizer_config, path=target_path
    )
    src_vocab = convert_vocabulary(
        files.source_spm,
        src_pieces,
        specials=src_specials,
        name=f"{os.path.join(directory, 'source.spm')} (with vocab.json)",
    )
    tgt_vocab = convert_vocabulary(
        files.target_spm,
        tgt_pieces,
        specials=tgt_specials,
        name=f"{os.path.join(directory, 'target.spm')} (with {os.path.basename(target_path)})",
    )
    for side, converted in (("source", src_vocab), ("target", tgt_vocab)):
        if converted.num_dropped:
            logger.warning(
                "%s: %d pieces of %s.spm are not in the vocabulary (transformers reads them as "
                "unknown; nmt segments around them)",
                directory,
                converted.num_dropped,
                side,
            )
    weights = _marian_weights(directory)
    from safetensors import SafetensorError

    try:
        hf_model, problems = _load_report(transformers, directory)
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        # config.json and the weights' format were checked: what is left is the weights' content
        raise ValueError(f"{weights}: transformers cannot load it ({_first_line(error)})") from None
    if problems:
        kind, keys = next(iter(problems.items()))
        raise ValueError(
            f"{weights}: does not hold the model config.json describes ({kind} {keys[:3]})"
        )
    theirs = {key: tensor.detach().float() for key, tensor in hf_model.state_dict().items()}
    for path, pieces, key in (
        (vocab_path, src_pieces, "model.encoder.embed_tokens.weight"),
        (target_path, tgt_pieces, "lm_head.weight"),
    ):
        if theirs[key].shape[0] != len(pieces):
            raise ValueError(
                f"{path}: {len(pieces)} entries, the model's embeddings {theirs[key].shape[0]} "
                "rows: the vocabulary of another model?"
            )
    positions = tuple(
        position_kind(theirs[f"model.{side}.embed_positions.weight"])
        for side in ("encoder", "decoder")
    )
    bias = theirs["final_logits_bias"]
    cfg = from_marian_config(
        files.config,
        src_vocab_size=len(src_pieces) + (1 if "bos" not in src_specials else 0),
        tgt_vocab_size=len(tgt_pieces) + (1 if "bos" not in tgt_specials else 0),
        positions=positions,  # type: ignore[arg-type]
        output_bias=bool(bias.abs().max() > 0),
        decoder_start_id=start_id,
    )
    state = from_marian(
        theirs, cfg, src_ids=src_vocab.ours_from_foreign, tgt_ids=tgt_vocab.ours_from_foreign
    )
    model = build_model(cfg).eval()
    model.load_state_dict(state, strict=True)
    src, src_lengths = _foreign_probe(len(src_pieces), src_specials, seed=0)
    prev, _ = _foreign_probe(len(tgt_pieces), tgt_specials, seed=1)
    prev[:, 0] = int(files.config.get("decoder_start_token_id", tgt_specials["pad"]))
    prev_ours = torch.tensor(tgt_vocab.ours_from_foreign)[prev]
    prev_ours[:, 0] = BOS_ID  # our decoder starts from BOS; decoder_start_id reads Marian's start
    difference = check_logits(
        our_logits(model, torch.tensor(src_vocab.ours_from_foreign)[src], src_lengths, prev_ours),
        marian_logits(hf_model, src, src_lengths, prev),
        tgt_ids=tgt_vocab.ours_from_foreign,
        name=directory,
    )
    joint = src_vocab.proto == tgt_vocab.proto
    spm_files = ["spm.model"] if joint else [f"spm.{source_lang}.model", f"spm.{target_lang}.model"]
    checkpoint = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(cfg),
        "vocab": {
            "source_lang": source_lang,
            "target_lang": target_lang,
            "special_ids": dict(SPECIAL_IDS),
            "src_spm": bytes_to_tensor(src_vocab.proto),
            "tgt_spm": bytes_to_tensor(tgt_vocab.proto),
            **_restored(pairs, src_vocab.proto, directory=directory),
        },
        "provenance": {
            "imported_from": os.path.abspath(directory),
            "format": "huggingface",
            "command_line": list(command_line),
            "max_logit_difference": difference,
        },
    }
    write_import(
        output_dir,
        checkpoint,
        spm_files,
        (src_vocab.proto, tgt_vocab.proto),
        force=force,
        inputs=[("SOURCE", directory)],
    )
    logger.info(
        "imported %s into %s (logits within %.2g of transformers'; positions %s)",
        directory,
        output_dir,
        difference,
        "/".join(positions),
    )
    return {"max_logit_difference": difference, "spm_files": spm_files, "model_config": cfg}


__all__ = [
    "export_huggingface",
    "from_marian",
    "import_marian",
    "marian_config",
    "to_marian",
]
