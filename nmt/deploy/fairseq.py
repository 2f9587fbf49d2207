"""fairseq transformer checkpoints -> ours: a pure mapping of the state dict, and the vocabulary.

For models trained on SentencePiece pieces (``spm_encode`` then ``fairseq-preprocess``). How the two
correspond (fairseq's ``TransformerModel``, ``MultiheadAttention``, ``Dictionary``):

- the same layers, names and pre-/post-norm choices (``encoder.layers.N.self_attn.q_proj`` ...,
  ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``; ``encoder.layer_norm`` when
  pre-norm); q/k/v fused into our projections, the key bias dropped (softmax removes it exactly);
- ids: fairseq's dictionary has bos 0, pad 1, eos 2, unk 3, then dict.txt's lines; the vocabulary
  is rewritten to ours (``nmt.deploy.foreign_vocab``) and every embedding row moves with its piece;
- fairseq's decoder starts from EOS, ours from BOS: the model's ``decoder_start_id`` is EOS, so the
  first decoder input reads EOS's row as fairseq's does;
- positions start at pad + 1 = 2 in fairseq: a learned table loses its first two rows; sinusoids
  are ours (fairseq's formula) with ``position_offset`` 2.

A checkpoint is read with ``torch.load(weights_only=True)``, ``argparse.Namespace`` (fairseq's
``args``) the one class allowed besides tensors and plain data: no code from the file runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from nmt.checkpoint_io import FORMAT, VERSION, bytes_to_tensor, load_torch_file
from nmt.config import ModelConfig
from nmt.data.spm import EOS_ID, PAD_ID, SPECIAL_IDS
from nmt.deploy.common import fused_projections, layer_pairs, write_import
from nmt.deploy.foreign_vocab import convert_vocabulary
from nmt.model import build_model

logger = logging.getLogger(__name__)

FAIRSEQ_SPECIALS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
_SPECIAL_PIECES = ["<s>", "<pad>", "</s>", "<unk>"]
# Options fairseq's transformer has and ours has not: importing such a model would change it.
_UNSUPPORTED = {
    "layernorm_embedding": "--layernorm-embedding",
    "no_token_positional_embeddings": "--no-token-positional-embeddings",
    "adaptive_softmax_cutoff": "--adaptive-softmax-cutoff",
    "cross_self_attention": "--cross-self-attention",
    "adaptive_input": "--adaptive-input",
    "tie_adaptive_weights": "--tie-adaptive-weights",
    "quant_noise_pq": "--quant-noise-pq",
}
_IGNORED_KEYS = ("encoder.version", "decoder.version", "_float_tensor")


def read_dictionary(path: str) -> list[str]:
    """fairseq's dict.txt -> pieces by fairseq id (the four specials first, then one per line)."""
    pieces = list(_SPECIAL_PIECES)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except OSError as error:
        raise ValueError(f"--dict: cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a fairseq dictionary (not UTF-8 text)") from None
    first_line = dict.fromkeys(_SPECIAL_PIECES, 0)  # 0: fairseq's own
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        fields = line.rstrip().rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == "#fairseq:overwrite"
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise ValueError(f"{path}, line {number}: not 'piece count' (a fairseq dict.txt?)")
        piece = fields[0]
        if piece in first_line and not overwrite:  # fairseq's Dictionary refuses it too
            where = (
                f"line {first_line[piece]}" if first_line[piece] else "fairseq's special symbols"
            )
            raise ValueError(f"{path}, line {number}: {piece!r} again (also in {where})")
        first_line.setdefault(piece, number)
        pieces.append(piece)
    if len(pieces) == len(_SPECIAL_PIECES):
        raise ValueError(f"{path}: an empty fairseq dictionary (no 'piece count' line)")
    return pieces


