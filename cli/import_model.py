"""nmt-import: a model of another toolkit -> an nmt checkpoint and its SentencePiece model(s).

From Hugging Face (a MarianMT directory, e.g. an OPUS-MT model) or fairseq (a transformer
checkpoint trained on SentencePiece pieces, with its dict.txt). The output directory holds
``checkpoint.pt``, which every nmt tool reads (nmt-eval, nmt-export, nmt-serve, nmt-train
--restore-file), and the SentencePiece model(s) a dataset for fine-tuning is made with
(``nmt-preprocess --spm-model``).
"""

from __future__ import annotations

import argparse
import os
import sys

from nmt.command import ArgumentParser, command_paths, log_to_stderr, mark_path, run_main


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-import",
        description=(
            "Convert a Hugging Face MarianMT directory (pip install 'nmt[hf]') or a fairseq transformer "
            "checkpoint into an nmt checkpoint (OUTPUT_DIR/checkpoint.pt) with its SentencePiece "
            "model(s) for nmt-preprocess --spm-model."
        ),
    )
    mark_path(
        parser.add_argument(
            "source", metavar="SOURCE", help="MarianMT directory or fairseq checkpoint"
        ),
        "read",
    )
    parser.add_argument(
        "--from",
        dest="source_format",
        required=True,
        choices=("huggingface", "fairseq"),
        help="what SOURCE is",
    )
    mark_path(
        parser.add_argument("--output-dir", required=True, help="directory to write"), "export"
    )
    mark_path(
        parser.add_argument(
            "--dict", help="fairseq: dict.txt (one for both sides, or source,target)"
        ),
        "read",
        separator=",",
    )
    mark_path(
        parser.add_argument(
            "--spm-model",
            help="fairseq: the SentencePiece model the data was encoded with (one, or source,target)",
        ),
        "read",
        separator=",",
    )
    parser.add_argument(
        "-s", "--source-lang", help="source language (default: from the model's files)"
    )
    parser.add_argument(
        "-t", "--target-lang", help="target language (default: from the model's files)"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing non-empty --output-dir"
    )
    return parser


def _import(args: argparse.Namespace, argv: list[str]) -> int:
    languages = dict(source_lang=args.source_lang, target_lang=args.target_lang)
    if args.source_format == "huggingface":
        if args.dict or args.spm_model:
            raise ValueError(
                "--dict, --spm-model: fairseq only (a MarianMT directory has its own vocabulary)"
            )
        from nmt.deploy.huggingface import import_marian

        result = import_marian(
            args.source, args.output_dir, force=args.force, command_line=argv, **languages
        )
    else:
        if not args.dict or not args.spm_model:
            raise ValueError("--from fairseq needs --dict and --spm-model")
        from nmt.deploy.fairseq import import_fairseq

        result = import_fairseq(
            args.source,
            args.output_dir,
            dictionaries=args.dict.split(","),
            spm_models=args.spm_model.split(","),
            force=args.force,
            command_line=argv,
            **languages,
        )
    spm_models = ",".join(os.path.join(args.output_dir, name) for name in result["spm_files"])
    print(
        f"wrote {os.path.join(args.output_dir, 'checkpoint.pt')}; a dataset for it: "
        f"nmt-preprocess --spm-model {spm_models} ..."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(words)
    log_to_stderr()
    return run_main(
        "nmt-import",
        lambda: _import(args, ["nmt-import", *words]),
        paths=command_paths(parser, args),
    )


if __name__ == "__main__":
    sys.exit(main())
