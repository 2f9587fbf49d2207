"""nmt-serve: an HTTP translation service (LibreTranslate's API) over a checkpoint or an nmt-export
directory, in three parts with one job each:

- ``nmt.deploy.protocol``: LibreTranslate's request and response bodies, and its errors (pure);
- ``nmt.deploy.batcher``: concurrent requests decoded together, one decode at a time;
- ``nmt.deploy.app``: the routes wiring the two (Starlette), on connections bounded by
  ``nmt.deploy.connections`` (uvicorn).

A multilingual model serves every direction it was trained on (``source``/``target`` per request;
requests of different directions share a decode; ``source: auto`` is identified by langid; an
untrained direction is a 400 naming the directions, unless nmt-serve --zero-shot).

This module loads the model and runs the server (``run_server``); its parts' names used across
the package are importable from here too.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time

from nmt.config import EvalConfig, ServeConfig, ServeIOConfig
from nmt.data.terminology import Glossary
from nmt.deploy.batcher import DynamicBatcher
from nmt.deploy.protocol import RequestError, Service, TranslateRequest, parse_request
from nmt.eval.ct2_model import CT2Model
from nmt.eval.translate import Translator

__all__ = [
    "DynamicBatcher",
    "RequestError",
    "ServeConfig",
    "Service",
    "TranslateRequest",
    "parse_request",
    "run_server",
]

logger = logging.getLogger(__name__)
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers over this are answered 400 (h11's default)


def load_translator(io: ServeIOConfig, cfg: EvalConfig) -> Translator:
    if os.path.isdir(io.path):
        exported = CT2Model.load(io.path, device=io.device, threads=io.threads)
        return Translator(exported, src_spm=exported.src_spm, tgt_spm=exported.tgt_spm, config=cfg)
    if io.threads:
        import torch

        torch.set_num_threads(io.threads)
    return Translator.from_checkpoint(io.path, device=io.device, config=cfg)


def listen(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
    except OSError as error:
        raise ValueError(
            f"--host/--port: cannot listen on {host}:{port} ({error.strerror or error})"
        ) from None


def warm_up(translator: Translator) -> None:
    """First-call allocations happen here, not in a user's request; under any --min-len (an
    impossible one failed when the translator was made, a long one may not fit "warm up")."""
    first = translator.languages.first
    translator.translate(["warm up"], min_len=0, source_lang=first.source, target_lang=first.target)


def run_server(io: ServeIOConfig, cfg: ServeConfig, search: EvalConfig) -> int:
    """Serve until SIGTERM or SIGINT (then answer the requests in flight): 0, or 1 when the
    server did not start."""
    try:
        import uvicorn
    except ImportError:
        raise ValueError("nmt-serve needs the serve extra: pip install 'nmt[serve]'") from None
    from nmt.deploy.app import create_app
    from nmt.deploy.connections import GuardedH11Protocol

    glossaries = {name: Glossary.read(path) for name, path in cfg.glossary_files.items()}

    # Listen first: a taken port is reported at once, and early clients wait in the backlog.
    with listen(io.host, io.port) as sock:
        translator = load_translator(io, search)
        source_lang = ",".join(translator.languages.sources)
        target_lang = ",".join(translator.languages.targets)
        started = time.perf_counter()
        warm_up(translator)
        logger.info(
            "model loaded from %s (%s -> %s), warm-up decode %.0f ms",
            io.path,
            source_lang,
            target_lang,
            (time.perf_counter() - started) * 1000,
        )
        backend = "ctranslate2" if isinstance(translator.model, CT2Model) else "torch"
        app = create_app(
            translator,
            cfg,
            backend=backend,
            zero_shot=io.zero_shot,
            glossaries=glossaries,
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="info",
                access_log=io.access_log,
                lifespan="on",
                http=GuardedH11Protocol.configure(
                    header_timeout=cfg.header_timeout, max_connections=cfg.max_connections
                ),
                ws="none",
                timeout_keep_alive=cfg.keep_alive_timeout,  # type: ignore[arg-type]
                # uvicorn counts the asking connection itself: N + 1 serves N connections, and
                # then bounds the handlers in flight, which outlive a client that hung up.
                limit_concurrency=cfg.max_connections + 1,
                timeout_graceful_shutdown=cfg.shutdown_timeout,  # type: ignore[arg-type]
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
