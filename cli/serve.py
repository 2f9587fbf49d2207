"""nmt-serve: an HTTP translation service (LibreTranslate's API) over a checkpoint or an nmt-export directory."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time

from nmt.config import EvalConfig
from nmt.deploy.serve import ServeConfig, create_app
from nmt.eval.ct2_model import CT2Model
from nmt.eval.translate import Translator, language_pair
from nmt_cli.options import (
    ArgumentParser,
    add_config_arguments,
    command_paths,
    config_from_args,
    log_to_stderr,
    mark_path,
    run_main,
)

logger = logging.getLogger("nmt.serve")
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers over this are answered 400 (h11's default)


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
    mark_path(
        parser.add_argument(
            "--path", required=True, help="checkpoint file, or a directory written by nmt-export"
        ),
        "read",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=5000, help="0: any free port (the one taken is printed)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="compute threads (0: one per core, or OMP_NUM_THREADS when set)",
    )
    parser.add_argument(
        "--zero-shot",
        action="store_true",
        help="a multilingual model: also serve the directions it was not trained on (between its languages)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="also log every request (one line per batch is always logged)",
    )
    add_config_arguments(
        parser.add_argument_group("search (as nmt-eval)"), EvalConfig, skip=("nbest", "buffer_size")
    )
    add_config_arguments(parser.add_argument_group("batching and limits"), ServeConfig)
    return parser


def load_translator(args: argparse.Namespace, cfg: EvalConfig) -> Translator:
    if os.path.isdir(args.path):
        exported = CT2Model.load(args.path, device=args.device, threads=args.threads)
        return Translator(exported, src_spm=exported.src_spm, tgt_spm=exported.tgt_spm, config=cfg)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return Translator.from_checkpoint(args.path, device=args.device, config=cfg)


def listen(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: must be in [0, 65535] (0: any free port), got {port}")
    try:
        return socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
    except OSError as error:
        raise ValueError(
            f"--host/--port: cannot listen on {host}:{port} ({error.strerror or error})"
        ) from None


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        raise ValueError("nmt-serve needs the serve extra: pip install 'nmt[serve]'") from None
    serve_cfg = config_from_args(ServeConfig, args)
    cfg = config_from_args(EvalConfig, args)
    if args.threads < 0:
        raise ValueError(f"--threads: must be >= 0 (0: one per core), got {args.threads}")
    from nmt.deploy.connections import GuardedH11Protocol

    # Listen first: a taken port is reported at once, and early clients wait in the backlog.
    with listen(args.host, args.port) as sock:
        source_lang, target_lang = language_pair(args.path)
        translator = load_translator(args, cfg)
        started = time.perf_counter()
        # First-call allocations happen here, not in a user's request; under any --min-len (an
        # impossible one failed when the translator was made, a long one may not fit "warm up").
        warm_up = (
            {}
            if translator.languages is None
            else dict(zip(("source_lang", "target_lang"), translator.languages.pairs[0].split("-")))
        )
        translator.translate(["warm up"], min_len=0, **warm_up)
        logger.info(
            "model loaded from %s (%s -> %s), warm-up decode %.0f ms",
            args.path,
            source_lang,
            target_lang,
            (time.perf_counter() - started) * 1000,
        )
        backend = "ctranslate2" if isinstance(translator.model, CT2Model) else "torch"
        app = create_app(
            translator,
            serve_cfg,
            source_lang=source_lang,
            target_lang=target_lang,
            backend=backend,
            zero_shot=args.zero_shot,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="info",
                access_log=args.access_log,
                lifespan="on",
                http=GuardedH11Protocol.configure(
                    header_timeout=serve_cfg.header_timeout,
                    max_connections=serve_cfg.max_connections,
                ),
                ws="none",
                timeout_keep_alive=serve_cfg.keep_alive_timeout,  # type: ignore[arg-type]
                # uvicorn counts the asking connection itself: N + 1 serves N connections, and
                # then bounds the handlers in flight, which outlive a client that hung up.
                limit_concurrency=serve_cfg.max_connections + 1,
                timeout_graceful_shutdown=serve_cfg.shutdown_timeout,  # type: ignore[arg-type]
                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            )
        )
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the handlers
        # that were there before it: ours, so that a requested stop ends with exit status 0.
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda *_: None)
        host, port = sock.getsockname()[:2]
        print(
            f"nmt-serve: listening on http://{host}:{port} ({backend}, {source_lang} -> {target_lang})",
            file=sys.stderr,
            flush=True,
        )
        server.run(sockets=[sock])
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_to_stderr()
    return run_main("nmt-serve", lambda: _serve(args), paths=command_paths(parser, args))


if __name__ == "__main__":
    sys.exit(main())
