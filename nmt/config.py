"""Typed configurations in sections, validated once at the edge; the command lines are made from them.

Every config is a plain dataclass of plain values (str, int, float, bool, tuples, lists, nested
sections), so it can be saved into a checkpoint as a dict and loaded back with
``torch.load(weights_only=True)``. Each field carries its help text and choices (``opt``); the CLIs
generate their options from the fields (``nmt.command``), so a default, a choice or a help text
lives in one place. Errors are ``ValueError`` naming the command-line option (``--max-len``),
because that is what the user typed and what they have to change.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nmt.languages import PLACEMENTS, Pair, parse_pairs

T = TypeVar("T")

# What an option's value can belong to (``opt(identity=...)``, computed by nmt.provenance): the parts
# of a training run's identity, one per --reset-* flag that may accept a change in it
# (nmt.train.checkpoint), and "data", what the bytes of the data a command generates depend on
# (nmt-preprocess's shards, nmt-eval --output-dataset).
RUN_IDENTITIES = ("vocabulary", "model", "batch sequence", "optimizer", "learning-rate schedule")
IDENTITIES = (*RUN_IDENTITIES, "data")


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices: tuple[Any, ...] | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
    cli: bool = True,
    positional: bool = False,
    required: bool = False,
    const: Any = None,
    default_factory: Any = dataclasses.MISSING,
    path: str | None = None,
    path_separator: str | None = None,
    identity: str | None = None,
    compare_as: Callable[[Any], Any] | None = None,
) -> Any:
    """A config field with what its command-line option needs (help, choices, fairseq aliases).

    ``cli=False``: set by the program (e.g. vocabulary sizes from the manifest), never a flag.
    ``required``: a list option that must be given at least once. ``const``: the value of the
    option given without one (fairseq's ``--eval-bleu-remove-bpe`` alone means ``@@ ``).
    ``path``: the option names a path, and what the command does there (``nmt.fileio.PATH_KINDS``:
    read it, or write a file, a dataset...); every command passes such options through one guard
    (``nmt.fileio.check_written_paths``). ``path_separator``: the value may list several paths.
    ``identity``: what the option's value belongs to (``IDENTITIES``; None: neither), so that
    resuming, generating data or merging shards compares it (``nmt.provenance``); ``compare_as``:
    the value as compared (parsed: two spellings of one value are the same run).
    """
    if identity is not None and identity not in IDENTITIES:
        raise AssertionError(f"identity {identity!r} is none of {IDENTITIES}")
    metadata = {
        "help": help,
        "choices": choices,
        "aliases": aliases,
        "metavar": metavar,
        "cli": cli,
        "positional": positional,
        "required": required,
        "const": const,
        "path": path,
        "path_separator": path_separator,
        "identity": identity,
        "compare_as": compare_as,
    }
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def option_name(field_name: str) -> str:
    """The command-line spelling of a config field: ``max_len`` -> ``--max-len``."""
    return "--" + field_name.replace("_", "-")


def _require(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{option_name(field_name)}: {message}")


def _check_choices(config: Any) -> None:
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        value = getattr(config, f.name)
        if choices and value is not None and value not in choices:
            raise ValueError(
                f"{option_name(f.name)}: must be one of {', '.join(map(str, choices))}, got {value!r}"
            )


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a config class (``from __future__ import annotations`` makes them strings)."""
    return typing.get_type_hints(cls)


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict (tuples become lists), safe for JSON and ``weights_only`` loading."""
    return dataclasses.asdict(config)


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Rebuild ``cls`` from ``to_dict`` output, ignoring unknown keys (older/newer checkpoints)."""
    types = field_types(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        value = values[f.name]
        kind = types[f.name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = from_dict(kind, value)
        elif isinstance(value, list) and "tuple" in str(kind):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


SPECIAL_SYMBOLS = ("pad", "bos", "eos", "unk")
# How a glossary's terms are applied at inference (nmt.data.terminology): annotated after <term> (a
# model trained to follow them, any decoder), as lexical constraints of the beam search, or both.
GLOSSARY_MODES = ("annotate", "constrain", "both")


@dataclass
class PreprocessConfig:
    destdir: str = opt(help="output directory of the dataset", path="dataset")
    source_lang: str = opt(
        "",
        "source language suffix of the text files (or --lang-pairs)",
        aliases=("-s",),
        identity="data",
    )
    target_lang: str = opt(
        "",
        "target language suffix of the text files (none with --only-source or --lang-pairs)",
        aliases=("-t",),
        identity="data",
    )
    only_source: bool = opt(
        False,
        "a monolingual dataset of the --source-lang text of --trainpref (fairseq's flag), encoded with "
        "--spm-model: one token file that both sides of the manifest name (back-translate it with "
        "nmt-eval --output-dataset)",
        identity="data",
    )
    lang_pairs: str | None = opt(
        None,
        "multilingual: directions SRC-TGT, comma-separated (en-de,de-en,en-fr); reads PREFIX.LANG "
        "(multi-way files) or PREFIX.SRC-TGT.LANG (per-pair files); one joint SentencePiece, each "
        "language side encoded once",
        identity="data",
    )
    spm_lang_temperature: float = opt(
        5.0,
        "--lang-pairs: SentencePiece's sample takes from each language in proportion to its "
        "sentences^(1/T), so a small language still gets its pieces (1: by size)",
        identity="data",
    )
    trainpref: list[str] = opt(
        default_factory=list,
        required=True,
        help="P reads P.SRC/P.TGT (or .gz, .xz, .zst); comma-separate or repeat for several corpora",
        path="prefix",
        identity="data",
    )
    validpref: list[str] = opt(
        default_factory=list,
        help="never filtered; comma-separate or repeat",
        path="prefix",
        identity="data",
    )
    testpref: list[str] = opt(
        default_factory=list,
        help="never filtered; comma-separate or repeat",
        path="prefix",
        identity="data",
    )
    spm_model: str | None = opt(
        None,
        "reuse this SentencePiece model instead of training one; SRC,TGT: one per language "
        "(e.g. the ones nmt-import wrote)",
        path="read",
        path_separator=",",
        identity="data",
    )
    spm_vocab_size: int = opt(8000, "SentencePiece vocabulary size", identity="data")
    spm_model_type: str = opt(
        "unigram", "SentencePiece algorithm", choices=("unigram", "bpe"), identity="data"
    )
    separate_vocab: bool = opt(False, "one SentencePiece model per language", identity="data")
    spm_character_coverage: float = opt(1.0, "SentencePiece character coverage", identity="data")
    spm_sample_size: int = opt(
        500_000,
        "sentences SentencePiece is trained on: a uniform sample (reservoir, from --seed) of the training text; "
        "its training takes ~25 bytes of memory per sampled character",
        identity="data",
    )
    max_len: int = opt(
        256, "drop training pairs with a side longer than this (tokens incl. EOS)", identity="data"
    )
    min_len: int = opt(
        1, "drop training pairs with a side shorter than this (pieces)", identity="data"
    )
    max_len_ratio: float = opt(
        3.0,
        "drop training pairs whose longer side exceeds this ratio to the shorter",
        identity="data",
    )
    workers: int = opt(
        0, "encoding processes or threads (0: all cores); the output is identical for any value"
    )
    encoder: str = opt(
        "processes",
        "processes: forked workers, each doing all of a chunk's work (measured faster); threads: SentencePiece's own threads in one process",
        choices=("processes", "threads"),
        identity="data",
    )
    skip_invalid: bool = opt(
        False,
        "drop (train) or repair (valid/test) lines that are not UTF-8, and count them",
        identity="data",
    )
    overwrite: bool = opt(False, "replace an existing non-empty --destdir")
    seed: int = opt(1, "seed of the SentencePiece training sample", identity="data")
    dedup: bool = opt(
        False,
        "drop training pairs that repeat an earlier pair exactly (64-bit hashes; counted)",
        identity="data",
    )
    num_shards: int = opt(
        1,
        "encode the training text in this many parts, one per run (under torchrun: one per rank, set by itself)",
        identity="data",
    )
    shard_id: int = opt(0, "which part this run encodes, 0 <= --shard-id < --num-shards")
    merge_parts: bool = opt(
        False, "once the last part is done, concatenate the parts into one file per split and side"
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        if self.lang_pairs is not None:
            self._check_multilingual()
        else:
            _require(bool(self.source_lang), "source_lang", "must not be empty (or --lang-pairs)")
        if self.only_source:
            self._check_only_source()
        elif self.lang_pairs is None:
            _require(bool(self.target_lang), "target_lang", "must not be empty (or --lang-pairs)")
            _require(
                self.source_lang != self.target_lang,
                "target_lang",
                "must differ from --source-lang",
            )
        _require(bool(self.destdir), "destdir", "must not be empty")
        _require(bool(self.trainpref), "trainpref", "at least one training prefix is required")
        _require(
            self.spm_vocab_size >= 8, "spm_vocab_size", f"must be >= 8, got {self.spm_vocab_size}"
        )
        _require(
            0.0 < self.spm_character_coverage <= 1.0,
            "spm_character_coverage",
            f"must be in (0, 1], got {self.spm_character_coverage}",
        )
        _require(self.spm_sample_size > 0, "spm_sample_size", "must be positive")
        _require(self.min_len >= 0, "min_len", f"must be >= 0, got {self.min_len}")
        _require(
            self.max_len >= max(1, self.min_len),
            "max_len",
            f"must be >= --min-len and >= 1, got {self.max_len}",
        )
        _require(
            self.max_len_ratio >= 1.0, "max_len_ratio", f"must be >= 1, got {self.max_len_ratio}"
        )
        _require(self.workers >= 0, "workers", f"must be >= 0, got {self.workers}")
        _require(self.num_shards >= 1, "num_shards", f"must be >= 1, got {self.num_shards}")
        _require(
            0 <= self.shard_id < self.num_shards,
            "shard_id",
            f"must be in [0, --num-shards={self.num_shards}), got {self.shard_id}",
        )
        _require(
            not (self.separate_vocab and self.spm_model),
            "separate_vocab",
            "cannot be combined with --spm-model (give the two models as --spm-model SRC,TGT)",
        )
        if self.spm_model:
            _require(
                len(self.spm_model.split(",")) in (1, 2) and all(self.spm_model.split(",")),
                "spm_model",
                f"one SentencePiece model, or two as SRC,TGT, got {self.spm_model!r}",
            )

    def _check_only_source(self) -> None:
        for name, given in (
            ("target_lang", bool(self.target_lang)),
            ("separate_vocab", self.separate_vocab),
            ("validpref", bool(self.validpref)),
            ("testpref", bool(self.testpref)),
        ):
            _require(not given, name, "a monolingual dataset (--only-source) has no such thing")
        _require(
            bool(self.spm_model) and "," not in self.spm_model,
            "spm_model",
            "--only-source needs the one SentencePiece model of the models that will read it",
        )
        _require(self.num_shards == 1, "num_shards", "--only-source runs in one process (one part)")

    @property
    def languages(self) -> tuple[str, str]:
        """(source, target) suffixes: a monolingual dataset's target is its source."""
        return self.source_lang, self.target_lang or self.source_lang

    @property
    def pairs(self) -> list[Pair]:
        """The directions: --lang-pairs, or the one of -s/-t."""
        if self.lang_pairs is not None:
            return parse_pairs(self.lang_pairs)
        return [Pair(*self.languages)]

    @property
    def all_languages(self) -> list[str]:
        return sorted({lang for pair in self.pairs for lang in (pair.source, pair.target)})

    def _check_multilingual(self) -> None:
        _require(
            not (self.source_lang or self.target_lang),
            "lang_pairs",
            "names the languages: leave out --source-lang/--target-lang",
        )
        parse_pairs(self.lang_pairs or "")  # one line naming the bad pair
        for name in ("separate_vocab", "only_source"):
            _require(
                not getattr(self, name),
                name,
                "not available with --lang-pairs (one joint vocabulary)",
            )
        _require(
            self.spm_model is None or "," not in self.spm_model,
            "spm_model",
            "--lang-pairs takes one joint model",
        )
        _require(
            self.spm_lang_temperature >= 1.0,
            "spm_lang_temperature",
            f"must be >= 1, got {self.spm_lang_temperature}",
        )


@dataclass
class ModelConfig:
    """Encoder-decoder transformer hyper-parameters (fairseq's flag names).

    The defaults are ``transformer_tiny``, nmt-train's default preset (``ARCHS`` holds the others as
    overrides of these). On the command line every field overrides the ``--arch`` preset only when
    given.
    """

    src_vocab_size: int = opt(8000, cli=False, identity="model")
    tgt_vocab_size: int = opt(8000, cli=False, identity="model")
    pad_id: int = opt(0, cli=False, identity="model")
    encoder_layers: int = opt(3, identity="model")
    decoder_layers: int = opt(3, identity="model")
    encoder_embed_dim: int = opt(128, identity="model")
    decoder_embed_dim: int = opt(128, identity="model")
    encoder_ffn_embed_dim: int = opt(512, identity="model")
    decoder_ffn_embed_dim: int = opt(512, identity="model")
    encoder_attention_heads: int = opt(4, identity="model")
    decoder_attention_heads: int = opt(4, identity="model")
    dropout: float = opt(0.1)
    attention_dropout: float = opt(0.0)
    activation_dropout: float = opt(0.0)
    activation_fn: str = opt("relu", choices=("relu", "gelu", "swish"), identity="model")
    encoder_normalize_before: bool = opt(
        False, "layer norm before each encoder sublayer (pre-norm)", identity="model"
    )
    decoder_normalize_before: bool = opt(
        False, "layer norm before each decoder sublayer (pre-norm)", identity="model"
    )
    encoder_learned_pos: bool = opt(
        False, "learned instead of sinusoidal encoder positions", identity="model"
    )
    decoder_learned_pos: bool = opt(
        False, "learned instead of sinusoidal decoder positions", identity="model"
    )
    max_source_positions: int = opt(1024, identity="model")
    max_target_positions: int = opt(1024, identity="model")
    no_scale_embedding: bool = opt(False, "do not scale embeddings by sqrt(dim)", identity="model")
    share_all_embeddings: bool = opt(
        True,
        "one embedding for encoder input, decoder input and output (joint vocabulary)",
        identity="model",
    )
    share_decoder_input_output_embed: bool = opt(
        True, "tie the decoder's input embedding and output projection", identity="model"
    )
    attention: str = opt(
        "auto",
        "attention kernel (auto: varlen on CUDA, else xFormers when it runs, else PyTorch SDPA; the choice and why are logged)",
        choices=("auto", "xformers", "sdpa", "varlen"),
    )
    sinusoidal_positions: str = opt(
        "fairseq",
        "frequencies of the sinusoidal positions: fairseq's, or Marian's (transformers' MarianMT "
        "computes that table itself, so nmt-export --format huggingface needs to store none)",
        choices=("fairseq", "marian"),
        identity="model",
    )
    # Set by nmt-import only (nmt.deploy): what a foreign model needs to compute exactly what it did.
    position_offset: int = opt(
        0, cli=False, identity="model"
    )  # fairseq's sinusoids start at position pad + 1 = 2
    output_bias: bool = opt(False, cli=False, identity="model")  # Marian's final_logits_bias
    decoder_start_id: int | None = opt(
        None, cli=False, identity="model"
    )  # fairseq decoders start from EOS, not BOS

    def __post_init__(self) -> None:
        _check_choices(self)
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
            _require(
                getattr(self, f"{side}_ffn_embed_dim") >= 1, f"{side}_ffn_embed_dim", "must be >= 1"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, name, f"must be in [0, 1), got {value}")
        for name in ("src_vocab_size", "tgt_vocab_size"):
            size = getattr(self, name)
            _require(
                0 <= self.pad_id < size, name, f"({size}) must hold the padding id {self.pad_id}"
            )
        for name in ("max_source_positions", "max_target_positions"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.position_offset >= 0, "position_offset", "must be >= 0")
        if self.decoder_start_id is not None:
            _require(
                0 <= self.decoder_start_id < self.tgt_vocab_size,
                "decoder_start_id",
                f"must be a target token id, got {self.decoder_start_id}",
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

    def shape(self) -> str:
        """Layers and widths in words, for logs: an --arch name alone hides overridden dimensions."""
        width = {
            side: f"{getattr(self, f'{side}_embed_dim')} (FFN {getattr(self, f'{side}_ffn_embed_dim')})"
            for side in ("encoder", "decoder")
        }
        if width["encoder"] == width["decoder"]:
            return f"{self.encoder_layers}+{self.decoder_layers} layers x {width['encoder']}"
        return (
            f"encoder {self.encoder_layers} layers x {width['encoder']}, "
            f"decoder {self.decoder_layers} layers x {width['decoder']}"
        )


def _sides(**values: Any) -> dict[str, Any]:
    """Same value for encoder and decoder: ``layers=6`` -> encoder_layers=6, decoder_layers=6."""
    return {
        f"{side}_{name}": value for name, value in values.items() for side in ("encoder", "decoder")
    }


_UNSHARED = {"share_all_embeddings": False, "share_decoder_input_output_embed": False}
_BASE = {**_sides(layers=6, embed_dim=512, ffn_embed_dim=2048, attention_heads=8), **_UNSHARED}
_BIG = {
    **_sides(layers=6, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16),
    **_UNSHARED,
    "dropout": 0.3,
}
_PRENORM = _sides(normalize_before=True)

# Named model presets, as overrides of ModelConfig's defaults (transformer_tiny: small data on small
# machines, 3+3 layers x 128, FFN 512, all embeddings shared; chosen on Multi30k val for BLEU per CPU
# minute, examples/multi30k/README.md). Vaswani et al.'s base and big are post-norm; *_prenorm put
# the layer norm before each sublayer. fairseq's names map to the same models.
ARCHS: dict[str, dict[str, Any]] = {
    "transformer_tiny": {},
    "transformer_base": _BASE,
    "transformer_base_prenorm": {**_BASE, **_PRENORM},
    "transformer_big": _BIG,
    "transformer_big_prenorm": {**_BIG, **_PRENORM},
    "transformer_iwslt_de_en": {
        **_sides(layers=6, embed_dim=512, ffn_embed_dim=1024, attention_heads=4),
        **_UNSHARED,
    },
    "transformer": _BASE,
    "transformer_wmt_en_de": _BASE,
    "transformer_vaswani_wmt_en_de_big": _BIG,
    "transformer_wmt_en_de_big": {**_BIG, "attention_dropout": 0.1},
}


def model_config(arch: str, **overrides: Any) -> ModelConfig:
    """The ``arch`` preset with ``overrides`` (ModelConfig fields) on top."""
    if arch not in ARCHS:
        raise ValueError(f"--arch: must be one of {', '.join(sorted(ARCHS))}, got {arch!r}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{option_name(unknown[0])}: not a model option")
    return ModelConfig(**{**ARCHS[arch], **overrides})


@dataclass
class BatchingConfig:
    """Everything besides the lengths, the seed and the epoch that the global batch sequence depends
    on (never the world size), plus how an update is split into micro-batches."""

    # 2048: Multi30k val BLEU after 8 CPU minutes 15.3 against 6.5 at 4096 (examples/multi30k); raise it for big data and GPUs.
    max_tokens: int = opt(
        2048,
        "token budget per batch, padding included (packed: real tokens per side)",
        identity="batch sequence",
    )
    max_sentences: int | None = opt(
        None, "sentences per batch at most", aliases=("--batch-size",), identity="batch sequence"
    )
    required_batch_size_multiple: int = opt(
        1,
        "round batch sizes down to a multiple of this (when they hold that many)",
        identity="batch sequence",
    )
    update_freq: int = opt(
        1, "accumulate this many batches per update (per rank)", identity="batch sequence"
    )
    batch_noise: float = opt(
        0.1, "length noise ratio in [0, 1); 0 gives a fixed sorted order", identity="batch sequence"
    )
    noise_mode: str = opt(
        "ties",
        "ties: shuffle equal lengths; length: multiply lengths by uniform noise",
        choices=("ties", "length"),
        identity="batch sequence",
    )
    layout: str = opt(
        "packed",
        "packed (padding removed), or padded",
        choices=("padded", "packed"),
        identity="batch sequence",
    )
    max_tokens_per_microbatch: int | None = opt(
        None,
        "split larger batches into balanced micro-batches under this cap",
        identity="batch sequence",
    )
    length_multiple: int = opt(
        8, "length bucket size of the static shapes under --compile", identity="batch sequence"
    )
    curriculum_epochs: int = opt(
        0,
        "epochs run in order of increasing difficulty (with --curriculum)",
        identity="batch sequence",
    )
    curriculum_bins: int = opt(
        10, "difficulty bins a curriculum batch never crosses", identity="batch sequence"
    )
    competence_updates: int = opt(
        0,
        "square-root competence: all data eligible from this update (0: off)",
        identity="batch sequence",
    )
    competence_initial: float = opt(0.1, "competence at update 0", identity="batch sequence")

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(self.max_tokens > 0, "max_tokens", f"must be positive, got {self.max_tokens}")
        _require(
            self.max_sentences is None or self.max_sentences > 0,
            "max_sentences",
            "must be positive",
        )
        _require(
            self.required_batch_size_multiple >= 1, "required_batch_size_multiple", "must be >= 1"
        )
        _require(self.update_freq >= 1, "update_freq", f"must be >= 1, got {self.update_freq}")
        _require(
            0 <= self.batch_noise < 1, "batch_noise", f"must be in [0, 1), got {self.batch_noise}"
        )
        _require(
            self.max_tokens_per_microbatch is None or self.max_tokens_per_microbatch > 0,
            "max_tokens_per_microbatch",
            "must be positive",
        )
        _require(self.length_multiple >= 1, "length_multiple", "must be >= 1")
        _require(self.curriculum_epochs >= 0, "curriculum_epochs", "must be >= 0")
        _require(self.curriculum_bins >= 1, "curriculum_bins", "must be >= 1")
        _require(self.competence_updates >= 0, "competence_updates", "must be >= 0")
        _require(0 < self.competence_initial <= 1, "competence_initial", "must be in (0, 1]")

    @property
    def packed(self) -> bool:
        return self.layout == "packed"


CURRICULUM_KINDS = ("length", "file:PATH[,PATH...]", "model:CHECKPOINT")


@dataclass(frozen=True)
class Curriculum:
    """``--curriculum`` parsed: what makes a training pair difficult."""

    kind: str  # "length" (the longer side), "file" (score files), "model" (a checkpoint's loss)
    paths: tuple[str, ...] = ()  # file: one score file per training split; model: the checkpoint

    @classmethod
    def parse(cls, text: str) -> Curriculum:
        kind, _, rest = text.partition(":")
        if text == "length":
            return cls("length")
        if kind in ("file", "model") and rest:
            return cls(kind, tuple(rest.split(",")) if kind == "file" else (rest,))
        raise ValueError(
            f"--curriculum: must be one of {', '.join(CURRICULUM_KINDS)}, got {text!r}"
        )

    @property
    def checkpoint(self) -> str:
        assert self.kind == "model"
        return self.paths[0]


MIN_DIRECTION_FACTOR = 1e-3


def parse_direction_factors(text: str) -> dict[str, float]:
    """``en-de:2,en-fr:1.5`` -> {"en-de": 2.0, "en-fr": 1.5}; a clear error for anything else."""
    factors: dict[str, float] = {}
    for item in text.split(","):
        pair, _, value = item.strip().partition(":")
        source, _, target = pair.partition("-")
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if not (source and target and math.isfinite(factor) and factor > 0):
            raise ValueError(
                f"--upsample-directions: {item.strip()!r} is not PAIR:FACTOR with a factor > 0 "
                "(e.g. en-de:2)"
            )
        if not MIN_DIRECTION_FACTOR <= factor <= 1 / MIN_DIRECTION_FACTOR:
            # 1e-320 is > 0, yet leaves the direction no sample at all (and 1e300 no other one).
            raise ValueError(
                f"--upsample-directions: {item.strip()!r}: the factor must lie between "
                f"{MIN_DIRECTION_FACTOR:g} and {1 / MIN_DIRECTION_FACTOR:g}; to leave a direction "
                "out, preprocess without it"
            )
        if pair in factors:
            raise ValueError(f"--upsample-directions: {pair} is given twice")
        factors[pair] = factor
    return factors


def upsample_factors(text: str | None) -> dict[str, float]:
    """--upsample-directions as {pair: factor} (empty: every direction keeps its weight)."""
    return {} if text is None else parse_direction_factors(text)


@dataclass
class DataConfig:
    """What the training-data plan is built from: the corpora, their blend, the difficulty, the batching."""

    data_dir: str = opt(help="directory written by nmt-preprocess", positional=True, path="read")
    task: str = opt(
        "translation", "fairseq's task name: translation is the only one", choices=("translation",)
    )
    source_lang: str | None = opt(
        None, "checked against the dataset's source language", aliases=("-s",)
    )
    target_lang: str | None = opt(
        None, "checked against the dataset's target language", aliases=("-t",)
    )
    train_subsets: tuple[str, ...] = opt(
        ("train",),
        "training split(s), comma-separated: several are blended by weight",
        aliases=("--train-subset",),
        identity="batch sequence",
    )
    valid_subset: str = opt("valid", "validation split")
    subset_weights: tuple[float, ...] | None = opt(
        None, "comma-separated weights, one per --train-subsets entry", identity="batch sequence"
    )
    sampling_temperature: float = opt(
        0.0,
        "weights proportional to size^(1/T) (0: to size); over the directions of a multilingual dataset too",
        identity="batch sequence",
    )
    upsample_directions: str | None = opt(
        None,
        "multilingual datasets: PAIR:FACTOR,... multiplies those directions' sampling weights (by "
        "size or --sampling-temperature), e.g. en-de:2,en-fr:2; unlisted directions keep 1",
        metavar="PAIR:FACTOR,...",
        identity="batch sequence",
        compare_as=upsample_factors,
    )
    lang_tok: str = opt(
        "encoder",
        "multilingual datasets: where the target-language tag <2xx> goes: encoder (first source "
        "token) or decoder (first target token, forced at inference); stored in the checkpoint",
        choices=PLACEMENTS,
        identity="vocabulary",
    )
    term_annotation_rate: float = opt(
        0.0,
        "share of training sources (drawn anew each epoch) given 1-2 phrases of their reference "
        "after the <term> tag, so that the model learns to follow glossary terms (0: off)",
        identity="batch sequence",
    )
    term_mask_rate: float = opt(
        0.0,
        "share of the source words of each --term-annotation-rate sample replaced by <unk>, so "
        "that the model has to read the given terms rather than translate around them",
        identity="batch sequence",
    )
    epoch_samples: int = opt(
        0, "samples per epoch of the blend (0: the sum of corpus sizes)", identity="batch sequence"
    )
    curriculum: str | None = opt(
        None,
        "difficulty order: length; file:PATH with one score per training line (one file per "
        "--train-subsets entry, comma-separated); or model:CHECKPOINT (each pair scored by that model's loss)",
        path="read",
        path_separator=",",
        identity="batch sequence",
    )
    num_workers: int = opt(0, "data-loading worker processes")
    verify_data: bool = opt(
        False, "check every dataset file against the manifest's SHA-256 sums before training"
    )
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(bool(self.data_dir), "data_dir", "must not be empty")
        _require(
            len(self.train_subsets) >= 1, "train_subsets", "at least one training split is required"
        )
        _require(
            len(set(self.train_subsets)) == len(self.train_subsets),
            "train_subsets",
            "names a split twice",
        )
        _require(
            self.subset_weights is None or len(self.subset_weights) == len(self.train_subsets),
            "subset_weights",
            f"needs one weight per --train-subsets entry ({len(self.train_subsets)})",
        )
        _require(
            not (self.subset_weights and self.sampling_temperature),
            "sampling_temperature",
            "cannot be combined with --subset-weights",
        )
        _require(
            self.sampling_temperature >= 0,
            "sampling_temperature",
            "must be > 0 (0: proportional to size)",
        )
        _require(
            self.epoch_samples >= 0,
            "epoch_samples",
            "must be >= 0 (0: the sum of the corpus sizes)",
        )
        curriculum = self.curriculum_spec  # parsed (and checked) here, once
        _ = self.direction_factors  # parsed (and checked) here, once
        if curriculum is not None and curriculum.kind == "file":
            _require(
                len(curriculum.paths) == len(self.train_subsets) and all(curriculum.paths),
                "curriculum",
                f"file: needs one score file per --train-subsets entry ({len(self.train_subsets)}), "
                f"got {len(curriculum.paths)}",
            )
        _require(self.num_workers >= 0, "num_workers", "must be >= 0")
        _require(
            0.0 <= self.term_annotation_rate <= 1.0,
            "term_annotation_rate",
            f"must be in [0, 1], got {self.term_annotation_rate}",
        )
        _require(
            0.0 <= self.term_mask_rate < 1.0,
            "term_mask_rate",
            f"must be in [0, 1), got {self.term_mask_rate}",
        )
        _require(
            not self.term_mask_rate or self.term_annotation_rate,
            "term_mask_rate",
            "masks the samples --term-annotation-rate annotates: set that too",
        )
        _require(
            self.batching.competence_updates == 0 or self.curriculum is not None,
            "competence_updates",
            "needs a difficulty (--curriculum)",
        )

    @functools.cached_property
    def direction_factors(self) -> dict[str, float]:
        """--upsample-directions as {pair: factor} (empty: every direction keeps its weight)."""
        return upsample_factors(self.upsample_directions)

    @functools.cached_property
    def curriculum_spec(self) -> Curriculum | None:
        """--curriculum as a typed value (None: no curriculum)."""
        return None if self.curriculum is None else Curriculum.parse(self.curriculum)

    @property
    def blended(self) -> bool:
        """Several corpora, or explicit weights or epoch size: a blend index per epoch."""
        return len(self.train_subsets) > 1 or bool(self.subset_weights) or bool(self.epoch_samples)


@dataclass
class OptimConfig:
    criterion: str = opt(
        "label_smoothed_cross_entropy",
        "fairseq's criterion name (the only loss; --label-smoothing 0 for plain cross-entropy)",
        choices=("label_smoothed_cross_entropy",),
    )
    optimizer: str = opt(
        "adam",
        "Adam with decoupled weight decay (AdamW, as fairseq's adam)",
        choices=("adam",),
        identity="optimizer",
    )
    lr: float = opt(2e-3, "peak learning rate", identity="learning-rate schedule")
    adam_betas: tuple[float, float] = opt((0.9, 0.98), "Adam's beta1 beta2", identity="optimizer")
    adam_eps: float = opt(1e-8, identity="optimizer")
    weight_decay: float = opt(
        0.0, "decoupled weight decay (AdamW), as fairseq's --weight-decay", identity="optimizer"
    )
    clip_norm: float = opt(1.0, "clip the gradient norm to this (0: off)")
    label_smoothing: float = opt(0.1)
    lr_scheduler: str = opt(
        "inverse_sqrt",
        "cosine: down to --min-lr at --max-update or --stop-time-hours, whichever comes first",
        choices=("inverse_sqrt", "fixed", "cosine"),
        identity="learning-rate schedule",
    )
    warmup_updates: int = opt(
        300,
        "linear warm-up from --warmup-init-lr to --lr over this many updates",
        identity="learning-rate schedule",
    )
    warmup_init_lr: float = opt(1e-7, identity="learning-rate schedule")
    min_lr: float = opt(0.0, "floor of the cosine schedule", identity="learning-rate schedule")
    lr_scaling: str = opt(
        "none",
        "scale the lr with the update's batch size",
        choices=("none", "linear", "sqrt"),
        identity="learning-rate schedule",
    )
    lr_scaling_reference: float = opt(
        0.0,
        "batch size at which the scale is 1 (0: the first update's)",
        identity="learning-rate schedule",
    )
    lr_scaling_by: str = opt(
        "tokens",
        "batch size counted in",
        choices=("sentences", "tokens"),
        identity="learning-rate schedule",
    )
    max_consecutive_nonfinite: int = opt(
        5, "stop after this many updates in a row with a non-finite loss or gradient"
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(self.lr > 0, "lr", f"must be positive, got {self.lr}")
        _require(
            len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "adam_betas",
            "two values in [0, 1)",
        )
        _require(self.adam_eps > 0, "adam_eps", "must be positive")
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _require(self.clip_norm >= 0, "clip_norm", "must be >= 0 (0 disables clipping)")
        _require(0 <= self.label_smoothing < 1, "label_smoothing", "must be in [0, 1)")
        _require(self.warmup_updates >= 0, "warmup_updates", "must be >= 0")
        _require(self.warmup_init_lr >= 0, "warmup_init_lr", "must be >= 0")
        _require(self.min_lr >= 0, "min_lr", "must be >= 0")
        _require(self.lr_scaling_reference >= 0, "lr_scaling_reference", "must be >= 0")
        _require(self.max_consecutive_nonfinite >= 1, "max_consecutive_nonfinite", "must be >= 1")


@dataclass
class CheckpointConfig:
    """Where and when to save, when to validate, which checkpoint is the best."""

    save_dir: str = opt(
        "checkpoints",
        "directory of the checkpoints (a run resumes from its checkpoint_last.pt)",
        path="save_dir",
    )
    restore_file: str | None = opt(
        None,
        "start a new run (no checkpoint_last.pt in --save-dir yet) from this checkpoint; once the run has "
        "its own checkpoint_last.pt, it resumes from that",
        path="read",
    )
    reset_dataloader: bool = opt(
        False, "on resume, start the data over (epoch 1) and accept other data or batching options"
    )
    reset_optimizer: bool = opt(
        False, "on resume, start a fresh optimizer and accept other optimizer options"
    )
    reset_lr_scheduler: bool = opt(
        False,
        "on resume, start the learning-rate schedule with the new options at the current update",
    )
    reset_meters: bool = opt(
        False, "on resume, forget the best validation score and the patience count"
    )
    save_interval: int = opt(1, "save a numbered checkpoint every N epochs")
    save_interval_updates: int = opt(0, "also save a numbered checkpoint every N updates (0: off)")
    no_epoch_checkpoints: bool = opt(False, "no numbered checkpoint at the end of each epoch")
    keep_last: int = opt(-1, "numbered checkpoints to keep, of either kind (-1: all)")
    keep_last_epochs: int = opt(-1, "epoch checkpoints (checkpointN.pt) to keep (-1: all)")
    keep_interval_updates: int = opt(-1, "update checkpoints (checkpoint_E_U.pt) to keep (-1: all)")
    validate_interval: int = opt(1, "validate every N epochs")
    validate_interval_updates: int = opt(0, "also validate every N updates (0: at epoch ends only)")
    eval_bleu: bool = opt(False, "decode the validation set and report sacreBLEU")
    eval_bleu_beam: int = opt(1, "beam size of --eval-bleu")
    eval_bleu_args: str | None = opt(
        None,
        'fairseq\'s JSON of search options for --eval-bleu, e.g. \'{"beam": 5, "lenpen": 1.0}\' (beam overrides --eval-bleu-beam)',
    )
    eval_bleu_detok: str | None = opt(
        None,
        "fairseq's detokenizer choice: accepted; hypotheses are always SentencePiece-detokenized raw text",
        choices=("space", "moses"),
    )
    eval_bleu_remove_bpe: str | None = opt(
        None,
        "fairseq's BPE removal: accepted; SentencePiece pieces are always joined",
        const="@@ ",
    )
    eval_bleu_print_samples: bool = opt(
        False, "log a few validation hypotheses with their references"
    )
    best_checkpoint_metric: str = opt(
        "loss",
        "what checkpoint_best.pt is best at (loss: lowest; bleu: highest)",
        choices=("loss", "bleu"),
    )
    maximize_best_checkpoint_metric: bool = opt(
        False, "fairseq's flag for bleu: accepted (bleu is maximized, loss minimized)"
    )
    patience: int = opt(-1, "stop after this many validations without improvement (-1: never)")

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(bool(self.save_dir), "save_dir", "must not be empty")
        for name in ("save_interval", "validate_interval"):
            _require(getattr(self, name) >= 1, name, "must be >= 1 (epochs)")
        for name in ("save_interval_updates", "validate_interval_updates"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("keep_last", "keep_last_epochs", "keep_interval_updates"):
            _require(
                getattr(self, name) == -1 or getattr(self, name) >= 1,
                name,
                "must be -1 (keep all) or >= 1",
            )
        _require(
            not self.maximize_best_checkpoint_metric or self.best_checkpoint_metric == "bleu",
            "maximize_best_checkpoint_metric",
            "the loss is minimized; use --best-checkpoint-metric bleu",
        )
        _require(self.eval_bleu_beam >= 1, "eval_bleu_beam", "must be >= 1")
        self.search_options()  # checks --eval-bleu-args once
        _require(
            self.best_checkpoint_metric != "bleu" or self.eval_bleu,
            "best_checkpoint_metric",
            "bleu needs --eval-bleu",
        )

    def search_options(self) -> dict[str, Any]:
        """The EvalConfig fields --eval-bleu decodes with."""
        import json

        options: dict[str, Any] = {"beam": self.eval_bleu_beam}
        if self.eval_bleu_args:
            try:
                given = json.loads(self.eval_bleu_args)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"--eval-bleu-args: not JSON ({error.msg}): {self.eval_bleu_args!r}"
                ) from None
            known = {f.name for f in dataclasses.fields(EvalConfig)}
            if not isinstance(given, dict) or not set(given) <= known:
                unknown = sorted(set(given) - known) if isinstance(given, dict) else given
                raise ValueError(
                    f"--eval-bleu-args: unknown search options {unknown} (known: {', '.join(sorted(known))})"
                )
            options.update(given)
        EvalConfig(**options)  # its own checks, naming the option
        return options


@dataclass
class LoggingConfig:
    tensorboard_logdir: str | None = opt(None, "write TensorBoard scalars here", path="dir")
    log_interval: int = opt(10, "log training statistics every N updates")
    log_format: str = opt(
        "simple", "simple, or json (one object per line on stdout)", choices=("simple", "json")
    )
    log_file: str | None = opt(None, "also append the log lines to this file", path="file")
    log_all_ranks: bool = opt(False, "log from every rank, not only rank 0")
    no_progress_bar: bool = opt(False, "no progress bar (the log lines stay)")

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(self.log_interval >= 1, "log_interval", "must be >= 1")


@dataclass
class RunConfig:
    """The model preset, device, precision and compilation, when to stop, the seed."""

    arch: str = opt(
        "transformer_tiny",
        f"model preset ({', '.join(ARCHS)}); model flags override it one by one",
    )
    device: str = opt(
        "auto",
        "auto (CUDA when available), cpu, cuda (under torchrun: each rank's own GPU), cuda:N",
    )
    cpu: bool = opt(False, "fairseq's spelling of --device cpu")
    distributed_backend: str = opt(
        "auto",
        "collectives under torchrun. auto: NCCL for GPU tensors (gloo for host ones), gloo on the CPU; "
        "gloo: gloo for GPU tensors too (several ranks sharing one GPU, which NCCL refuses)",
        choices=("auto", "nccl", "gloo"),
    )
    bf16: bool = opt(False, "bfloat16 autocast")
    fp16: bool = opt(False, "float16 autocast with loss scaling (overflows skip the update)")
    compile: bool = opt(
        False,
        "torch.compile each layer class once (every layer reuses it), training only; packed "
        "batches' token count dynamic, padded lengths bucketed; warmed up at start-up",
    )
    seed: int = opt(
        1, "seed of the weights, the batch order and dropout", identity="batch sequence"
    )
    max_update: int = opt(0, "stop after this many updates (0: no limit)")
    max_epoch: int = opt(0, "stop after this many epochs (0: no limit)")
    stop_time_hours: float = opt(
        0.0, "stop after this much wall-clock time, that of the runs resumed included (0: no limit)"
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(
            self.arch in ARCHS,
            "arch",
            f"must be one of {', '.join(sorted(ARCHS))}, got {self.arch!r}",
        )
        _require(
            re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
            "device",
            f"must be auto, cpu, cuda or cuda:N, got {self.device!r}",
        )
        if self.cpu:
            _require(self.device in ("auto", "cpu"), "cpu", f"contradicts --device {self.device}")
            self.device = "cpu"
        _require(
            not (self.distributed_backend == "nccl" and self.device == "cpu"),
            "distributed_backend",
            "nccl needs CUDA devices, but --device is cpu (use auto or gloo)",
        )
        _require(not (self.bf16 and self.fp16), "fp16", "cannot be combined with --bf16")
        for name in ("max_update", "max_epoch"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        _require(self.stop_time_hours >= 0, "stop_time_hours", "must be >= 0")


@dataclass
class TrainConfig:
    """Everything ``nmt-train`` needs besides the model, in sections."""

    data: DataConfig
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        _require(
            self.optim.lr_scheduler != "cosine"
            or self.run.max_update > 0
            or self.run.stop_time_hours > 0,
            "lr_scheduler",
            "cosine needs --max-update or --stop-time-hours (the limit it decays over)",
        )


@dataclass
class EvalConfig:
    """How to decode (fairseq-generate's flag names); the data, checkpoint and file options stay in the CLI."""

    beam: int = opt(
        5, "beam size; 1 decodes greedily; with --sampling, samples per sentence", identity="data"
    )
    nbest: int = opt(1, "translations per sentence", identity="data")
    lenpen: float = opt(1.0, "score / length ** lenpen", identity="data")
    max_len_a: float = opt(1.2, "generate at most a * source length + b tokens", identity="data")
    max_len_b: int = opt(10, "generate at most a * source length + b tokens", identity="data")
    # fairseq's default: EOS is not allowed as the first token (no empty output)
    min_len: int = opt(1, "generate at least this many tokens", identity="data")
    no_repeat_ngram_size: int = opt(
        0, "never repeat an n-gram of this size (0: off)", identity="data"
    )
    sampling: bool = opt(False, "sample instead of beam search", identity="data")
    temperature: float = opt(1.0, "sampling temperature", identity="data")
    topk: int = opt(
        0,
        "sample from the k most likely tokens (0: all)",
        aliases=("--sampling-topk",),
        identity="data",
    )
    topp: float = opt(
        1.0,
        "sample from the smallest set with probability >= p",
        aliases=("--sampling-topp",),
        identity="data",
    )
    seed: int = opt(1, "sampling seed", identity="data")
    batch_size: int | None = opt(
        None,
        "sentences per batch (default 64 unless --max-tokens is given)",
        aliases=("--max-sentences",),
        identity="data",
    )
    max_tokens: int | None = opt(None, "source tokens per batch, padding included", identity="data")
    buffer_size: int | None = opt(
        None,
        "raw-text lines read, translated and written at a time (default: 4096, or 1 when stdin is a "
        "terminal: with 1, each line's translation is printed as soon as it is ready)",
        identity="data",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        if self.batch_size is None and self.max_tokens is None:
            self.batch_size = 64
        _require(self.beam >= 1, "beam", f"must be >= 1, got {self.beam}")
        _require(
            1 <= self.nbest <= self.beam,
            "nbest",
            f"must be in [1, --beam={self.beam}], got {self.nbest}",
        )
        _require(self.max_len_a >= 0, "max_len_a", f"must be >= 0, got {self.max_len_a}")
        _require(self.max_len_b >= 0, "max_len_b", f"must be >= 0, got {self.max_len_b}")
        _require(self.min_len >= 0, "min_len", f"must be >= 0, got {self.min_len}")
        _require(
            self.no_repeat_ngram_size >= 0,
            "no_repeat_ngram_size",
            f"must be >= 0, got {self.no_repeat_ngram_size}",
        )
        _require(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _require(self.topk >= 0, "topk", f"must be >= 0, got {self.topk}")
        _require(0.0 < self.topp <= 1.0, "topp", f"must be in (0, 1], got {self.topp}")
        if not self.sampling:
            for name, default in (("temperature", 1.0), ("topk", 0), ("topp", 1.0)):
                _require(getattr(self, name) == default, name, "only applies with --sampling")
        _require(
            self.batch_size is None or self.batch_size >= 1,
            "batch_size",
            f"must be >= 1, got {self.batch_size}",
        )
        _require(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"must be >= 1, got {self.max_tokens}",
        )
        _require(
            self.buffer_size is None or self.buffer_size >= 1,
            "buffer_size",
            f"must be >= 1, got {self.buffer_size}",
        )


EVAL_OUTPUT_FORMATS = ("plain", "fairseq")


@dataclass
class EvalIOConfig:
    """What nmt-eval reads, where it decodes and what it writes (fairseq-generate's names as aliases)."""

    path: str = opt(
        help="checkpoint file; a.pt:b.pt:c.pt ensembles them (the mean of their probabilities at every "
        "step, as fairseq-generate does; one vocabulary); with --average one model of their averaged "
        "weights; with --average-last N a save dir. A comma is part of a file name, never a separator",
        path="read",
        path_separator=":",
    )
    data_dir: str | None = opt(
        None,
        "a directory written by nmt-preprocess",
        positional=True,
        metavar="DATA_DIR",
        path="read",
    )
    average: bool = opt(
        False,
        "average the weights of the --path checkpoints into one model instead of ensembling them",
    )
    average_last: int | None = opt(
        None, "average the N newest numbered checkpoints in the save dir --path", metavar="N"
    )
    split: str = opt(
        "test", "split of DATA_DIR to translate", aliases=("--gen-subset",), identity="data"
    )
    source_lang: str | None = opt(
        None,
        "a multilingual model's source language (with -t: the direction; without both on a "
        "multilingual DATA_DIR: every direction, one table)",
        aliases=("-s",),
    )
    target_lang: str | None = opt(None, "a multilingual model's target language", aliases=("-t",))
    zero_shot: bool = opt(
        False, "allow a direction the multilingual model was not trained on (between its languages)"
    )
    off_target: bool = opt(
        False,
        "also report the off-target rate: % of outputs whose detected language (langid, among the "
        "model's languages) is not the target (always on in the every-direction table)",
    )
    input: str | None = opt(
        None,
        "raw text to translate, one sentence a line ('-': stdin; the default without DATA_DIR)",
        path="read",
    )
    constraints: str | None = opt(
        None,
        "lexically constrained beam search (fairseq-interactive's option): each --input line is the "
        "source then its constraints, tab-separated; every output contains them (ordered: in that order)",
        choices=("ordered", "unordered"),
    )
    glossary: str | None = opt(
        None,
        "TSV file, one 'source term<TAB>target term' per line: the target term of each source term "
        "found in a line (whole words, case-sensitive) is applied as --glossary-mode says",
        path="read",
    )
    glossary_mode: str = opt(
        "annotate",
        "annotate: the target term goes after the <term> tag in the source (a model trained with "
        "--term-annotation-rate follows it; any decoder, CTranslate2 too); constrain: a lexical "
        "constraint of the beam search (PyTorch checkpoints); both",
        choices=GLOSSARY_MODES,
    )
    reference: str | None = opt(
        None,
        "raw reference text to score against (overrides the split's own); as many lines as the source",
        path="read",
    )
    output: str | None = opt(
        None,
        "write the output here (in input order; --nbest N: N lines per input line in plain format)",
        path="file",
    )
    results_path: str | None = opt(
        None,
        "write the output to DIR/generate-SPLIT.txt (fairseq-generate's option)",
        metavar="DIR",
        path="dir",
    )
    format: str = opt(
        "plain",
        "plain: the translations; fairseq: fairseq-generate's S-/T-/H-/D-/P- lines for every n-best (scores in base 2)",
        choices=EVAL_OUTPUT_FORMATS,
    )
    post_process: str | None = opt(
        None,
        "sentencepiece: S-/T-/H- lines of --format fairseq show text instead of pieces (fairseq's option; "
        "plain output and D- lines are always text)",
        choices=("sentencepiece",),
        aliases=("--remove-bpe",),
    )
    print_alignment: bool = opt(
        False,
        "A- lines (--format fairseq): each target token's most attended source token, from the last decoder layer's cross-attention",
    )
    score_reference: bool = opt(
        False,
        "score the reference by forced decoding instead of translating (plain: one score per line, base 2)",
    )
    quiet: bool = opt(False, "print no translations, only the scores")
    score_tokenized_lowercase: bool = opt(
        False, "also report BLEU on lowercased, tokenized text (as many Multi30k papers do)"
    )
    device: str = opt("auto", "auto (CUDA when available), cpu, cuda, cuda:N")
    cpu: bool = opt(False, "decode on the CPU (fairseq's flag; same as --device cpu)")
    fp16: bool = opt(
        False,
        "float16 weights on CUDA; on the CPU a warning, and float32 (half precision is slower there)",
    )
    bf16: bool = opt(False, "bfloat16 weights on CUDA; on the CPU a warning, and float32")
    output_dataset: str | None = opt(
        None,
        "back-translate DATA_DIR's monolingual --split (nmt-preprocess --only-source) into a parallel "
        "dataset here: synthetic source, real target, the same vocabulary; resumable, sharded under torchrun",
        metavar="DIR",
        path="dataset",
    )
    synthetic_side: str = opt(
        "source",
        "--output-dataset: which side the translation becomes: source (back-translation: the "
        "monolingual text is the target) or target (forward translation, self-training: the "
        "monolingual text is the source)",
        choices=("source", "target"),
        identity="data",
    )
    tag_source: bool = opt(
        False,
        "--output-dataset: the <bt> tag before every synthetic source (tagged back-translation)",
        identity="data",
    )
    source_noise: bool = opt(
        False,
        "--output-dataset: noise the synthetic sources (Edunov et al. 2018: words dropped and "
        "replaced by UNK with p=0.1 each, shuffled within 3 positions)",
        identity="data",
    )
    max_len_ratio: float = opt(
        3.0,
        "--output-dataset: leave out pairs whose longer side exceeds this ratio to the shorter "
        "(tokens; 0: keep all), counted in the manifest",
        identity="data",
    )
    overwrite: bool = opt(
        False,
        "--output-dataset: replace a dataset nmt-eval made there with other options or another model",
    )
    chunk_sentences: int = opt(
        2048,
        "--output-dataset: sentences per chunk, the unit of resuming and of the ranks' shares (each "
        "chunk samples from its own seed)",
        identity="data",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _require(bool(self.checkpoint_paths), "path", "names no checkpoint")
        self._check_output_dataset()
        _require(
            (self.source_lang is None) == (self.target_lang is None),
            "source_lang" if self.source_lang is None else "target_lang",
            "a direction needs both -s/--source-lang and -t/--target-lang",
        )
        _require(
            re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
            "device",
            f"must be auto, cpu, cuda or cuda:N, got {self.device!r}",
        )
        _require(
            not self.cpu or self.device in ("auto", "cpu"),
            "cpu",
            f"cannot be combined with --device {self.device}",
        )
        if self.cpu:
            self.device = "cpu"
        _require(not (self.fp16 and self.bf16), "fp16", "cannot be combined with --bf16")
        _require(
            self.data_dir is None or self.input is None,
            "input",
            "give DATA_DIR (with --split) or --input, not both",
        )
        _require(
            self.average_last is None or self.average_last >= 1,
            "average_last",
            f"must be >= 1, got {self.average_last}",
        )
        _require(
            not (self.average and self.average_last is not None),
            "average",
            "cannot be combined with --average-last (which averages already)",
        )
        _require(
            self.output is None or self.results_path is None,
            "results_path",
            "cannot be combined with --output",
        )
        _require(
            self.results_path is None or self.data_dir is not None,
            "results_path",
            "names its file after the split (generate-SPLIT.txt): give DATA_DIR --split, or --output for raw text",
        )
        _require(
            self.format == "fairseq" or not self.print_alignment,
            "print_alignment",
            "alignments are A- lines of --format fairseq",
        )
        _require(
            not self.score_reference or self.data_dir is not None or self.reference is not None,
            "score_reference",
            "needs a reference: DATA_DIR --split, or --reference",
        )
        _require(
            not (self.quiet and self.format == "plain" and self.output_path is not None),
            "quiet",
            "prints no translations, so the plain --output/--results-path file would be empty",
        )

    def _check_output_dataset(self) -> None:
        if self.output_dataset is None:
            for name in ("tag_source", "source_noise", "overwrite"):
                _require(not getattr(self, name), name, "only applies with --output-dataset")
            _require(
                self.synthetic_side == "source",
                "synthetic_side",
                "only applies with --output-dataset",
            )
            return
        if self.synthetic_side == "target":
            for name in ("tag_source", "source_noise"):
                _require(
                    not getattr(self, name),
                    name,
                    "marks synthetic sources, but with --synthetic-side target the source is the real text",
                )
        _require(
            self.data_dir is not None,
            "output_dataset",
            "translates a monolingual dataset: give DATA_DIR (nmt-preprocess --only-source)",
        )
        for name in ("output", "results_path", "score_reference", "reference"):
            _require(not getattr(self, name), name, "cannot be combined with --output-dataset")
        _require(self.format == "plain", "format", "cannot be combined with --output-dataset")
        _require(
            len(self.checkpoint_paths) == 1 and not self.average_last,
            "path",
            "--output-dataset translates with one model",
        )
        _require(
            self.max_len_ratio == 0 or self.max_len_ratio >= 1,
            "max_len_ratio",
            f"must be >= 1 (or 0: off), got {self.max_len_ratio}",
        )
        _require(self.chunk_sentences >= 1, "chunk_sentences", "must be >= 1")

    @property
    def checkpoint_paths(self) -> list[str]:
        """--path split into checkpoints (``:`` separates them, as fairseq's ``--path`` does)."""
        return [path for path in self.path.split(":") if path]

    @property
    def output_path(self) -> str | None:
        """Where the output goes (None: stdout)."""
        if self.results_path is not None:
            return os.path.join(self.results_path, f"generate-{self.split}.txt")
        return self.output


@dataclass
class ServeIOConfig:
    """What nmt-serve serves and where it listens (its limits: ``ServeConfig``; its search: ``EvalConfig``)."""

    path: str = opt(help="checkpoint file, or a directory written by nmt-export", path="read")
    host: str = opt("127.0.0.1")
    port: int = opt(5000, "0: any free port (the one taken is printed)")
    device: str = opt("cpu", "cpu, cuda, cuda:1 ...")
    threads: int = opt(0, "compute threads (0: one per core, or OMP_NUM_THREADS when set)")
    zero_shot: bool = opt(
        False,
        "a multilingual model: also serve the directions it was not trained on (between its languages)",
    )
    access_log: bool = opt(False, "also log every request (one line per batch is always logged)")

    def __post_init__(self) -> None:
        _require(
            self.threads >= 0, "threads", f"must be >= 0 (0: one per core), got {self.threads}"
        )
        _require(
            0 <= self.port <= 65535,
            "port",
            f"must be in [0, 65535] (0: any free port), got {self.port}",
        )


@dataclass
class ServeConfig:
    """Limits and batching of the service (``nmt-serve`` makes its options from these fields)."""

    max_body_bytes: int = opt(
        1 << 20, "a request body over this many bytes is refused (413) before it is parsed"
    )
    max_request_sentences: int = opt(128, "sentences per request (the lines of all its texts)")
    max_batch_tokens: int = opt(
        4096, "source tokens (EOS included) gathered into one decode; a bigger request goes alone"
    )
    max_wait_ms: float = opt(
        5.0, "how long the oldest queued request waits for others to share its decode"
    )
    max_connections: int = opt(
        256, "open connections at most; a further one is answered 503 and closed"
    )
    header_timeout: float = opt(
        10.0,
        "seconds a connection has to send a whole request head, from its opening or its last "
        "response; then it is closed",
    )
    body_timeout: float = opt(
        30.0, "seconds a request has to send its whole body once its head is in (else 408)"
    )
    keep_alive_timeout: float = opt(
        5.0, "an idle connection is closed this many seconds after its last response"
    )
    shutdown_timeout: float = opt(
        20.0,
        "on SIGTERM, seconds the requests in flight have to finish before they are cancelled "
        "and the server exits",
    )
    glossary: list[str] = opt(
        default_factory=list,
        help="a glossary (TSV, one 'source term<TAB>target term' per line) that requests name as "
        '{"glossary": "NAME"}; comma-separate or repeat for several',
        metavar="NAME=FILE",
    )

    @functools.cached_property
    def glossary_files(self) -> dict[str, str]:
        """--glossary as {name: file}."""
        files: dict[str, str] = {}
        for spec in self.glossary:
            name, _, path = spec.partition("=")
            _require(bool(name and path), "glossary", f"expected NAME=FILE, got {spec!r}")
            _require(name not in files, "glossary", f"the name {name!r} is given twice")
            files[name] = path
        return files

    def __post_init__(self) -> None:
        _ = self.glossary_files  # parsed (and checked) here, once
        for name in (
            "max_body_bytes",
            "max_request_sentences",
            "max_batch_tokens",
            "max_connections",
        ):
            _require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _require(self.max_wait_ms >= 0, "max_wait_ms", f"must be >= 0, got {self.max_wait_ms}")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "shutdown_timeout"):
            _require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")


@dataclass
class FilterConfig:
    """nmt-filter: pairs scored by dual conditional cross-entropy, the best kept (Junczys-Dowmunt 2018)."""

    data_dir: str = opt(
        help="dataset to score (e.g. one nmt-eval --output-dataset wrote)",
        positional=True,
        path="read",
    )
    forward: str = opt(
        help="checkpoint translating the dataset's source into its target", path="read"
    )
    reverse: str = opt(
        help="checkpoint translating the dataset's target into its source", path="read"
    )
    split: str = opt("train", "split of DATA_DIR to score")
    keep_fraction: float | None = opt(
        None, "keep this fraction of the pairs, those with the lowest scores"
    )
    threshold: float | None = opt(None, "keep the pairs scoring at most this")
    destdir: str | None = opt(
        None,
        "write the kept pairs here as a dataset (same vocabulary; blend it by DIR/train)",
        path="dataset",
    )
    overwrite: bool = opt(False, "replace an existing --destdir that nmt-filter made")
    scores: str | None = opt(
        None,
        "write each pair's score here, one a line in the split's order (nmt-train --curriculum file:)",
        path="file",
    )
    device: str = opt("auto", "auto (CUDA when available), cpu, cuda, cuda:N")

    def __post_init__(self) -> None:
        _require(bool(self.data_dir), "data_dir", "must not be empty")
        _require(
            self.keep_fraction is None or self.threshold is None,
            "threshold",
            "cannot be combined with --keep-fraction",
        )
        _require(
            self.keep_fraction is None or 0 < self.keep_fraction <= 1,
            "keep_fraction",
            f"must be in (0, 1], got {self.keep_fraction}",
        )
        keeps = self.keep_fraction is not None or self.threshold is not None
        _require(
            keeps == (self.destdir is not None),
            "destdir",
            "goes with --keep-fraction or --threshold (which pairs it keeps), and they with it",
        )
        _require(not self.overwrite or self.destdir is not None, "overwrite", "needs --destdir")
        _require(
            keeps or self.scores is not None,
            "scores",
            "nothing to do: give --scores FILE, or --keep-fraction/--threshold with --destdir",
        )


@dataclass
class PlotConfig:
    """nmt-plot: training curves from a run's log as a picture."""

    log: str = opt(
        help="nmt-train's --log-format json output (one JSON object per line; other lines are skipped), "
        "or a --tensorboard-logdir directory (or one event file)",
        positional=True,
        metavar="LOGDIR_OR_JSONLOG",
        path="read",
    )
    output: str = opt(
        "curves.png",
        "the picture to write (PNG, or any format matplotlib knows by the suffix)",
        aliases=("-o",),
        path="file",
    )
    title: str | None = opt(None, "figure title (default: the log's path)")

    def __post_init__(self) -> None:
        _require(bool(self.log), "log", "must not be empty")
        _require(bool(self.output), "output", "must not be empty")
