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
        for name in ("src_vocab_size", "tgt_vocab_size"):
            size = getattr(self, name)
            _require(0 <= self.pad_id < size, name, f"({size}) must hold the padding id {self.pad_id}")
        for name in ("max_source_positions", "max_target_positions"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
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


@dataclass
class TrainConfig:
    """Everything ``nmt-train`` needs besides the model; fairseq's flag names where it has them."""

    data_dir: str
    save_dir: str = "checkpoints"
    arch: str = "transformer_tiny"
    train_subsets: tuple[str, ...] = ("train",)
    valid_subset: str = "valid"
    # several corpora: weights (or temperature sampling) and the samples per epoch (0: sum of sizes)
    subset_weights: tuple[float, ...] | None = None
    sampling_temperature: float = 0.0
    epoch_samples: int = 0
    # batching
    max_tokens: int = 4096
    max_sentences: int | None = None
    update_freq: int = 1
    batch_noise: float = 0.1
    noise_mode: str = "ties"
    layout: str = "padded"  # padded | packed
    max_tokens_per_microbatch: int | None = None
    curriculum: str | None = None  # None | "length" | "file:PATH"
    curriculum_epochs: int = 0
    competence_updates: int = 0  # > 0: square-root competence reaching 1 at this update
    competence_initial: float = 0.1
    num_workers: int = 0
    # optimisation
    optimizer: str = "adam"
    lr: float = 1e-3
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    label_smoothing: float = 0.1
    lr_scheduler: str = "inverse_sqrt"  # inverse_sqrt | fixed | cosine
    warmup_updates: int = 1000
    warmup_init_lr: float = 1e-7
    min_lr: float = 0.0
    lr_scaling: str = "none"  # none | linear | sqrt
    lr_scaling_reference: float = 0.0  # 0: the first update's batch size
    lr_scaling_by: str = "tokens"  # sentences | tokens
    max_consecutive_nonfinite: int = 5
    # precision / compilation / device
    bf16: bool = False
    fp16: bool = False
    compile: bool = False
    length_multiple: int = 8  # bucket granularity of padded lengths under --compile
    device: str = "auto"  # auto | cpu | cuda
    # stopping
    max_update: int = 0
    max_epoch: int = 0
    stop_time_hours: float = 0.0
    patience: int = -1
    seed: int = 1
    # checkpoints, validation, logging
    save_interval_updates: int = 0
    no_epoch_checkpoints: bool = False
    keep_last: int = -1  # -1: keep every numbered checkpoint
    validate_interval_updates: int = 0
    eval_bleu: bool = False
    eval_bleu_beam: int = 1
    best_checkpoint_metric: str = "loss"  # loss | bleu
    tensorboard_logdir: str | None = None
    log_interval: int = 10
    log_format: str = "simple"  # simple | json
    log_all_ranks: bool = False

    def __post_init__(self) -> None:
        _require(len(self.train_subsets) >= 1, "train_subsets", "at least one training split is required")
        _require(len(set(self.train_subsets)) == len(self.train_subsets), "train_subsets", "names a split twice")
        _require(
            self.subset_weights is None or len(self.subset_weights) == len(self.train_subsets),
            "subset_weights",
            f"needs one weight per --train-subsets entry ({len(self.train_subsets)})",
        )
        _require(not (self.subset_weights and self.sampling_temperature), "sampling_temperature", "cannot be combined with --subset-weights")
        _require(self.sampling_temperature >= 0, "sampling_temperature", "must be > 0 (0: proportional to size)")
        _require(self.epoch_samples >= 0, "epoch_samples", "must be >= 0 (0: the sum of the corpus sizes)")
        _require(
            not (self.curriculum or "").startswith("file:") or len(self.train_subsets) == 1,
            "curriculum",
            "file:PATH scores need a single --train-subsets corpus (use length with blends)",
        )
        _require(self.max_tokens > 0, "max_tokens", f"must be positive, got {self.max_tokens}")
        _require(self.max_sentences is None or self.max_sentences > 0, "max_sentences", "must be positive")
        _require(self.update_freq >= 1, "update_freq", f"must be >= 1, got {self.update_freq}")
        _require(self.batch_noise >= 0, "batch_noise", f"must be >= 0, got {self.batch_noise}")
        _require(self.noise_mode in ("ties", "length"), "noise_mode", f"must be ties or length, got {self.noise_mode!r}")
        _require(self.layout in ("padded", "packed"), "layout", f"must be padded or packed, got {self.layout!r}")
        _require(
            self.max_tokens_per_microbatch is None or self.max_tokens_per_microbatch > 0,
            "max_tokens_per_microbatch",
            "must be positive",
        )
        _require(
            self.curriculum in (None, "length") or (self.curriculum or "").startswith("file:"),
            "curriculum",
            f"must be length or file:PATH, got {self.curriculum!r}",
        )
        _require(self.curriculum_epochs >= 0, "curriculum_epochs", "must be >= 0")
        _require(self.competence_updates >= 0, "competence_updates", "must be >= 0")
        _require(0 < self.competence_initial <= 1, "competence_initial", "must be in (0, 1]")
        _require(self.num_workers >= 0, "num_workers", "must be >= 0")
        _require(self.optimizer == "adam", "optimizer", f"only adam is available, got {self.optimizer!r}")
        _require(self.lr > 0, "lr", f"must be positive, got {self.lr}")
        _require(all(0 <= b < 1 for b in self.adam_betas) and len(self.adam_betas) == 2, "adam_betas", "two values in [0, 1)")
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _require(self.clip_norm >= 0, "clip_norm", "must be >= 0 (0 disables clipping)")
        _require(0 <= self.label_smoothing < 1, "label_smoothing", "must be in [0, 1)")
        _require(
            self.lr_scheduler in ("inverse_sqrt", "fixed", "cosine"),
            "lr_scheduler",
            f"must be inverse_sqrt, fixed or cosine, got {self.lr_scheduler!r}",
        )
        _require(self.warmup_updates >= 0, "warmup_updates", "must be >= 0")
        _require(self.lr_scheduler != "cosine" or self.max_update > 0, "lr_scheduler", "cosine needs --max-update")
        _require(self.lr_scaling in ("none", "linear", "sqrt"), "lr_scaling", f"must be none, linear or sqrt, got {self.lr_scaling!r}")
        _require(self.lr_scaling_reference >= 0, "lr_scaling_reference", "must be >= 0")
        _require(self.lr_scaling_by in ("sentences", "tokens"), "lr_scaling_by", "must be sentences or tokens")
        _require(self.max_consecutive_nonfinite >= 1, "max_consecutive_nonfinite", "must be >= 1")
        _require(not (self.bf16 and self.fp16), "fp16", "cannot be combined with --bf16")
        _require(self.length_multiple >= 1, "length_multiple", "must be >= 1")
        _require(self.device in ("auto", "cpu", "cuda"), "device", f"must be auto, cpu or cuda, got {self.device!r}")
        for name in ("max_update", "max_epoch", "save_interval_updates", "validate_interval_updates"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        _require(self.stop_time_hours >= 0, "stop_time_hours", "must be >= 0")
        _require(self.keep_last == -1 or self.keep_last >= 1, "keep_last", "must be -1 (keep all) or >= 1")
        _require(self.eval_bleu_beam >= 1, "eval_bleu_beam", "must be >= 1")
        _require(self.best_checkpoint_metric in ("loss", "bleu"), "best_checkpoint_metric", "must be loss or bleu")
        _require(self.best_checkpoint_metric != "bleu" or self.eval_bleu, "best_checkpoint_metric", "bleu needs --eval-bleu")
        _require(self.log_interval >= 1, "log_interval", "must be >= 1")
        _require(self.log_format in ("simple", "json"), "log_format", "must be simple or json")


@dataclass
class EvalConfig:
    """How to decode (fairseq-generate's flag names); the data, checkpoint and file options stay in the CLI."""

    beam: int = 5
    nbest: int = 1
    lenpen: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1  # fairseq's default: EOS is not allowed as the first token (no empty output)
    no_repeat_ngram_size: int = 0
    sampling: bool = False
    temperature: float = 1.0
    topk: int = 0  # 0: sample from the whole vocabulary
    topp: float = 1.0  # 1.0: no nucleus truncation
    seed: int = 1
    batch_size: int | None = None  # sentences per batch; 64 when neither this nor max_tokens is given
    max_tokens: int | None = None  # source tokens per batch, padding included
    buffer_size: int = 4096  # raw-text lines read, translated and written at a time (bounded memory)

    def __post_init__(self) -> None:
        if self.batch_size is None and self.max_tokens is None:
            self.batch_size = 64
        _require(self.beam >= 1, "beam", f"must be >= 1, got {self.beam}")
        _require(1 <= self.nbest <= self.beam, "nbest", f"must be in [1, --beam={self.beam}], got {self.nbest}")
        _require(self.max_len_a >= 0, "max_len_a", f"must be >= 0, got {self.max_len_a}")
        _require(self.max_len_b >= 0, "max_len_b", f"must be >= 0, got {self.max_len_b}")
        _require(self.min_len >= 0, "min_len", f"must be >= 0, got {self.min_len}")
        _require(self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size", f"must be >= 0, got {self.no_repeat_ngram_size}")
        _require(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _require(self.topk >= 0, "topk", f"must be >= 0, got {self.topk}")
        _require(0.0 < self.topp <= 1.0, "topp", f"must be in (0, 1], got {self.topp}")
        if not self.sampling:
            for name, default in (("temperature", 1.0), ("topk", 0), ("topp", 1.0)):
                _require(getattr(self, name) == default, name, "only applies with --sampling")
        _require(self.batch_size is None or self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        _require(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _require(self.buffer_size >= 1, "buffer_size", f"must be >= 1, got {self.buffer_size}")
