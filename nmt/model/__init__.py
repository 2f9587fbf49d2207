"""Encoder-decoder transformer with per-sample attention masks (torch only).

See :mod:`nmt.model.transformer` for the layouts and the incremental-decoding API and
:mod:`nmt.model.attention` for the backends.
"""

from nmt.model.archs import (
    ARCHS,
    transformer_base,
    transformer_base_prenorm,
    transformer_big,
    transformer_big_prenorm,
    transformer_tiny,
)
from nmt.model.attention import AttentionMask, Packing, resolve_backend, unpack
from nmt.model.transformer import DecoderState, EncoderOut, TransformerModel, build_model

__all__ = [
    "ARCHS",
    "AttentionMask",
    "DecoderState",
    "EncoderOut",
    "Packing",
    "TransformerModel",
    "build_model",
    "resolve_backend",
    "transformer_base",
    "transformer_base_prenorm",
    "transformer_big",
    "transformer_big_prenorm",
    "transformer_tiny",
    "unpack",
]
