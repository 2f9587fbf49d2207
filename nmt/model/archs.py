"""Named model presets: plain functions returning a ``ModelConfig``, overridable flag by flag.

The trainer calls ``ARCHS[name](src_vocab_size=..., tgt_vocab_size=..., pad_id=0, **explicit_flags)``;
any keyword is a ``ModelConfig`` field and wins over the preset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from nmt.config import ModelConfig, option_name

_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig))


def _preset(values: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    unknown = sorted(set(overrides) - _FIELDS)
    if unknown:
        raise ValueError(f"{option_name(unknown[0])}: not a model option")
    return ModelConfig(**{**values, **overrides})


def _sides(**values: Any) -> dict[str, Any]:
    """Same value for encoder and decoder: ``layers=6`` -> encoder_layers=6, decoder_layers=6."""
    return {
        f"{side}_{name}": value for name, value in values.items() for side in ("encoder", "decoder")
    }


def transformer_tiny(**overrides: Any) -> ModelConfig:
    """Small data on small machines, nmt-train's default: 3+3 layers, 128 dim, 4 heads, FFN 512,
    dropout 0.1, all embeddings shared (the decoder's input and output only, with a vocabulary per
    language). Chosen on Multi30k val for BLEU per CPU minute: examples/multi30k/README.md."""
    values = _sides(layers=3, embed_dim=128, ffn_embed_dim=512, attention_heads=4)
    sharing = {"share_all_embeddings": True, "share_decoder_input_output_embed": True}
    return _preset({**values, **sharing, "dropout": 0.1}, overrides)


def transformer_base(**overrides: Any) -> ModelConfig:
    """Vaswani et al. base: 6+6 layers, 512 dim, 8 heads, FFN 2048, post-norm."""
    values = _sides(layers=6, embed_dim=512, ffn_embed_dim=2048, attention_heads=8)
    return _preset({**values, "dropout": 0.1}, overrides)


def transformer_big(**overrides: Any) -> ModelConfig:
    """Vaswani et al. big: 6+6 layers, 1024 dim, 16 heads, FFN 4096, dropout 0.3, post-norm."""
    values = _sides(layers=6, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16)
    return _preset({**values, "dropout": 0.3}, overrides)


def _prenorm(preset: Callable[..., ModelConfig]) -> Callable[..., ModelConfig]:
    def prenorm(**overrides: Any) -> ModelConfig:
        return preset(**{**_sides(normalize_before=True), **overrides})

    prenorm.__name__ = f"{preset.__name__}_prenorm"
    prenorm.__doc__ = (
        f"{preset.__name__} with pre-norm (layer norm before each sublayer, final norm)."
    )
    return prenorm


def transformer_iwslt_de_en(**overrides: Any) -> ModelConfig:
    """fairseq's IWSLT preset: 6+6 layers, 512 dim, 4 heads, FFN 1024, post-norm."""
    values = _sides(layers=6, embed_dim=512, ffn_embed_dim=1024, attention_heads=4)
    return _preset({**values, "dropout": 0.1}, overrides)


transformer_base_prenorm = _prenorm(transformer_base)
transformer_big_prenorm = _prenorm(transformer_big)

ARCHS: dict[str, Callable[..., ModelConfig]] = {
    preset.__name__: preset
    for preset in (
        transformer_tiny,
        transformer_base,
        transformer_base_prenorm,
        transformer_big,
        transformer_big_prenorm,
        transformer_iwslt_de_en,
    )
}


def transformer_wmt_en_de_big(**overrides: Any) -> ModelConfig:
    """fairseq's name: the big model with attention dropout 0.1."""
    return transformer_big(**{"attention_dropout": 0.1, **overrides})


# fairseq's names for the same models (its transformer_wmt_en_de is the base model, and so on).
ARCHS.update(
    transformer=transformer_base,
    transformer_wmt_en_de=transformer_base,
    transformer_vaswani_wmt_en_de_big=transformer_big,
    transformer_wmt_en_de_big=transformer_wmt_en_de_big,
)
