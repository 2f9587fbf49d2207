"""nmt-serve's ASGI app: LibreTranslate's routes (``nmt.deploy.protocol``) over the request batcher
(``nmt.deploy.batcher``).

    POST /translate, POST /detect, GET /languages (protocol.py's shapes)
    GET  /health -> {"status": "ok", ...}      GET / (a web page)

Bad requests get a 4xx with ``{"error": "..."}`` before they join a batch, a sentence that cannot
be translated as asked (longer than the model reads, or --min-len over its length limit) included;
a decode that fails anyway fails only its own request (500). Connections are bounded in time and
number by ``nmt.deploy.connections``.

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
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from nmt.config import ServeConfig
from nmt.data.terminology import Glossary
from nmt.deploy.batcher import DynamicBatcher
from nmt.deploy.protocol import (
    RequestError,
    Service,
    TranslateRequest,
    detection_response,
    detection_texts,
    parse_request,
    translation_response,
    untranslatable,
)
from nmt.eval.hypothesis import LengthLimitError
from nmt.eval.translate import Translator


async def read_body(request: Request, *, limit: int, timeout: float) -> bytes:
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


def error_response(error: RequestError) -> Response:
    return JSONResponse(
        {"error": error.message},
        status_code=error.status,
        headers={"connection": "close"} if error.close else None,
    )


SHUTTING_DOWN = RequestError(
    503, "the server is shutting down (--shutdown-timeout); try again", close=True
)


class Routes:
    """The handlers of the app's routes, over one batcher that the app's lifespan starts and stops."""

    def __init__(
        self,
        translator: Translator,
        cfg: ServeConfig,
        service: Service,
        *,
        backend: str,
        glossaries: Mapping[str, Glossary] | None = None,
    ) -> None:
        self.translator = translator
        self.glossaries = dict(glossaries or {})  # nmt-serve --glossary NAME=FILE
        self.cfg = cfg
        self.service = service
        self.backend = backend
        self.page = web_page(source_lang=service.first_pair[0], target_lang=service.first_pair[1])
        self._batcher: DynamicBatcher | None = None

    @property
    def batcher(self) -> DynamicBatcher:
        assert self._batcher is not None, "a request outside the app's lifespan"
        return self._batcher

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._batcher = DynamicBatcher(
            self.translator,
            max_batch_tokens=self.cfg.max_batch_tokens,
            max_wait_ms=self.cfg.max_wait_ms,
        )
        self._batcher.start()
        try:
            yield
        finally:
            await self._batcher.stop()

    async def translate(self, request: Request) -> Response:
        try:
            return await self._translate(request)
        except asyncio.CancelledError:  # SIGTERM, and --shutdown-timeout is over: a last word
            return error_response(SHUTTING_DOWN)

    async def _translate(self, request: Request) -> Response:
        detected = None
        try:
            asked = await self._parse(request)
            source = None if asked.source == "auto" else asked.source
            if self.service.detects(asked):
                detected = (await self._detect([" ".join(asked.sentences)]))[0]
                source = detected[0]
            direction = self.service.direction(source, asked.target)
            terms = self._terms(asked)
        except RequestError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        try:
            translations = await self.batcher.translate(
                asked.sentences,
                direction=direction,
                nbest=asked.alternatives + 1,
                terms=terms,
                glossary_mode=asked.glossary_mode,
            )
        except LengthLimitError as error:
            return error_response(untranslatable(asked, error))
        return JSONResponse(
            translation_response(asked, translations, detected=detected, terms=terms)
        )

    def _terms(self, asked: TranslateRequest) -> list[list[tuple[str, str]]] | None:
        """Per sentence, the glossary terms found in it (None without a glossary); a 400 when
        this model cannot apply them as asked (e.g. constraints with a CTranslate2 export)."""
        if asked.glossary is None:
            return None
        try:
            self.translator.check_glossary_mode(asked.glossary_mode, option="glossary_mode")
        except ValueError as error:
            raise RequestError(400, str(error)) from None
        return [asked.glossary.matches(sentence) for sentence in asked.sentences]

    async def detect(self, request: Request) -> Response:
        """LibreTranslate's POST /detect."""
        try:
            asked = await self._parse(request)
            found = await self._detect(detection_texts(asked))
        except RequestError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)
        return JSONResponse(detection_response(asked, found))

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "backend": self.backend,
                "source": self.service.source_lang,
                "target": self.service.target_lang,
                "queued_sentences": self.batcher.queued_sentences,
                "batches": self.batcher.num_batches,
            }
        )

    async def languages(self, request: Request) -> Response:
        return JSONResponse(self.service.listing())

    async def index(self, request: Request) -> Response:
        return HTMLResponse(self.page)

    async def _parse(self, request: Request) -> TranslateRequest:
        body = await read_body(
            request, limit=self.cfg.max_body_bytes, timeout=self.cfg.body_timeout
        )
        return parse_request(
            body,
            max_sentences=self.cfg.max_request_sentences,
            content_type=request.headers.get("content-type", "application/json"),
            glossaries=self.glossaries,
        )

    async def _detect(self, texts: list[str]) -> list[tuple[str, float]]:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, self.service.detect, texts
            )
        except ValueError as error:  # langid not installed
            raise RequestError(501, str(error)) from None


async def http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return JSONResponse(
        {"error": error.detail}, status_code=error.status_code, headers=error.headers
    )


async def server_error(request: Request, error: Exception) -> Response:
    return JSONResponse(
        {"error": f"internal error: {type(error).__name__}: {error}"}, status_code=500
    )


def create_app(
    translator: Translator,
    cfg: ServeConfig,
    *,
    backend: str,
    zero_shot: bool = False,
    glossaries: Mapping[str, Glossary] | None = None,
) -> Starlette:
    """The Starlette app; its lifespan starts and stops the batcher (so it must run under an ASGI server).
    A translator of several directions serves each request's ``source``/``target`` one."""
    routes = Routes(
        translator,
        cfg,
        Service(translator.languages, zero_shot),
        backend=backend,
        glossaries=glossaries,
    )
    return Starlette(
        routes=[
            Route("/", routes.index, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/languages", routes.languages, methods=["GET"]),
            Route("/translate", routes.translate, methods=["POST"]),
            Route("/detect", routes.detect, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=routes.lifespan,
    )
