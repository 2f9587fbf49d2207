"""Encoder-decoder transformer with per-sample attention masks (torch only).

See :mod:`nmt.model.transformer` for the layouts and the incremental-decoding API and
:mod:`nmt.model.attention` for the backends; the named presets are configurations
(``nmt.config.ARCHS``, ``nmt.config.model_config``).
"""

from nmt.model.attention import AttentionMask, Packing, resolve_backend, unpack
from nmt.model.transformer import (
    DecoderState,
    EncoderOut,
    TransformerModel,
    build_model,
    load_model,
)

__all__ = [
    "AttentionMask",
    "DecoderState",
    "EncoderOut",
    "Packing",
    "TransformerModel",
    "build_model",
    "load_model",
    "resolve_backend",
    "unpack",
]
