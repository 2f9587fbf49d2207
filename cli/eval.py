"""nmt-eval: translate a split of a preprocessed dataset, a file or stdin with checkpoint(s); score with sacreBLEU."""

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
from nmt.config import EvalConfig, EvalIOConfig
from nmt.eval.evaluate import evaluate
from nmt.workers import stop_on_signals


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-eval",
        description=(
            "Translate with a checkpoint (or an ensemble) and score with sacreBLEU. Either DATA_DIR --split "
            "(binarized data, scored against the raw reference text it was made from) or raw text from "
            "--input / stdin (scored when --reference is given). The output goes to --output, else stdout; "
            "scores go to stdout, or to stderr when plain translations are on stdout (--format fairseq "
            "ends its output with them, as fairseq-generate does)."
        ),
    )
    add_config_arguments(parser.add_argument_group("input, output, device"), EvalIOConfig)
    add_config_arguments(parser.add_argument_group("search"), EvalConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()

    def run() -> int:
        # SIGTERM unwinds like Ctrl+C: temporaries and half-made datasets are removed on the way out.
        with stop_on_signals():
            return evaluate(
                config_from_args(EvalIOConfig, args), config_from_args(EvalConfig, args)
            )

    return run_main("nmt-eval", run, paths=command_paths(parser, args))


if __name__ == "__main__":
    sys.exit(main())
