"""nmt-serve's ASGI app: LibreTranslate's request shape over a dynamically batched Translator.

    POST /translate  {"q": "text" | ["text", ...], "source": "en", "target": "de"}
                     -> {"translatedText": "..." | ["...", ...]}
    GET  /health     -> {"status": "ok", ...}      GET /languages (LibreTranslate's list)     GET / (a web page)

A text is split into sentences on "\\n" only and joined back with "\\n" (one sentence per line, as
everywhere in nmt). Concurrent requests meet in one queue; a single task takes from it a batch of
whole requests (up to a source-token budget, waiting at most a few milliseconds after the oldest
arrived, and not at all while a decode is running: requests pile up meanwhile) and hands it to one
decode on a worker thread, so the event loop keeps accepting and answering while the model runs.
Bad requests get a 4xx with ``{"error": "..."}``, a sentence that cannot be translated as asked
(longer than the model reads, or --min-len over its length limit) included, before it joins a
batch; a decode that fails anyway is retried request by request, so that it fails only its own
(500). Connections are bounded in time and number by ``nmt.deploy.connections``.

Starlette rather than FastAPI: the API is four routes with hand-written validation (exact LibreTranslate
shapes and one-line errors), so FastAPI's pydantic layer would add a dependency and nothing we use;
Starlette is the ASGI toolkit FastAPI itself is built on. uvicorn serves it (graceful shutdown: on
SIGTERM it stops accepting, lets in-flight requests finish within --shutdown-timeout, then runs our
lifespan shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import importlib.resources
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.config import opt, option_name
from nmt.data.spm import EOS_ID
from nmt.eval.hypothesis import LengthLimitError
from nmt.eval.translate import Translator

logger = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """Limits and batching of the service (``nmt-serve`` makes its options from these fields)."""

    max_body_bytes: int = opt(
        1 << 20, "a request body over this many bytes is refused (413) before it is parsed"
    )
    max_request_sentences: int = opt(128, "sentences per request (the lines of all its texts)")
    max_batch_tokens: int = opt(
        4096, "source tokens (EOS included) gathered into one decode; a bigger request goes alone"
    )
    max_wait_ms: float = opt(
        5.0, "how long the oldest queued request waits for others to share its decode"
    )
    max_connections: int = opt(
        256, "open connections at most; a further one is answered 503 and closed"
    )
    header_timeout: float = opt(
        10.0,
        "seconds a connection has to send a whole request head, from its opening or its last "
        "response; then it is closed",
    )
    body_timeout: float = opt(
        30.0, "seconds a request has to send its whole body once its head is in (else 408)"
    )
    keep_alive_timeout: float = opt(
        5.0, "an idle connection is closed this many seconds after its last response"
    )
    shutdown_timeout: float = opt(
        20.0,
        "on SIGTERM, seconds the requests in flight have to finish before they are cancelled "
        "and the server exits",
    )

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_request_sentences",
            "max_batch_tokens",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{option_name(name)}: must be >= 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"--max-wait-ms: must be >= 0, got {self.max_wait_ms}")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "shutdown_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{option_name(name)}: must be > 0, got {getattr(self, name)}")


class RequestError(Exception):
    """A client's mistake: answered with ``status`` and ``{"error": message}``; ``close``: the
    request was not read to its end, so the connection cannot carry another one."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


@dataclass
class _Job:
    """One request's sentences on their way through the queue."""

    sources: list[np.ndarray]  # piece ids + EOS, one per sentence
    num_tokens: int
    arrived: float  # event-loop time
    future: asyncio.Future[list[str]]