def load_fairseq_checkpoint(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state dict, model args as a dict) of a fairseq checkpoint, loaded safely."""
    state = load_torch_file(
        path,
        what="a fairseq checkpoint",
        allowed=[argparse.Namespace],
        refused_hint="a checkpoint holding omegaconf objects can be rewritten with plain dicts by "
        "fairseq's checkpoint_utils.torch_persistent_save after OmegaConf.to_container",
    )
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path}: not a fairseq checkpoint (no 'model' entry)")
    weights = state["model"]
    if not isinstance(weights, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in weights.items()
    ):
        raise ValueError(f"{path}: not a fairseq checkpoint (its 'model' is not a dict of tensors)")
    args = state.get("args")
    if args is None and isinstance(state.get("cfg"), dict):
        args = state["cfg"].get("model")
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if not isinstance(args, dict):
        raise ValueError(
            f"{path}: a fairseq checkpoint without its model options ('args' or 'cfg')"
        )
    arch = args.get("arch") or args.get("_name")
    if isinstance(arch, str) and not arch.startswith("transformer"):
        raise ValueError(
            f"{path}: a fairseq {arch} model; nmt imports fairseq's transformer (--arch transformer*)"
        )
    if not any(key.startswith("encoder.layers.") for key in weights):
        raise ValueError(f"{path}: not a fairseq transformer (no encoder.layers.* weights)")
    return weights, args


def _number(args: dict[str, Any], key: str, kind: type, *, name: str, default: Any = None) -> Any:
    """``kind(args[key])`` (``default`` when absent); a missing or non-numeric option in one line."""
    value = args.get(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        found = "missing" if value is None else f"{value!r}, not a number"
        raise ValueError(
            f"{name}: fairseq option {key} is {found} (not a transformer's options?)"
        ) from None


def fairseq_model_config(
    args: dict[str, Any], *, src_vocab_size: int, tgt_vocab_size: int, name: str
) -> ModelConfig:
    """Our ``ModelConfig`` for fairseq's transformer options (ValueError for one we cannot express)."""
    for option, flag in _UNSUPPORTED.items():
        if args.get(option):
            raise ValueError(f"{name}: fairseq's {flag} has no counterpart in nmt's transformer")
    activation = args.get("activation_fn", "relu")
    if activation not in ("relu", "gelu"):
        raise ValueError(
            f"{name}: fairseq's --activation-fn {activation} has no counterpart here (relu, gelu)"
        )
    numbers = {
        key: _number(args, key, int, name=name)
        for key in (
            "encoder_layers",
            "decoder_layers",
            "encoder_embed_dim",
            "decoder_embed_dim",
            "encoder_ffn_embed_dim",
            "decoder_ffn_embed_dim",
            "encoder_attention_heads",
            "decoder_attention_heads",
        )
    }
    for key, default in (("max_source_positions", 1024), ("max_target_positions", 1024)):
        numbers[key] = _number(args, key, int, name=name, default=default)
    for key, default in (
        ("dropout", 0.1),
        ("attention_dropout", 0.0),
        ("activation_dropout", args.get("relu_dropout", 0.0)),
    ):
        numbers[key] = _number(args, key, float, name=name, default=default)
    output_dim = args.get("decoder_output_dim") or numbers["decoder_embed_dim"]
    if output_dim != numbers["decoder_embed_dim"]:
        raise ValueError(f"{name}: fairseq's --decoder-output-dim differs from the embedding dim")
    try:
        return ModelConfig(
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            pad_id=PAD_ID,
            **numbers,
            activation_fn=activation,
            encoder_normalize_before=bool(args.get("encoder_normalize_before", False)),
            decoder_normalize_before=bool(args.get("decoder_normalize_before", False)),
            encoder_learned_pos=bool(args.get("encoder_learned_pos", False)),
            decoder_learned_pos=bool(args.get("decoder_learned_pos", False)),
            no_scale_embedding=bool(args.get("no_scale_embedding", False)),
            share_all_embeddings=bool(args.get("share_all_embeddings", False)),
            share_decoder_input_output_embed=bool(
                args.get("share_decoder_input_output_embed", False)
                or args.get("share_all_embeddings", False)
            ),
            position_offset=FAIRSEQ_SPECIALS["pad"] + 1,
            decoder_start_id=EOS_ID,
        )
    except ValueError as error:  # ModelConfig's own checks name our option, not the file
        raise ValueError(f"{name}: its options make no nmt model ({error})") from None


