"""nmt-export: a checkpoint -> a CTranslate2 model directory (with its SentencePiece model) for fast
inference, or a MarianMT directory for Hugging Face transformers."""

from __future__ import annotations

import argparse
import os
import sys

from nmt.command import ArgumentParser, command_paths, log_to_stderr, mark_path, run_main
from nmt.deploy.ct2 import QUANTIZATIONS, export_ctranslate2


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-export",
        description=(
            "Convert a checkpoint to CTranslate2 (pip install 'nmt[ct2]'). The directory then translates with "
            "nmt-eval --path DIR, Translator.from_checkpoint(DIR) and nmt-serve --path DIR. "
            "--format huggingface writes a MarianMT directory for transformers (pip install 'nmt[hf]')."
        ),
    )
    mark_path(
        parser.add_argument(
            "checkpoint", metavar="CKPT", help="checkpoint file; a,b,c averages their weights"
        ),
        "read",
        separator=",",
    )
    parser.add_argument(
        "--format",
        default="ctranslate2",
        choices=("ctranslate2", "huggingface"),
        help="export format",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        help="weight type (default: float32; CTranslate2 only)",
    )
    mark_path(
        parser.add_argument(
            "--scores",
            metavar="FILE",
            help="huggingface: nmt-eval's output with the test scores and signatures, for the model card",
        ),
        "read",
    )
    mark_path(
        parser.add_argument(
            "--output-dir",
            required=True,
            help="directory to write (built aside, renamed into place when complete)",
        ),
        "export",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing non-empty --output-dir"
    )
    return parser


def _size_mib(directory: str) -> float:
    return (
        sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))
        / 2**20
    )


def _export(args: argparse.Namespace) -> int:
    checkpoints = [path for path in args.checkpoint.split(",") if path]
    if args.format == "huggingface":
        if args.quantization:
            raise ValueError("--quantization: CTranslate2 only; the Hugging Face export is float32")
        from nmt.deploy.huggingface import export_huggingface

        checked = export_huggingface(
            checkpoints, args.output_dir, force=args.force, scores=args.scores
        )
        print(
            f"wrote {args.output_dir} (MarianMT, {_size_mib(args.output_dir):.1f} MiB; transformers "
            f"loads it with logits within {checked['max_logit_difference']:.2g} of ours)"
        )
        return 0
    if args.scores:
        raise ValueError("--scores: only for --format huggingface (its model card)")
    manifest = export_ctranslate2(
        checkpoints, args.output_dir, quantization=args.quantization, force=args.force
    )
    print(
        f"wrote {args.output_dir} ({manifest['quantization']}, {manifest['source_lang']}->{manifest['target_lang']}, "
        f"{_size_mib(args.output_dir):.1f} MiB)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()
    return run_main("nmt-export", lambda: _export(args), paths=command_paths(parser, args))


if __name__ == "__main__":
    sys.exit(main())
