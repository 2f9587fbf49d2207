"""nmt-preprocess: train/apply SentencePiece, filter, binarize parallel text."""

from __future__ import annotations

import sys

from nmt.command import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    log_to_stderr,
    run_main,
)
from nmt.config import PreprocessConfig


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-preprocess",
        description="Train or apply SentencePiece, filter and binarize parallel text into memory-mapped datasets.",
    )
    add_config_arguments(parser, PreprocessConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()

    def run() -> int:
        from nmt.data.preprocess import preprocess, summary_table
        from nmt.workers import stop_on_signals

        cfg = config_from_args(PreprocessConfig, args)
        # SIGTERM unwinds like Ctrl+C: the pool closed, the work directory removed, the lock released.
        with stop_on_signals():
            manifest, stats = preprocess(cfg)
        print(summary_table(stats))
        print(
            f"wrote {manifest.directory} (vocab {manifest.spm.src_vocab_size}/{manifest.spm.tgt_vocab_size})"
        )
        return 0

    return run_main("nmt-preprocess", run, paths=command_paths(parser, args))


if __name__ == "__main__":
    sys.exit(main())