def from_fairseq(
    theirs: dict[str, torch.Tensor],
    cfg: ModelConfig,
    *,
    src_ids: Sequence[int],
    tgt_ids: Sequence[int],
    name: str,
) -> dict[str, torch.Tensor]:
    """fairseq's transformer state dict -> ours for ``cfg``; ``src_ids``/``tgt_ids`` map each fairseq
    id to ours. Every fairseq tensor must find its place (ValueError naming the first that does not)."""
    ours: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in theirs:
            raise ValueError(
                f"{name}: no {key} in the checkpoint (not the transformer its options describe)"
            )
        used.add(key)
        return theirs[key].float()

    def rows(table: torch.Tensor, ids: Sequence[int], size: int) -> torch.Tensor:
        if table.shape[0] != len(ids):
            raise ValueError(
                f"{name}: an embedding of {table.shape[0]} rows for a dictionary of {len(ids)} "
                "entries: the dict.txt of another model?"
            )
        out = table.new_zeros(size, *table.shape[1:])
        out[torch.tensor(list(ids))] = table
        return out

    offset = FAIRSEQ_SPECIALS["pad"] + 1
    for side, num_layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for index in range(num_layers):
            prefix = f"{side}.layers.{index}"
            for our_name, their_name in layer_pairs(side):
                ours[f"{prefix}.{our_name}"] = take(f"{prefix}.{their_name}")
            for fused, attention, parts in fused_projections(side):
                for kind in ("weight", "bias"):
                    chunks = [take(f"{prefix}.{attention}.{part}.{kind}") for part in parts]
                    if len({chunk.shape for chunk in chunks}) > 1:
                        raise ValueError(
                            f"{name}: {prefix}.{attention}.{'/'.join(parts)}.{kind} differ in "
                            f"shape ({', '.join(str(tuple(chunk.shape)) for chunk in chunks)})"
                        )
                    chunks = [
                        torch.zeros_like(chunk) if part == "k_proj" and kind == "bias" else chunk
                        for part, chunk in zip(parts, chunks)
                    ]
                    ours[f"{prefix}.{fused}.{kind}"] = torch.cat(chunks)
        ids, size = (
            (src_ids, cfg.src_vocab_size) if side == "encoder" else (tgt_ids, cfg.tgt_vocab_size)
        )
        ours[f"{side}.embed.tokens.weight"] = rows(take(f"{side}.embed_tokens.weight"), ids, size)
        if getattr(cfg, f"{side}_learned_pos"):
            table = take(f"{side}.embed_positions.weight")
            max_positions = getattr(
                cfg, "max_source_positions" if side == "encoder" else "max_target_positions"
            )
            ours[f"{side}.embed.positions"] = table[offset : offset + max_positions]
        if getattr(cfg, f"{side}_normalize_before"):
            for kind in ("weight", "bias"):
                ours[f"{side}.final_norm.{kind}"] = take(f"{side}.layer_norm.{kind}")
    output = (
        "decoder.output_projection.weight"
        if "decoder.output_projection.weight" in theirs
        else "decoder.embed_out"
    )
    if cfg.share_decoder_input_output_embed and output not in theirs:
        output = "decoder.embed_tokens.weight"
    ours["output_projection.weight"] = rows(take(output), tgt_ids, cfg.tgt_vocab_size)
    left = sorted(key for key in theirs if key not in used and not key.endswith(_IGNORED_KEYS))
    if left:
        raise ValueError(f"{name}: {left[0]} has no counterpart in nmt's transformer")
    return ours


