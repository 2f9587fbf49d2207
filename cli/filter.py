"""nmt-filter: score a dataset's pairs by dual conditional cross-entropy and keep the best."""

from __future__ import annotations

import os
import sys

from nmt.command import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    log_to_stderr,
    run_main,
)
from nmt.config import FilterConfig
from nmt.workers import stop_on_signals


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-filter",
        description=(
            "Score each pair of a dataset by dual conditional cross-entropy (Junczys-Dowmunt 2018) under "
            "a forward and a reverse model; print the distribution; keep the best pairs as a dataset "
            "(--keep-fraction or --threshold with --destdir) and/or write the scores (--scores). "
            "Under torchrun the ranks share the scoring."
        ),
    )
    add_config_arguments(parser, FilterConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()

    def run() -> int:
        # SIGTERM unwinds like Ctrl+C: temporaries and half-made datasets are removed on the way out.
        with stop_on_signals():
            return _filter(config_from_args(FilterConfig, args))

    return run_main("nmt-filter", run, paths=command_paths(parser, args))


def _filter(cfg: FilterConfig) -> int:
    from nmt import dist
    from nmt.train.filtering import distribution, filter_dataset

    with dist.session(cfg.device) as this_process:
        result = filter_dataset(
            cfg,
            device=this_process.device,
            rank=this_process.rank,
            world_size=this_process.world_size,
        )
    if not this_process.is_main:
        return 0
    print(f"dual conditional cross-entropy of {len(result.scores)} pairs (lower is better):")
    print(distribution(result.scores))
    print(
        f"per-token cross-entropy: forward mean {result.forward.mean():.3f}, reverse mean {result.reverse.mean():.3f}"
    )
    if result.kept is not None and result.manifest is not None:
        kept = len(result.kept)
        worst = float(result.scores[result.kept].max()) if kept else float("nan")
        print(
            f"kept {kept} of {len(result.scores)} pairs ({kept / len(result.scores):.1%}, scores <= {worst:.3f}) "
            f"in {result.manifest.directory}"
        )
    if cfg.scores is not None:
        print(f"wrote the scores to {os.path.abspath(cfg.scores)} (--curriculum file:)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
