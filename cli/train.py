"""nmt-train: train an encoder-decoder transformer, plainly or under torchrun."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable

import torch

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
    explicit = config_values(ModelConfig, args, dest_prefix="model.")
    pretrained = _pretrained_model_config(train_cfg, explicit)
    if pretrained is not None:
        return train_cfg, pretrained
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


def _pretrained_model_config(
    train_cfg: TrainConfig, explicit: dict[str, object]
) -> ModelConfig | None:
    """The model of a new run from a weights-only --restore-file (nmt-import's checkpoint, an average)
    is that checkpoint's: --arch does not apply, and of the model flags only the dropouts and the
    attention kernel may change. None when the run starts otherwise."""
    from nmt.checkpoint_io import LAST, load_model_checkpoint
    from nmt.config import from_dict
    from nmt.train.checkpoint import MODEL_OPTIONS_FREE_TO_CHANGE

    restore = train_cfg.checkpoint.restore_file
    if not restore or os.path.isfile(os.path.join(train_cfg.checkpoint.save_dir, LAST)):
        return None
    state = load_model_checkpoint(restore)
    if "optimizer" in state:  # a run's checkpoint: resumed as such, under the identity check
        return None
    fixed = sorted(set(explicit) - set(MODEL_OPTIONS_FREE_TO_CHANGE))
    if fixed:
        raise ValueError(
            f"--{fixed[0].replace('_', '-')}: the model is {restore}'s (weights only, so its shape is "
            "fixed); only the dropouts and --attention may be given"
        )
    saved = from_dict(ModelConfig, state["model_config"])
    return dataclasses.replace(saved, **explicit)


def make_bleu_validator(
    manifest: Manifest,
    split: str,
    *,
    search: dict[str, object],
    print_samples: bool = False,
    lang_tok: str = "encoder",
) -> Callable[[torch.nn.Module, torch.device], float | dict[str, float]]:
    """--eval-bleu: decode the validation split (batched, greedy or small beam) and score it with
    sacreBLEU; on a multilingual dataset every direction's, scored apart (a dict by direction).
    Built here because nmt.train must not import nmt.eval; the trainer only sees the callback.
    """
    from nmt.config import EvalConfig
    from nmt.data import SentencePieceModel
    from nmt.eval.translate import Translator, load_split, read_references
    from nmt.languages import Pair

    data_dir = manifest.directory
    src_spm = SentencePieceModel.load(manifest.path(manifest.spm.src_model))
    tgt_spm = SentencePieceModel.load(manifest.path(manifest.spm.tgt_model))
    languages = manifest.languages(lang_tok)
    splits = manifest.direction_splits(split)
    sets = {}
    for pair, name in splits.items():
        split_data = load_split(data_dir, name, src_spm=src_spm, manifest=manifest)
        if split_data.reference_path is None:
            raise ValueError(
                f"--eval-bleu: the manifest of {data_dir} names no raw reference text for split {name!r}"
            )
        references = read_references(
            split_data.reference_path, line_numbers=split_data.line_numbers
        )
        sets[pair] = (split_data, references)

    def validate(model: torch.nn.Module, device: torch.device) -> float | dict[str, float]:
        translator = Translator(
            model,
            src_spm=src_spm,
            tgt_spm=tgt_spm,
            config=EvalConfig(**search),
            languages=languages,
        )
        scores = {}
        for pair, (split_data, references) in sets.items():
            wanted = Pair.parse(pair, codes=False)
            direction = translator.direction(wanted.source, wanted.target)
            sources = direction.prefixed(split_data.sources)
            found = translator.generate(
                sources, first_tokens=translator.first_tokens(direction, len(sources))
            )
            hypotheses = [nbest[0].text for nbest in translator.detokenize(found)]
            if print_samples:
                for hypothesis, reference in list(zip(hypotheses, references))[:3]:
                    logging.getLogger("nmt.train").info(
                        "example hypothesis%s: %s\nexample reference: %s",
                        f" ({pair})" if len(sets) > 1 else "",
                        hypothesis,
                        reference,
                    )
            scores[pair] = translator.score(hypotheses, references)[0].score
        return scores

    return validate


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    log_all = rank == 0 or vars(args)["logging.log_all_ranks"]
    log_to_stderr(logging.INFO if log_all else logging.WARNING, rank=rank)
    # After logging is set up: these imports are the slow part.
    from nmt.train.difficulty import checkpoint_scorer
    from nmt.train.parallel import session
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
        with session(train_cfg.run.device, train_cfg.run.distributed_backend) as this_process:
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
            ).train()
        return 0

    # RuntimeError: non-finite training, collective failures (a peer rank died)
    return run_main("nmt-train", run, paths=command_paths(parser, args), extra=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
