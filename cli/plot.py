"""nmt-plot: training curves (loss, valid loss/BLEU, learning rate against updates and wall-clock
minutes) from nmt-train's JSON log or TensorBoard directory, as a picture."""

from __future__ import annotations

import logging
import sys

from nmt.command import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    log_to_stderr,
    run_main,
)
from nmt.config import PlotConfig


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-plot",
        description=(
            "Draw training loss, validation loss and BLEU, and the learning rate against updates and wall-clock "
            "minutes, from `nmt-train --log-format json` output (saved stdout) or a --tensorboard-logdir directory."
        ),
    )
    add_config_arguments(parser, PlotConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()
    for chatty in (
        "matplotlib",
        "tensorboard",
    ):  # font cache and event-file notices, not the user's concern
        logging.getLogger(chatty).setLevel(logging.WARNING)

    def run() -> int:
        from nmt.plot import plot_curves, read_curves

        cfg = config_from_args(PlotConfig, args)
        curves = read_curves(cfg.log)
        plot_curves(curves, cfg.output, title=cfg.title or cfg.log)
        summary = ", ".join(
            f"{name} ({len(series.updates)} points)" for name, series in curves.items()
        )
        print(f"wrote {cfg.output}: {summary}", file=sys.stderr)
        return 0

    return run_main("nmt-plot", run, paths=command_paths(parser, args))


if __name__ == "__main__":
    sys.exit(main())
