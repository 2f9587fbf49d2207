"""nmt-train: train an encoder-decoder transformer, plainly or under torchrun."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from nmt.config import ModelConfig, TrainConfig, option_name
from nmt.data import load_manifest
from nmt.model import ARCHS

# Model flags override the preset only when given; their defaults live in the preset functions.
MODEL_INT_FLAGS = (
    "encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
    "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads", "max_source_positions",
    "max_target_positions",
)
MODEL_FLOAT_FLAGS = ("dropout", "attention_dropout", "activation_dropout")
MODEL_BOOL_FLAGS = (
    "encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "decoder_learned_pos",
    "no_scale_embedding", "share_all_embeddings", "share_decoder_input_output_embed",
)
TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _add_train_option(group: argparse._ArgumentGroup, name: str, help_text: str | None = None, **kwargs: Any) -> None:
    """A TrainConfig field as a flag, with the dataclass default (one source of truth)."""
    default = TRAIN_FIELDS[name].default
    if TRAIN_FIELDS[name].type in ("bool", bool):
        group.add_argument(option_name(name), action="store_true", help=help_text)
    else:
        group.add_argument(option_name(name), default=default, help=help_text, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmt-train", description="Train a transformer on a dataset made by nmt-preprocess.")
    parser.add_argument("data_dir", help="directory written by nmt-preprocess")
    parser.add_argument("--arch", default="transformer_tiny", choices=sorted(ARCHS))
    parser.add_argument("--attention", default="auto", choices=("auto", "xformers", "sdpa", "varlen"))

    model = parser.add_argument_group("model (override the --arch preset)")
    for name in MODEL_INT_FLAGS:
        model.add_argument(option_name(name), type=int, default=None)
    for name in MODEL_FLOAT_FLAGS:
        model.add_argument(option_name(name), type=float, default=None)
    for name in MODEL_BOOL_FLAGS:
        model.add_argument(option_name(name), action="store_const", const=True, default=None)
    model.add_argument("--activation-fn", choices=("relu", "gelu"), default=None)

    data = parser.add_argument_group("data and batching")
    _add_train_option(data, "save_dir")
    data.add_argument("--train-subsets", "--train-subset", default="train",
                      help="training split(s), comma-separated: several are blended by weight")
    data.add_argument("--subset-weights", help="comma-separated weights, one per --train-subsets entry")
    _add_train_option(data, "sampling_temperature", "weights proportional to size^(1/T) (0: to size)", type=float)
    _add_train_option(data, "epoch_samples", "samples per epoch of the blend (0: the sum of corpus sizes)", type=int)
    _add_train_option(data, "valid_subset")
    _add_train_option(data, "max_tokens", "token budget per batch, padding included (packed: real tokens)", type=int)
    _add_train_option(data, "max_sentences", type=int)
    _add_train_option(data, "update_freq", "accumulate this many batches per update (per rank)", type=int)
    _add_train_option(data, "batch_noise", "length noise ratio; 0 gives a fixed sorted order", type=float)
    _add_train_option(data, "noise_mode", choices=("ties", "length"))
    _add_train_option(data, "layout", "padded, or packed (padding removed)", choices=("padded", "packed"))
    _add_train_option(data, "max_tokens_per_microbatch", "split larger batches into balanced micro-batches", type=int)
    _add_train_option(data, "curriculum", "length, or file:PATH with one difficulty score per training line")
    _add_train_option(data, "curriculum_epochs", "epochs run in order of increasing difficulty", type=int)
    _add_train_option(data, "competence_updates", "square-root competence: all data eligible from this update", type=int)
    _add_train_option(data, "competence_initial", type=float)
    _add_train_option(data, "num_workers", "data-loading worker processes", type=int)

    optim = parser.add_argument_group("optimisation")
    _add_train_option(optim, "optimizer", choices=("adam",))
    _add_train_option(optim, "lr", type=float)
    _add_train_option(optim, "adam_betas", type=float, nargs=2)
    _add_train_option(optim, "adam_eps", type=float)
    _add_train_option(optim, "weight_decay", type=float)
    _add_train_option(optim, "clip_norm", type=float)
    _add_train_option(optim, "label_smoothing", type=float)
    _add_train_option(optim, "lr_scheduler", choices=("inverse_sqrt", "fixed", "cosine"))
    _add_train_option(optim, "warmup_updates", type=int)
    _add_train_option(optim, "warmup_init_lr", type=float)
    _add_train_option(optim, "min_lr", type=float)
    _add_train_option(optim, "lr_scaling", "scale the lr with the update's batch size", choices=("none", "linear", "sqrt"))
    _add_train_option(optim, "lr_scaling_reference", "batch size at which the scale is 1 (0: the first update's)", type=float)
    _add_train_option(optim, "lr_scaling_by", choices=("sentences", "tokens"))
    _add_train_option(optim, "max_consecutive_nonfinite", type=int)

    run = parser.add_argument_group("precision, compilation, stopping")
    _add_train_option(run, "bf16")
    _add_train_option(run, "fp16")
    _add_train_option(run, "compile", "torch.compile with static (bucketed) shapes, all compiled at start-up")
    _add_train_option(run, "length_multiple", "length bucket size under --compile", type=int)
    _add_train_option(run, "device", choices=("auto", "cpu", "cuda"))
    _add_train_option(run, "max_update", type=int)
    _add_train_option(run, "max_epoch", type=int)
    _add_train_option(run, "stop_time_hours", type=float)
    _add_train_option(run, "patience", "stop after this many validations without improvement (-1: never)", type=int)
    _add_train_option(run, "seed", type=int)

    log = parser.add_argument_group("checkpoints, validation, logging")
    _add_train_option(log, "save_interval_updates", type=int)
    _add_train_option(log, "no_epoch_checkpoints")
    _add_train_option(log, "keep_last", "numbered checkpoints to keep (-1: all)", type=int)
    _add_train_option(log, "validate_interval_updates", type=int)
    _add_train_option(log, "eval_bleu", "decode the validation set and report sacreBLEU")
    _add_train_option(log, "eval_bleu_beam", type=int)
    _add_train_option(log, "best_checkpoint_metric", choices=("loss", "bleu"))
    _add_train_option(log, "tensorboard_logdir")
    _add_train_option(log, "log_interval", type=int)
    _add_train_option(log, "log_format", choices=("simple", "json"))
    _add_train_option(log, "log_all_ranks")
    return parser


def make_configs(args: argparse.Namespace) -> tuple[TrainConfig, ModelConfig]:
    values = {name: getattr(args, name) for name in TRAIN_FIELDS if hasattr(args, name)}
    values["adam_betas"] = tuple(values["adam_betas"])
    values["train_subsets"] = tuple(name for name in args.train_subsets.split(",") if name)
    try:
        values["subset_weights"] = (
            tuple(float(w) for w in args.subset_weights.split(",")) if args.subset_weights else None
        )
    except ValueError:
        raise ValueError(f"--subset-weights: not a comma-separated list of numbers: {args.subset_weights!r}") from None
    train_cfg = TrainConfig(**values)
    manifest = load_manifest(args.data_dir)
    overrides = {
        name: getattr(args, name)
        for name in (*MODEL_INT_FLAGS, *MODEL_FLOAT_FLAGS, *MODEL_BOOL_FLAGS, "activation_fn")
        if getattr(args, name) is not None
    }
    model_cfg = ARCHS[args.arch](
        src_vocab_size=manifest["spm"]["src_vocab_size"],
        tgt_vocab_size=manifest["spm"]["tgt_vocab_size"],
        pad_id=manifest["special_ids"]["pad"],
        attention=args.attention,
        **overrides,
    )
    return train_cfg, model_cfg


def make_bleu_validator(data_dir: str, split: str, *, beam: int) -> Callable[[torch.nn.Module, torch.device], float]:
    """--eval-bleu: decode the validation split (batched, greedy or small beam) and score it with sacreBLEU.

    Built here because nmt.train must not import nmt.eval; the trainer only sees the callback.
    """
    from nmt.config import EvalConfig
    from nmt.data import SentencePieceModel
    from nmt.eval.translate import Translator, load_split, read_references

    manifest = load_manifest(data_dir)
    src_spm = SentencePieceModel.load(os.path.join(data_dir, manifest["spm"]["src_model"]))
    tgt_spm = SentencePieceModel.load(os.path.join(data_dir, manifest["spm"]["tgt_model"]))
    split_data = load_split(data_dir, split, src_spm=src_spm)
    if split_data.reference_path is None:
        raise ValueError(f"--eval-bleu: the manifest of {data_dir} names no raw reference text for split {split!r}")
    references = read_references(split_data.reference_path, line_numbers=split_data.line_numbers)

    def validate(model: torch.nn.Module, device: torch.device) -> float:
        translator = Translator(model, src_spm=src_spm, tgt_spm=tgt_spm, config=EvalConfig(beam=beam))
        hypotheses = [nbest[0].text for nbest in translator.detokenize(translator.generate(split_data.sources))]
        return translator.score(hypotheses, references)[0].score

    return validate


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 or args.log_all_ranks else logging.WARNING,
        format=f"%(asctime)s | rank {rank} | %(levelname)s | %(name)s | %(message)s",
        stream=sys.stderr,
    )
    from nmt.train.trainer import Trainer  # after logging is set up: the import is the slow part

    try:
        train_cfg, model_cfg = make_configs(args)
        bleu_validator = None
        if train_cfg.eval_bleu:
            bleu_validator = make_bleu_validator(train_cfg.data_dir, train_cfg.valid_subset, beam=train_cfg.eval_bleu_beam)
        trainer = Trainer(train_cfg, model_cfg, bleu_validator=bleu_validator)
        trainer.train()
    except (ValueError, RuntimeError) as error:  # bad options or data; non-finite training; collective failures
        print(f"nmt-train: error: {error}", file=sys.stderr)
        return 1
    finally:
        from nmt import dist

        dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
