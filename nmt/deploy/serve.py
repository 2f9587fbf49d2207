"""nmt-serve's ASGI app: LibreTranslate's request shape over a dynamically batched Translator.

    POST /translate  {"q": "text" | ["text", ...], "source": "en", "target": "de", "alternatives": 2}
                     -> {"translatedText": "..." | ["...", ...], "alternatives": [...]}
                     (JSON, or a form: application/x-www-form-urlencoded, as LibreTranslate's clients post)
    POST /detect     {"q": "text"} -> [{"confidence": 98.5, "language": "en"}]
    GET  /health     -> {"status": "ok", ...}      GET /languages (LibreTranslate's list)     GET / (a web page)

A multilingual model serves every direction it was trained on (``source``/``target`` per request;
requests of different directions share a decode; ``source: auto`` is identified by langid; an
untrained direction is a 400 naming the directions, unless nmt-serve --zero-shot).

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
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.config import ServeConfig
from nmt.eval.hypothesis import LengthLimitError
from nmt.eval.languages import BILINGUAL, Direction, Languages, language_name
from nmt.eval.translate import Translator

logger = logging.getLogger(__name__)


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

    sources: list[np.ndarray]  # piece ids + EOS, one per sentence (a source tag first)
    num_tokens: int
    arrived: float  # event-loop time
    future: asyncio.Future[list[list[str]]]
    first_token: int | None = None  # a decoder-side target tag, forced
    nbest: int = 1


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

    async def translate(
        self, sentences: list[str], *, direction: Direction = BILINGUAL, nbest: int = 1
    ) -> list[list[str]]:
        """The ``nbest`` best translations of each of ``sentences`` (in order), decoded together
        with whatever else is queued (other directions of a multilingual model included).

        A sentence that cannot be translated as asked (longer than the model reads, or under a
        length limit shorter than --min-len) raises ``LengthLimitError`` before it joins a batch.
        """
        loop = asyncio.get_running_loop()
        sources = self.translator.encode(sentences, direction=direction)
        self.translator.check_sources(sources, self.translator.config, truncate=False)
        job = _Job(
            sources,
            sum(len(source) for source in sources),
            loop.time(),
            loop.create_future(),
            first_token=direction.first_token,
            nbest=nbest,
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
        first_tokens = (
            None
            if all(job.first_token is None for job in batch)
            else [job.first_token for job in batch for _ in job.sources]
        )
        nbest = max(job.nbest for job in batch)
        try:
            texts, num_target_tokens = await loop.run_in_executor(
                self._executor, self._translate, sources, first_tokens, nbest
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
                job.future.set_result(
                    [nbest[: job.nbest] for nbest in texts[offset : offset + len(job.sources)]]
                )
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

    def _translate(
        self, sources: list[np.ndarray], first_tokens: list[int] | None, nbest: int
    ) -> tuple[list[list[str]], int]:
        """On the decode thread: the ``nbest`` best translations per source, and the target
        tokens of the best ones (EOS counted)."""
        options = (
            {} if nbest == 1 else {"nbest": nbest, "beam": max(nbest, self.translator.config.beam)}
        )
        nbests = self.translator.detokenize(
            self.translator.generate(sources, first_tokens=first_tokens, **options)
        )
        return [[t.text for t in found] for found in nbests], sum(
            len(found[0].tokens) + 1 for found in nbests
        )


@dataclass
class TranslateRequest:
    """A parsed POST /translate (or /detect: ``q`` only)."""

    lines: list[list[str]]  # per text of q, its lines (sentences)
    is_list: bool  # q was a list
    source: str | None = None  # "auto": detect it
    target: str | None = None
    alternatives: int = 0  # further translations besides the best


MAX_ALTERNATIVES = 8


def _payload(body: bytes, content_type: str) -> dict[str, Any]:
    """A JSON object, or a form (``application/x-www-form-urlencoded``, as LibreTranslate's own
    clients post it): a key given several times is a list."""
    if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        try:
            fields = urllib.parse.parse_qs(
                body.decode("utf-8"), keep_blank_values=True, strict_parsing=False
            )
        except UnicodeDecodeError as error:
            raise RequestError(400, f"invalid form: not UTF-8 ({error.reason})") from None
        return {key: values[0] if len(values) == 1 else values for key, values in fields.items()}
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
    return payload


def parse_request(
    body: bytes, *, max_sentences: int, content_type: str = "application/json"
) -> TranslateRequest:
    """A LibreTranslate body (JSON or form) -> a ``TranslateRequest``; RequestError otherwise.
    Which directions exist is the service's to check (``Service.direction``)."""
    payload = _payload(body, content_type)
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
    for key in ("source", "target"):
        if not isinstance(payload.get(key, ""), str):
            raise RequestError(400, f"{key}: must be a string")
    text_format = payload.get("format", "text")
    if text_format != "text":
        raise RequestError(
            400,
            f"format: only 'text' is served (got {text_format!r}); send the text between the "
            "tags of an HTML document as text",
        )
    alternatives = payload.get("alternatives", 0)
    if isinstance(alternatives, str) and alternatives.isdigit():  # a form's values are strings
        alternatives = int(alternatives)
    if (
        not isinstance(alternatives, int)
        or isinstance(alternatives, bool)
        or not 0 <= alternatives <= MAX_ALTERNATIVES
    ):
        raise RequestError(
            400,
            f"alternatives: must be an integer from 0 to {MAX_ALTERNATIVES}, got {alternatives!r}",
        )
    lines = [text.split("\n") for text in texts]  # one sentence per line: "\n" only
    num_sentences = sum(len(text_lines) for text_lines in lines)
    if num_sentences > max_sentences:
        raise RequestError(
            400,
            f"too many sentences: {num_sentences} in one request, at most {max_sentences} (--max-request-sentences)",
        )
    return TranslateRequest(
        lines,
        is_list,
        source=payload.get("source") or None,
        target=payload.get("target") or None,
        alternatives=alternatives,
    )


