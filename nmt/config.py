"""Typed configurations, validated once at the edge.

Every config is a plain dataclass of plain values (str, int, float, bool, tuples, lists), so it can be
saved into a checkpoint as a dict and loaded back with ``torch.load(weights_only=True)``. Errors
are ``ValueError`` naming the command-line option (``--max-len``), because that is what the user
typed and what they have to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def option_name(field_name: str) -> str:
    """The command-line spelling of a config field: ``max_len`` -> ``--max-len``."""
    return "--" + field_name.replace("_", "-")


def _require(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{option_name(field_name)}: {message}")


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict (tuples become lists), safe for JSON and ``weights_only`` loading."""
    return dataclasses.asdict(config)


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Rebuild ``cls`` from ``to_dict`` output, ignoring unknown keys (older/newer checkpoints)."""
    names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            continue
        if isinstance(value, list) and "tuple" in str(names[key].type):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


SPECIAL_SYMBOLS = ("pad", "bos", "eos", "unk")


@dataclass
class PreprocessConfig:
    source_lang: str
    target_lang: str
    destdir: str
    trainpref: list[str] = field(default_factory=list)
    validpref: list[str] = field(default_factory=list)
    testpref: list[str] = field(default_factory=list)
    spm_model: str | None = None
    spm_vocab_size: int = 8000
    spm_model_type: str = "unigram"
    separate_vocab: bool = False
    spm_character_coverage: float = 1.0
    spm_sample_size: int = 1_000_000
    max_len: int = 256
    min_len: int = 1
    max_len_ratio: float = 3.0
    workers: int = 0  # 0: all cores
    skip_invalid: bool = False
    overwrite: bool = False
    seed: int = 1

    def __post_init__(self) -> None:
        _require(bool(self.source_lang), "source_lang", "must not be empty")
        _require(bool(self.target_lang), "target_lang", "must not be empty")
        _require(self.source_lang != self.target_lang, "target_lang", "must differ from --source-lang")
        _require(bool(self.trainpref), "trainpref", "at least one training prefix is required")
        _require(self.spm_vocab_size >= 8, "spm_vocab_size", f"must be >= 8, got {self.spm_vocab_size}")
        _require(
            self.spm_model_type in ("unigram", "bpe"),
            "spm_model_type",
            f"must be unigram or bpe, got {self.spm_model_type!r}",
        )
        _require(
            0.0 < self.spm_character_coverage <= 1.0,
            "spm_character_coverage",
            f"must be in (0, 1], got {self.spm_character_coverage}",
        )
        _require(self.spm_sample_size > 0, "spm_sample_size", "must be positive")
        _require(self.min_len >= 0, "min_len", f"must be >= 0, got {self.min_len}")
        _require(self.max_len >= max(1, self.min_len), "max_len", f"must be >= --min-len and >= 1, got {self.max_len}")
        _require(self.max_len_ratio >= 1.0, "max_len_ratio", f"must be >= 1, got {self.max_len_ratio}")
        _require(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        _require(
            not (self.separate_vocab and self.spm_model),
            "separate_vocab",
            "cannot be combined with --spm-model (a given model is one joint vocabulary)",
        )


@dataclass
class ModelConfig:
    """Encoder-decoder transformer hyper-parameters (fairseq's flag names)."""

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    pad_id: int = 0
    encoder_layers: int = 3
    decoder_layers: int = 3
    encoder_embed_dim: int = 256
    decoder_embed_dim: int = 256
    encoder_ffn_embed_dim: int = 1024
    decoder_ffn_embed_dim: int = 1024
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation_fn: str = "relu"
    encoder_normalize_before: bool = False
    decoder_normalize_before: bool = False
    encoder_learned_pos: bool = False
    decoder_learned_pos: bool = False
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    no_scale_embedding: bool = False
    share_all_embeddings: bool = False
    share_decoder_input_output_embed: bool = False
    attention: str = "auto"  # auto | xformers | sdpa | varlen

    def __post_init__(self) -> None:
        for side in ("encoder", "decoder"):
            dim = getattr(self, f"{side}_embed_dim")
            heads = getattr(self, f"{side}_attention_heads")
            _require(getattr(self, f"{side}_layers") >= 1, f"{side}_layers", "must be >= 1")
            _require(heads >= 1, f"{side}_attention_heads", "must be >= 1")
            _require(
                dim % heads == 0,
                f"{side}_embed_dim",
                f"({dim}) must be divisible by --{side}-attention-heads ({heads})",
            )
            _require(getattr(self, f"{side}_ffn_embed_dim") >= 1, f"{side}_ffn_embed_dim", "must be >= 1")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, name, f"must be in [0, 1), got {value}")
        _require(self.activation_fn in ("relu", "gelu"), "activation_fn", f"must be relu or gelu, got {self.activation_fn!r}")
        _require(
            self.attention in ("auto", "xformers", "sdpa", "varlen"),
            "attention",
            f"must be auto, xformers, sdpa or varlen, got {self.attention!r}",
        )
        if self.share_all_embeddings:
            _require(
                self.src_vocab_size == self.tgt_vocab_size,
                "share_all_embeddings",
                "needs a joint vocabulary (source and target vocab sizes differ; preprocess without --separate-vocab)",
            )
            _require(
                self.encoder_embed_dim == self.decoder_embed_dim,
                "share_all_embeddings",
                "needs --encoder-embed-dim == --decoder-embed-dim",
            )