class DynamicBatcher:
    """Gathers concurrent requests into one decode at a time (see the module docstring)."""

    def __init__(
        self, translator: Translator, *, max_batch_tokens: int, max_wait_ms: float
    ) -> None:
        self.translator = translator
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.num_batches = 0
        self._jobs: deque[_Job] = deque()
        self._queued_tokens = 0
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-decode")
        self._task: asyncio.Task[None] | None = None

    @property
    def queued_sentences(self) -> int:
        return sum(len(job.sources) for job in self._jobs)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nmt-batcher")

    async def stop(self) -> None:
        """After the server has answered every request: end the batching task and the decode thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def translate(self, sentences: list[str]) -> list[str]:
        """Translations of ``sentences`` (in order), decoded together with whatever else is queued.

        A sentence that cannot be translated as asked (longer than the model reads, or under a
        length limit shorter than --min-len) raises ``LengthLimitError`` before it joins a batch.
        """
        loop = asyncio.get_running_loop()
        sources = [
            np.array(ids + [EOS_ID], dtype=np.int64)
            for ids in self.translator.src_spm.encode(sentences)
        ]
        self.translator.check_sources(sources, self.translator.config, truncate=False)
        job = _Job(
            sources, sum(len(source) for source in sources), loop.time(), loop.create_future()
        )
        self._jobs.append(job)
        self._queued_tokens += job.num_tokens
        self._arrived.set()
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._jobs:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            deadline = self._jobs[0].arrived + self.max_wait_s
            while (
                self._queued_tokens < self.max_batch_tokens
                and (remaining := deadline - loop.time()) > 0
            ):
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            await self._decode(self._take_batch())

    def _take_batch(self) -> list[_Job]:
        """Oldest first, whole requests, within the token budget (at least one request)."""
        batch = [self._jobs.popleft()]
        num_tokens = batch[0].num_tokens
        while self._jobs and num_tokens + self._jobs[0].num_tokens <= self.max_batch_tokens:
            num_tokens += self._jobs[0].num_tokens
            batch.append(self._jobs.popleft())
        self._queued_tokens -= num_tokens
        return batch

    async def _decode(self, batch: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        waited_ms = (loop.time() - batch[0].arrived) * 1000
        started = time.perf_counter()
        sources = [source for job in batch for source in job.sources]
        try:
            texts, num_target_tokens = await loop.run_in_executor(
                self._executor, self._translate, sources
            )
        except Exception as error:  # a failed decode fails its own request, not the service
            if len(batch) > 1:  # nor the requests that shared its batch: each goes again alone
                logger.warning(
                    "decode of %d requests failed (%s: %s); decoding each alone",
                    len(batch),
                    type(error).__name__,
                    error,
                )
                for job in batch:
                    await self._decode([job])
                return
            logger.exception("decode of a request (%d sentences) failed", len(sources))
            if not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        self.num_batches += 1
        offset = 0
        for job in batch:
            if not job.future.done():  # done: the client went away (the handler was cancelled)
                job.future.set_result(texts[offset : offset + len(job.sources)])
            offset += len(job.sources)
        logger.info(
            "batch %d: %d requests, %d sentences, %d source tokens -> %d target tokens, %.1f ms (oldest waited %.1f ms)",
            self.num_batches,
            len(batch),
            len(sources),
            sum(job.num_tokens for job in batch),
            num_target_tokens,
            (time.perf_counter() - started) * 1000,
            waited_ms,
        )

    def _translate(self, sources: list[np.ndarray]) -> tuple[list[str], int]:
        """On the decode thread: best translation per source, and the target tokens (EOS counted)."""
        nbests = self.translator.detokenize(self.translator.generate(sources))
        return [nbest[0].text for nbest in nbests], sum(
            len(nbest[0].tokens) + 1 for nbest in nbests
        )


def parse_request(
    body: bytes, *, source_lang: str, target_lang: str, max_sentences: int
) -> tuple[list[list[str]], bool]:
    """A LibreTranslate body -> per text its lines, and whether ``q`` was a list; RequestError otherwise."""
    try:
        payload = json.loads(body)
    except RecursionError:
        raise RequestError(400, "invalid JSON: nested too deeply") from None
    except ValueError as error:  # not JSON, not UTF-8, an integer of over 4,300 digits...
        raise RequestError(400, f"invalid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise RequestError(
            400, 'the body must be a JSON object like {"q": "text", "source": "en", "target": "de"}'
        )
    if "q" not in payload:
        raise RequestError(400, "missing q: the text to translate (a string or a list of strings)")
    q = payload["q"]
    is_list = isinstance(q, list)
    texts = q if is_list else [q]
    if not all(isinstance(text, str) for text in texts):
        raise RequestError(400, "q: must be a string or a list of strings")
    for number, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON's "\\ud800" escape: a lone surrogate
            raise RequestError(
                400,
                f"{_where(number, None, is_list)}: character {error.start + 1} is a lone surrogate "
                f"(U+{ord(text[error.start]):04X}), which is not text",
            ) from None
    for key, expected, allowed in (
        ("source", source_lang, {source_lang, "auto"}),
        ("target", target_lang, {target_lang}),
    ):
        value = payload.get(key, expected)
        if not isinstance(value, str):
            raise RequestError(400, f"{key}: must be a string")
        if value not in allowed:
            raise RequestError(
                400,
                f"{key}: this service translates {source_lang} -> {target_lang}, not {key} {value!r}",
            )
    lines = [text.split("\n") for text in texts]  # one sentence per line: "\n" only
    num_sentences = sum(len(text_lines) for text_lines in lines)
    if num_sentences > max_sentences:
        raise RequestError(
            400,
            f"too many sentences: {num_sentences} in one request, at most {max_sentences} (--max-request-sentences)",
        )
    return lines, is_list


def _where(text: int, line: int | None, is_list: bool) -> str:
    """A place in ``q`` as a client can find it: "q", "q[2]", "q line 3", "q[2] line 3" (1-based lines)."""
    place = f"q[{text}]" if is_list else "q"
    return place if line is None else f"{place} line {line + 1}"


def locate(lines: list[list[str]], index: int, *, is_list: bool) -> str:
    """Where sentence ``index`` of the flattened ``lines`` is in the request (``_where``)."""
    for text, text_lines in enumerate(lines):
        if index < len(text_lines):
            return _where(text, index if len(text_lines) > 1 else None, is_list)
        index -= len(text_lines)
    raise IndexError(index)


async def read_body(request: Any, *, limit: int, timeout: float) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed ``limit`` bytes, and (408)
    when it has not all come within ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(
            413, f"request body of {int(declared)} bytes is over the limit of {limit}", close=True
        )

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(
                    413, f"request body is over the limit of {limit} bytes", close=True
                )
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(
            408,
            f"the request body did not all come within {timeout:g} s (--body-timeout)",
            close=True,
        ) from None


def web_page(*, source_lang: str, target_lang: str) -> str:
    page = (
        importlib.resources.files("nmt.deploy")
        .joinpath("static/index.html")
        .read_text(encoding="utf-8")
    )
    return page.replace("__SOURCE__", html.escape(source_lang)).replace(
        "__TARGET__", html.escape(target_lang)
    )


def create_app(
    translator: Translator, cfg: ServeConfig, *, source_lang: str, target_lang: str, backend: str
) -> Any:
    """The Starlette app; its lifespan starts and stops the batcher (so it must run under an ASGI server)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    state: dict[str, DynamicBatcher] = {}
    page = web_page(source_lang=source_lang, target_lang=target_lang)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["batcher"] = batcher = DynamicBatcher(
            translator, max_batch_tokens=cfg.max_batch_tokens, max_wait_ms=cfg.max_wait_ms
        )
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    async def translate(request: Request) -> Response:
        try:
            return await answer(request)
        except asyncio.CancelledError:  # SIGTERM, and --shutdown-timeout is over: a last word
            return JSONResponse(
                {"error": "the server is shutting down (--shutdown-timeout); try again"},
                status_code=503,
                headers={"connection": "close"},
            )

    async def answer(request: Request) -> Response:
        try:
            body = await read_body(request, limit=cfg.max_body_bytes, timeout=cfg.body_timeout)
            lines, is_list = parse_request(
                body,
                source_lang=source_lang,
                target_lang=target_lang,
                max_sentences=cfg.max_request_sentences,
            )
        except RequestError as error:
            return JSONResponse(
                {"error": error.message},
                status_code=error.status,
                headers={"connection": "close"} if error.close else None,
            )
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        try:
            translations = await state["batcher"].translate(
                [line for text_lines in lines for line in text_lines]
            )
        except LengthLimitError as error:
            where = locate(lines, error.index, is_list=is_list)
            return JSONResponse({"error": f"{where}: {error.reason}"}, status_code=400)
        texts, offset = [], 0
        for text_lines in lines:
            texts.append("\n".join(translations[offset : offset + len(text_lines)]))
            offset += len(text_lines)
        return JSONResponse({"translatedText": texts if is_list else texts[0]})

    async def health(request: Request) -> Response:
        batcher = state["batcher"]
        return JSONResponse(
            {
                "status": "ok",
                "backend": backend,
                "source": source_lang,
                "target": target_lang,
                "queued_sentences": batcher.queued_sentences,
                "batches": batcher.num_batches,
            }
        )

    async def languages(request: Request) -> Response:
        return JSONResponse(
            [
                {"code": source_lang, "name": source_lang, "targets": [target_lang]},
                {"code": target_lang, "name": target_lang, "targets": []},
            ]
        )

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return JSONResponse(
            {"error": error.detail}, status_code=error.status_code, headers=error.headers
        )

    async def server_error(request: Request, error: Exception) -> Response:
        return JSONResponse(
            {"error": f"internal error: {type(error).__name__}: {error}"}, status_code=500
        )

    return Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/languages", languages, methods=["GET"]),
            Route("/translate", translate, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