@dataclass(frozen=True)
class Service:
    """What the service translates: one direction (a bilingual model), or a multilingual model's
    directions (untrained ones only with ``zero_shot``)."""

    source_lang: str
    target_lang: str
    languages: Languages | None = None
    zero_shot: bool = False

    @property
    def codes(self) -> list[str]:
        if self.languages is None:
            return [self.source_lang, self.target_lang]
        return sorted(set(self.languages.sources) | set(self.languages.targets))

    def direction(self, source: str | None, target: str | None) -> Direction:
        """The direction of a request (``source`` already detected when it was "auto")."""
        if self.languages is None:
            for key, value, expected in (
                ("source", source, self.source_lang),
                ("target", target, self.target_lang),
            ):
                if value not in (None, expected):
                    raise RequestError(
                        400,
                        f"{key}: this service translates {self.source_lang} -> "
                        f"{self.target_lang}, not {key} {value!r}",
                    )
            return BILINGUAL
        if not source or not target:
            raise RequestError(
                400,
                f"{'source' if not source else 'target'}: required by this multilingual service "
                f"(directions: {', '.join(self.languages.pairs)})",
            )
        try:
            return self.languages.direction(source, target, zero_shot=self.zero_shot)
        except ValueError as error:
            raise RequestError(
                400, str(error).replace("--zero-shot", "nmt-serve --zero-shot")
            ) from None

    def listing(self) -> list[dict[str, Any]]:
        """LibreTranslate's /languages: each language and the targets it translates into."""
        if self.languages is None:
            return [
                {
                    "code": self.source_lang,
                    "name": language_name(self.source_lang),
                    "targets": [self.target_lang],
                },
                {"code": self.target_lang, "name": language_name(self.target_lang), "targets": []},
            ]
        pairs = [pair.split("-") for pair in self.languages.pairs]
        return [
            {
                "code": code,
                "name": language_name(code),
                "targets": sorted(
                    target
                    for target in self.languages.targets
                    if target != code
                    and (
                        self.zero_shot and code in self.languages.sources or [code, target] in pairs
                    )
                ),
            }
            for code in self.codes
        ]

    def detect(self, texts: list[str]) -> list[tuple[str, float]]:
        """(language, confidence 0-100) of each text, among the languages the model reads."""
        from nmt.eval.language_id import detect

        sources = self.languages.sources if self.languages is not None else [self.source_lang]
        return [
            (lang, round(100.0 * confidence, 2))
            for lang, confidence in detect(texts, languages=sources)
        ]


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
    translator: Translator,
    cfg: ServeConfig,
    *,
    source_lang: str,
    target_lang: str,
    backend: str,
    zero_shot: bool = False,
) -> Any:
    """The Starlette app; its lifespan starts and stops the batcher (so it must run under an ASGI server).
    A multilingual translator serves each request's ``source``/``target`` direction."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    state: dict[str, DynamicBatcher] = {}
    service = Service(source_lang, target_lang, translator.languages, zero_shot)
    first = (
        (source_lang, target_lang)
        if translator.languages is None
        else tuple(translator.languages.pairs[0].split("-"))
    )
    page = web_page(source_lang=first[0], target_lang=first[1])

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

    async def parsed(request: Request) -> TranslateRequest:
        body = await read_body(request, limit=cfg.max_body_bytes, timeout=cfg.body_timeout)
        return parse_request(
            body,
            max_sentences=cfg.max_request_sentences,
            content_type=request.headers.get("content-type", "application/json"),
        )

    def error_response(error: RequestError) -> Response:
        return JSONResponse(
            {"error": error.message},
            status_code=error.status,
            headers={"connection": "close"} if error.close else None,
        )

    async def answer(request: Request) -> Response:
        detected: dict[str, Any] | None = None
        try:
            asked = await parsed(request)
            source = asked.source
            if source == "auto" and service.languages is not None:
                text = " ".join(line for lines in asked.lines for line in lines)
                language, confidence = (await run_detect([text]))[0]
                source, detected = language, {"confidence": confidence, "language": language}
            elif source == "auto":
                source = None
            direction = service.direction(source, asked.target)
        except RequestError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        lines, is_list = asked.lines, asked.is_list
        try:
            translations = await state["batcher"].translate(
                [line for text_lines in lines for line in text_lines],
                direction=direction,
                nbest=asked.alternatives + 1,
            )
        except LengthLimitError as error:
            where = locate(lines, error.index, is_list=is_list)
            return JSONResponse({"error": f"{where}: {error.reason}"}, status_code=400)
        ranked: list[list[str]] = []  # per text: its best, then its alternatives
        offset = 0
        for text_lines in lines:
            found = translations[offset : offset + len(text_lines)]
            ranked.append(
                [
                    "\n".join(nbest[min(rank, len(nbest) - 1)] for nbest in found)
                    for rank in range(asked.alternatives + 1)
                ]
            )
            offset += len(text_lines)
        response: dict[str, Any] = {
            "translatedText": [r[0] for r in ranked] if is_list else ranked[0][0]
        }
        if asked.alternatives:
            response["alternatives"] = [r[1:] for r in ranked] if is_list else ranked[0][1:]
        if detected is not None:
            response["detectedLanguage"] = [detected] * len(lines) if is_list else detected
        return JSONResponse(response)

    async def run_detect(texts: list[str]) -> list[tuple[str, float]]:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, service.detect, texts)
        except ValueError as error:  # langid not installed
            raise RequestError(501, str(error)) from None

    async def detect(request: Request) -> Response:
        """LibreTranslate's POST /detect: [{"confidence": 0-100, "language": code}] (q a string),
        one such list per text (q a list)."""
        try:
            asked = await parsed(request)
            found = await run_detect(["\n".join(text_lines) for text_lines in asked.lines])
        except RequestError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)
        results = [[{"confidence": confidence, "language": lang}] for lang, confidence in found]
        return JSONResponse(results if asked.is_list else results[0])

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
        return JSONResponse(service.listing())

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
            Route("/detect", detect, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