def _check_shapes(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], *, name: str
) -> None:
    """Each tensor of the shape the checkpoint's options give it (``load_state_dict`` would list
    every mismatch over many lines)."""
    for key, tensor in state.items():
        if key in expected and tensor.shape != expected[key].shape:
            raise ValueError(
                f"{name}: its tensors do not fit its options (nmt's {key} would be "
                f"{tuple(tensor.shape)}, its options make it {tuple(expected[key].shape)})"
            )


def import_fairseq(
    checkpoint_path: str,
    output_dir: str,
    *,
    dictionaries: Sequence[str],
    spm_models: Sequence[str],
    source_lang: str | None = None,
    target_lang: str | None = None,
    force: bool = False,
    command_line: Sequence[str] = (),
) -> dict[str, Any]:
    """A fairseq transformer checkpoint with its dictionary (one, or source and target) and
    SentencePiece model(s) -> ``output_dir`` with ``checkpoint.pt`` and our SentencePiece model(s)."""
    theirs, args = load_fairseq_checkpoint(checkpoint_path)
    source_lang = source_lang or args.get("source_lang")
    target_lang = target_lang or args.get("target_lang")
    if not source_lang or not target_lang or source_lang == target_lang:
        raise ValueError(
            f"{checkpoint_path}: the checkpoint names no distinct source/target languages; give "
            "them with --source-lang and --target-lang"
        )
    if len(dictionaries) not in (1, 2) or len(spm_models) not in (1, 2):
        raise ValueError("--dict, --spm-model: one file for both sides, or source,target")
    pieces = [read_dictionary(path) for path in dictionaries]
    protos = []
    for path in spm_models:
        try:
            with open(path, "rb") as handle:
                protos.append(handle.read())
        except OSError as error:
            raise ValueError(f"--spm-model: cannot read {path}: {error.strerror}") from None
    converted = [
        convert_vocabulary(
            protos[min(side, len(protos) - 1)],
            pieces[min(side, len(pieces) - 1)],
            specials=FAIRSEQ_SPECIALS,
            name=f"{dictionaries[min(side, len(dictionaries) - 1)]} with "
            f"{spm_models[min(side, len(spm_models) - 1)]}",
        )
        for side in (0, 1)
    ]
    for side, vocab in zip(("source", "target"), converted):
        if vocab.num_dropped:
            logger.warning(
                "%d pieces of the %s SentencePiece model are not in its dictionary (fairseq reads "
                "them as unknown; nmt segments around them)",
                vocab.num_dropped,
                side,
            )
    cfg = fairseq_model_config(
        args,
        src_vocab_size=len(pieces[0]),
        tgt_vocab_size=len(pieces[-1]),
        name=checkpoint_path,
    )
    state = from_fairseq(
        theirs,
        cfg,
        src_ids=converted[0].ours_from_foreign,
        tgt_ids=converted[1].ours_from_foreign,
        name=checkpoint_path,
    )
    model = build_model(cfg)
    _check_shapes(state, model.state_dict(), name=checkpoint_path)
    model.load_state_dict(state, strict=True)
    joint = converted[0].proto == converted[1].proto
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
            "src_spm": bytes_to_tensor(converted[0].proto),
            "tgt_spm": bytes_to_tensor(converted[1].proto),
        },
        "provenance": {
            "imported_from": os.path.abspath(checkpoint_path),
            "format": "fairseq",
            "command_line": list(command_line),
        },
    }
    write_import(
        output_dir,
        checkpoint,
        spm_files,
        (converted[0].proto, converted[1].proto),
        force=force,
        inputs=[("SOURCE", checkpoint_path)]
        + [("--dict", path) for path in dictionaries]
        + [("--spm-model", path) for path in spm_models],
    )
    logger.info("imported %s into %s", checkpoint_path, output_dir)
    return {"spm_files": spm_files, "model_config": cfg}
