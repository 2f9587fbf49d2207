"""Export a checkpoint to CTranslate2 through its own converter API (a ``Converter`` returning a
``TransformerSpec``), with the SentencePiece model(s) and our manifest alongside.

How our model maps (``nmt.model.transformer``):

- token embeddings, scaled by ``sqrt(dim)`` unless ``--no-scale-embedding`` (CTranslate2's
  ``scale_embeddings`` holds the factor itself); shared embeddings are the same tensor, which
  CTranslate2 stores once (it aliases equal variables);
- positions: our table as an explicit ``encodings`` matrix, row p for position p from 0 (learned or
  sinusoidal). CTranslate2's built-in sinusoids start at position 1, so they would not match;
- fused QKV (self-attention) and KV (cross-attention) projections in CTranslate2's order (q, k, v);
  the key bias is masked to zero in our model (``KeyBiasFreeLinear``), so it is exported as zeros;
- pre- or post-norm per side (CTranslate2 reads ``pre_norm`` for the encoder and the decoder
  separately), the final layer norms of pre-norm sides, LayerNorm epsilon 1e-5;
- relu, gelu (the erf form, CTranslate2's GELU) or swish (imported Marian models);
- an output bias (imported Marian models); the decoder's start token (BOS, or EOS for imported
  fairseq models, ``decoder_start_id``);
- the vocabulary is the SentencePiece pieces by id: pad 0 ``<pad>``, bos 1 ``<s>``, eos 2 ``</s>``,
  unk 3 ``<unk>`` (whatever the pieces are called, they are read from the model). The source gets
  EOS appended (``add_source_eos``) and decoding starts from BOS, as ours does.

Every tensor of the state dict must land somewhere and every model option must be one this exporter
knows: anything else is a one-line ValueError, never a silently different model.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt.config import to_dict
from nmt.data.spm import BOS_ID, EOS_ID, SPECIAL_IDS, UNK_ID, SentencePieceModel
from nmt.deploy.common import built_aside, load_for_export
from nmt.eval.ct2_model import (
    EXPORT_FORMAT,
    EXPORT_MANIFEST,
    EXPORT_VERSION,
    import_ctranslate2,
    pieces,
)
from nmt.fileio import atomic_write
from nmt.languages import Languages
from nmt.model import TransformerModel

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16")
_ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "swish": "SWISH",
}  # CTranslate2's Activation names (GELU is the erf form)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


class _Mapper:
    """Copies tensors into a spec and remembers which state-dict entries were used."""

    def __init__(self, model: TransformerModel) -> None:
        self.names: dict[int, list[str]] = {}  # a shared tensor has several names
        for name, tensor in model.state_dict(keep_vars=True).items():
            self.names.setdefault(id(tensor), []).append(name)
        self.used: set[str] = set()

    def take(self, tensor: torch.Tensor) -> np.ndarray:
        self.used.update(self.names.get(id(tensor), ()))  # non-persistent buffers have no name
        return _numpy(tensor)

    def linear(self, spec: Any, module: nn.Linear) -> None:
        spec.weight = self.take(module.weight)
        bias = self.take(module.bias)
        mask = getattr(
            module, "bias_mask", None
        )  # KeyBiasFreeLinear: the key chunk is masked to zero
        spec.bias = bias if mask is None else bias * _numpy(mask)

    def layer_norm(self, spec: Any, module: nn.LayerNorm) -> None:
        spec.gamma = self.take(module.weight)
        spec.beta = self.take(module.bias)

    def embedder(self, spec: Any, embed: nn.Module) -> None:
        tokens = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
        tokens.weight = self.take(embed.tokens.weight)
        spec.scale_embeddings = float(embed.scale)  # 1.0: CTranslate2 does not scale
        spec.position_encodings.encodings = self.take(embed.positions)

    def attention(self, spec: Any, attn: nn.Module, block: nn.Module, *, cross: bool) -> None:
        if cross:
            self.linear(spec.linear[0], attn.q_proj)
            self.linear(spec.linear[1], attn.kv_proj)
        else:
            self.linear(spec.linear[0], attn.qkv_proj)
        self.linear(spec.linear[-1], attn.out_proj)
        self.layer_norm(spec.layer_norm, block.norm)

    def ffn(self, spec: Any, layer: nn.Module) -> None:
        self.linear(spec.linear_0, layer.ffn.fc1)
        self.linear(spec.linear_1, layer.ffn.fc2)
        self.layer_norm(spec.layer_norm, layer.ffn_block.norm)


def build_spec(
    model: TransformerModel, *, src_spm: SentencePieceModel, tgt_spm: SentencePieceModel, name: str
) -> Any:
    """The ``TransformerSpec`` of ``model``, its weights set; ValueError for what cannot be exported."""
    import_ctranslate2("nmt-export --format ctranslate2")
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    for side, spm in (("src", src_spm), ("tgt", tgt_spm)):
        if getattr(cfg, f"{side}_vocab_size") != spm.vocab_size:
            raise ValueError(
                f"{name}: --{side}-vocab-size {getattr(cfg, f'{side}_vocab_size')} differs from its SentencePiece model's "
                f"{spm.vocab_size} pieces; CTranslate2 needs one piece per embedding row"
            )
    src_pieces, tgt_pieces = pieces(src_spm), pieces(tgt_spm)
    if src_pieces[EOS_ID] != tgt_pieces[EOS_ID]:
        # CTranslate2 appends the target vocabulary's EOS name to sources: it must name the source's EOS too.
        raise ValueError(
            f"{name}: source and target SentencePiece models name EOS differently; CTranslate2 needs one name"
        )
    eps = {module.eps for module in model.modules() if isinstance(module, nn.LayerNorm)}
    if len(eps) != 1:
        raise ValueError(
            f"{name}: layer norms with different epsilons {sorted(eps)} cannot be exported (CTranslate2 has one)"
        )
    activation = getattr(common_spec.Activation, _ACTIVATIONS[cfg.activation_fn])
    encoder = transformer_spec.TransformerEncoderSpec(
        cfg.encoder_layers,
        cfg.encoder_attention_heads,
        pre_norm=cfg.encoder_normalize_before,
        activation=activation,
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        cfg.decoder_layers,
        cfg.decoder_attention_heads,
        pre_norm=cfg.decoder_normalize_before,
        activation=activation,
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    mapper = _Mapper(model)
    mapper.embedder(spec.encoder, model.encoder.embed)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        mapper.attention(
            layer_spec.self_attention, layer.self_attn, layer.self_attn_block, cross=False
        )
        mapper.ffn(layer_spec.ffn, layer)
    if model.encoder.final_norm is not None:
        mapper.layer_norm(spec.encoder.layer_norm, model.encoder.final_norm)
    mapper.embedder(spec.decoder, model.decoder.embed)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        mapper.attention(
            layer_spec.self_attention, layer.self_attn, layer.self_attn_block, cross=False
        )
        mapper.attention(layer_spec.attention, layer.cross_attn, layer.cross_attn_block, cross=True)
        mapper.ffn(layer_spec.ffn, layer)
    if model.decoder.final_norm is not None:
        mapper.layer_norm(spec.decoder.layer_norm, model.decoder.final_norm)
    spec.decoder.projection.weight = mapper.take(model.output_projection.weight)
    if model.output_projection.bias is not None:  # imported Marian models have one
        spec.decoder.projection.bias = mapper.take(model.output_projection.bias)

    left_out = sorted(set(model.state_dict()) - mapper.used)
    if left_out:
        raise ValueError(
            f"{name}: parameter {left_out[0]} has no CTranslate2 counterpart; this model cannot be exported"
        )

    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    spec.config.unk_token = tgt_pieces[UNK_ID]
    spec.config.bos_token = tgt_pieces[BOS_ID]
    spec.config.eos_token = tgt_pieces[EOS_ID]
    start_id = BOS_ID if cfg.decoder_start_id is None else cfg.decoder_start_id
    spec.config.decoder_start_token = tgt_pieces[start_id]  # fairseq imports start from EOS
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(eps.pop())
    return spec


def export_ctranslate2(
    checkpoints: Sequence[str],
    output_dir: str,
    *,
    quantization: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write ``output_dir`` (CTranslate2 files, SentencePiece model(s), ``nmt_export.json``); returns the manifest.

    Several checkpoints are averaged first. The directory is built under a temporary name and renamed
    into place when complete; an existing non-empty ``output_dir`` needs ``force`` and is replaced
    only then.
    """
    import_ctranslate2("nmt-export --format ctranslate2")
    from ctranslate2.converters.converter import Converter

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"--quantization: must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    loaded = load_for_export(checkpoints, target="the CTranslate2 export")
    name, model, src_spm, tgt_spm = loaded.name, loaded.model, loaded.src_spm, loaded.tgt_spm
    vocab = loaded.state["vocab"]

    class NmtConverter(Converter):
        """CTranslate2's converter interface over a model already loaded here."""

        def _load(self) -> Any:
            return build_spec(model, src_spm=src_spm, tgt_spm=tgt_spm, name=name)

    with built_aside(
        output_dir,
        force=force,
        made_by="nmt-export",
        inputs=[("CKPT", path) for path in checkpoints],
    ) as workdir:
        try:
            NmtConverter().convert(workdir, quantization=quantization, force=True)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            raise ValueError(
                f"{name}: CTranslate2 conversion failed ({' '.join(str(error).split())})"
            ) from None
        except (
            ValueError
        ) as error:  # CTranslate2's own checks span several lines; ours are one line already
            raise ValueError(" ".join(str(error).split())) from None
        joint = src_spm.proto == tgt_spm.proto
        spm_files = (
            ["spm.model"]
            if joint
            else [f"spm.{vocab['source_lang']}.model", f"spm.{vocab['target_lang']}.model"]
        )
        for file_name, spm in zip(spm_files, (src_spm, tgt_spm)):
            with open(os.path.join(workdir, file_name), "wb") as handle:
                handle.write(spm.proto)
        manifest = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "source_lang": vocab["source_lang"],
            "target_lang": vocab["target_lang"],
            "special_ids": dict(SPECIAL_IDS),
            "src_spm": spm_files[0],
            "tgt_spm": spm_files[-1],
            "quantization": quantization or "float32",
            "model_config": to_dict(model.cfg),
            "checkpoints": [os.path.abspath(path) for path in checkpoints],
        }
        languages = Languages.from_vocab(vocab).to_vocab()
        if languages:  # a tagged model's directions and tag placement
            manifest["languages"] = languages
        # The manifest goes last: a directory with one is complete.
        with atomic_write(os.path.join(workdir, EXPORT_MANIFEST), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=2)
            handle.write("\n")
    logger.info("exported %s to %s (%s)", name, output_dir, manifest["quantization"])
    return manifest
