"""What the exporters and importers share: a checkpoint loaded for export, an output directory built
aside and renamed into place when complete."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from nmt.checkpoint_io import atomic_torch_save, load_averaged_checkpoint, tensor_to_bytes
from nmt.data.spm import SPECIAL_IDS, SentencePieceModel
from nmt.fileio import Destination, check_destination, install_directory
from nmt.model import TransformerModel, load_model


@dataclasses.dataclass
class ExportInput:
    name: str  # the checkpoint(s), for messages
    state: dict[str, Any]
    model: TransformerModel
    src_spm: SentencePieceModel
    tgt_spm: SentencePieceModel


def load_for_export(checkpoints: Sequence[str], *, target: str) -> ExportInput:
    """One checkpoint, or several averaged, with its model and SentencePiece models, checked."""
    name = ",".join(checkpoints)
    state = load_averaged_checkpoint(list(checkpoints))
    vocab = state["vocab"]
    if vocab.get("special_ids") != SPECIAL_IDS:
        raise ValueError(
            f"{name}: special ids {vocab.get('special_ids')} differ from the toolkit's {SPECIAL_IDS}"
        )
    src_spm = SentencePieceModel(
        tensor_to_bytes(vocab["src_spm"]), name=f"{name} (source SentencePiece model)"
    )
    tgt_spm = SentencePieceModel(
        tensor_to_bytes(vocab["tgt_spm"]), name=f"{name} (target SentencePiece model)"
    )
    model = load_model(state, name=name, target=target)
    return ExportInput(name=name, state=state, model=model, src_spm=src_spm, tgt_spm=tgt_spm)


@contextlib.contextmanager
def built_aside(
    output_dir: str, *, force: bool, made_by: str, inputs: Sequence[tuple[str, str]]
) -> Iterator[str]:
    """Yields a temporary directory beside ``output_dir``; when the block ends normally it replaces
    ``output_dir`` (an existing non-empty one only with ``force`` and only if ``made_by`` made it;
    never one that is or holds one of ``inputs``: checked first and again at the rename); on any
    error it is removed and ``output_dir`` is left as it was."""
    destination = Destination(
        os.path.abspath(output_dir),
        option="--output-dir",
        replace_flag="--force",
        made_by=made_by,
        replace=force,
        inputs=inputs,
    )
    check_destination(destination)
    parent = os.path.dirname(destination.path)
    os.makedirs(parent, exist_ok=True)
    workdir = os.path.join(parent, f".{os.path.basename(destination.path)}.tmp-{os.getpid()}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    try:
        yield workdir
        install_directory(workdir, destination)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def layer_pairs(side: str) -> list[tuple[str, str]]:
    """(our name, theirs) of the tensors copied as they are, per layer. fairseq's names, which
    transformers' Marian (after BART, a fairseq port) keeps."""
    pairs = [
        ("self_attn.out_proj", "self_attn.out_proj"),
        ("self_attn_block.norm", "self_attn_layer_norm"),
        ("ffn.fc1", "fc1"),
        ("ffn.fc2", "fc2"),
        ("ffn_block.norm", "final_layer_norm"),
    ]
    if side == "decoder":
        pairs += [
            ("cross_attn.q_proj", "encoder_attn.q_proj"),
            ("cross_attn.out_proj", "encoder_attn.out_proj"),
            ("cross_attn_block.norm", "encoder_attn_layer_norm"),
        ]
    return [
        (f"{ours}.{kind}", f"{theirs}.{kind}")
        for ours, theirs in pairs
        for kind in ("weight", "bias")
    ]


def fused_projections(side: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(our fused projection, their attention module, its projections in our order) per layer."""
    fused = [("self_attn.qkv_proj", "self_attn", ("q_proj", "k_proj", "v_proj"))]
    if side == "decoder":
        fused.append(("cross_attn.kv_proj", "encoder_attn", ("k_proj", "v_proj")))
    return fused


IMPORTED_CHECKPOINT = "checkpoint.pt"


def write_import(
    output_dir: str,
    checkpoint: dict[str, Any],
    spm_files: list[str],
    protos: tuple[bytes, bytes],
    *,
    force: bool,
    inputs: Sequence[tuple[str, str]],
) -> None:
    """An import's directory: ``checkpoint.pt`` and the SentencePiece model(s) (one when both sides
    are the same) for ``nmt-preprocess --spm-model``, built aside and renamed into place."""
    with built_aside(output_dir, force=force, made_by="nmt-import", inputs=inputs) as workdir:
        for file_name, proto in zip(spm_files, protos):
            with open(os.path.join(workdir, file_name), "wb") as handle:
                handle.write(proto)
        atomic_torch_save(checkpoint, os.path.join(workdir, IMPORTED_CHECKPOINT))
