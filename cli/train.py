"""nmt-train: train an encoder-decoder transformer, plainly or under torchrun."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from nmt.command import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    config_values,
    log_to_stderr,
    run_main,
)
from nmt.config import (
    BatchingConfig,
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    model_config,
)
from nmt.data import Manifest, load_manifest
from nmt.data.spm import PAD_ID

SECTIONS = (
    ("data", DataConfig, "data"),
    ("data and batching", BatchingConfig, "data.batching"),
    ("optimisation", OptimConfig, "optim"),
    ("checkpoints and validation", CheckpointConfig, "checkpoint"),
    ("logging", LoggingConfig, "logging"),
    ("model preset, device, precision, stopping", RunConfig, "run"),
)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-train",
        description="Train a transformer on a dataset made by nmt-preprocess.",
        epilog=(
            "SIGTERM or SIGINT (torchrun forwards them to every rank): in training, the ranks stop "
            "within seconds after the same update, save checkpoint_last.pt and exit 0; before the "
            "first update, the run ends at once with nothing saved, exit 143 (SIGTERM) or 130 (SIGINT)."
        ),
    )
    for title, cls, prefix in SECTIONS:
        add_config_arguments(parser.add_argument_group(title), cls, dest_prefix=prefix + ".")
    model = parser.add_argument_group("model (each flag overrides the --arch preset)")
    add_config_arguments(model, ModelConfig, dest_prefix="model.", only_when_given=True)
    return parser


def make_configs(args: argparse.Namespace, manifest: Manifest) -> tuple[TrainConfig, ModelConfig]:
    """The run's configs from the command line; vocabulary sizes come from the dataset's manifest."""

    def section(cls: type, prefix: str, **nested: object) -> object:
        return config_from_args(cls, args, dest_prefix=prefix + ".", **nested)

    data = section(DataConfig, "data", batching=section(BatchingConfig, "data.batching"))
    train_cfg = TrainConfig(
        data=data,
        optim=section(OptimConfig, "optim"),
        checkpoint=section(CheckpointConfig, "checkpoint"),
        logging=section(LoggingConfig, "logging"),
        run=section(RunConfig, "run"),
    )
    explicit = model_flags(args)
    if not manifest.spm.joint:
        if explicit.get("share_all_embeddings"):
            raise ValueError(
                f"--share-all-embeddings: needs one joint vocabulary, and {manifest.directory} has one per "
                "language (preprocessed with --separate-vocab)"
            )
        explicit.setdefault(
            "share_all_embeddings", False
        )  # a preset's sharing needs one vocabulary
    model_cfg = model_config(
        train_cfg.run.arch,
        src_vocab_size=manifest.spm.src_vocab_size,
        tgt_vocab_size=manifest.spm.tgt_vocab_size,
        pad_id=PAD_ID,  # the manifest holds the toolkit's ids (checked when it is read)
        **explicit,
    )
    return train_cfg, model_cfg


def model_flags(args: argparse.Namespace) -> dict[str, object]:
    """The model options typed on the command line (over the --arch preset)."""
    return config_values(ModelConfig, args, dest_prefix="model.")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    log_all = rank == 0 or vars(args)["logging.log_all_ranks"]
    log_to_stderr(logging.INFO if log_all else logging.WARNING, rank=rank)
    # After logging is set up: these imports are the slow part.
    from nmt.dist import session
    from nmt.eval.evaluate import make_bleu_validator
    from nmt.train.difficulty import checkpoint_scorer
    from nmt.train.trainer import Trainer
    from nmt.workers import stop_on_signals

    def run() -> int:
        with stop_on_signals():  # until the first update, which saves before it stops
            return train()

    def train() -> int:
        manifest = load_manifest(vars(args)["data.data_dir"])
        train_cfg, model_cfg = make_configs(args, manifest)
        bleu_validator = None
        # Without the split, the trainer's validator says what is missing (one line).
        if train_cfg.checkpoint.eval_bleu and (
            manifest.direction_splits(train_cfg.data.valid_subset)
        ):
            bleu_validator = make_bleu_validator(
                manifest,
                train_cfg.data.valid_subset,
                search=train_cfg.checkpoint.search_options(),
                print_samples=train_cfg.checkpoint.eval_bleu_print_samples,
                lang_tok=train_cfg.data.lang_tok,
            )
        with session(
            train_cfg.run.device, backend_choice=train_cfg.run.distributed_backend
        ) as this_process:
            scorer = None
            curriculum = train_cfg.data.curriculum_spec
            if curriculum is not None and curriculum.kind == "model":
                scorer = checkpoint_scorer(
                    curriculum.checkpoint,
                    manifest=manifest,
                    device=this_process.device,
                )
            Trainer(
                train_cfg,
                model_cfg,
                manifest=manifest,
                session=this_process,
                bleu_validator=bleu_validator,
                scorer=scorer,
                model_flags=model_flags(args),
            ).train()
        return 0

    # RuntimeError: non-finite training, collective failures (a peer rank died)
    return run_main("nmt-train", run, paths=command_paths(parser, args), extra=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
