"""nmt-serve: an HTTP translation service (LibreTranslate's API) over a checkpoint or an nmt-export directory."""

from __future__ import annotations

import argparse
import sys

from nmt.command import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    log_to_stderr,
    run_main,
)
from nmt.config import EvalConfig, ServeConfig, ServeIOConfig
from nmt.deploy.serve import run_server


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-serve",
        description=(
            'Serve translations over HTTP: POST /translate {"q": str | [str], "source", "target", '
            '"alternatives"} -> {"translatedText": ...} (LibreTranslate\'s shape, JSON or form), POST /detect, '
            "GET /languages, GET /health, a web page at /. A multilingual model serves each request's "
            "direction. Concurrent requests are batched into one decode. SIGTERM (or Ctrl+C) answers the requests in flight, then exits 0 "
            "(within --shutdown-timeout). "
            "Needs pip install 'nmt[serve]' (and 'nmt[ct2]' for an exported directory)."
        ),
    )
    add_config_arguments(parser, ServeIOConfig)
    add_config_arguments(
        parser.add_argument_group("search (as nmt-eval)"), EvalConfig, skip=("nbest", "buffer_size")
    )
    add_config_arguments(parser.add_argument_group("batching and limits"), ServeConfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()
    return run_main("nmt-serve", lambda: _serve(args), paths=command_paths(parser, args))


def _serve(args: argparse.Namespace) -> int:
    # In the order the options were always checked: limits, search, then what and where.
    cfg = config_from_args(ServeConfig, args)
    search = config_from_args(EvalConfig, args)
    return run_server(config_from_args(ServeIOConfig, args), cfg, search)


if __name__ == "__main__":
    sys.exit(main())
