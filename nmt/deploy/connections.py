"""nmt-serve's connections: each bounded in time, their number bounded, and closed so that a client
reads its answer. uvicorn's h11 protocol, with what uvicorn has no setting for.

uvicorn bounds the keep-alive wait (``timeout_keep_alive``), the requests in flight
(``limit_concurrency``), the shutdown (``timeout_graceful_shutdown``) and the size of a request
head (``h11_max_incomplete_event_size``); ``nmt-serve`` sets them all. It has no deadline for a
request head, no bound on open connections, and it closes a connection whose request it has not
read to the end: the kernel then answers the client's next bytes with a reset, which destroys the
response on its way (a client sending a body over --max-body-bytes read "connection reset by
peer", never its 413). So, here:

- a connection must send a whole request head within ``header_timeout`` of its opening or of its
  last response, else it is closed: a client that sends nothing, or a byte now and then, holds a
  connection that long at most;
- beyond ``max_connections`` open connections, a new one is answered 503 and closed: lingering
  (below) while fewer than ``max_connections`` such are, at once beyond, so that at most twice
  ``max_connections`` are ever open (uvicorn's ``limit_concurrency`` counts the served ones only);
- every close lingers, as nginx's ``lingering_close`` does: the response is flushed, our sending
  side shut down, and what the client still sends is read and thrown away until it closes its end,
  falls silent for ``LINGER_IDLE_S``, ``LINGER_TOTAL_S`` have passed, or ``LINGER_MAX_BYTES`` came.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

LINGER_IDLE_S = 2.0  # nginx's lingering_timeout is 5 s, its lingering_time 30 s
LINGER_TOTAL_S = 10.0
LINGER_MAX_BYTES = 64 << 20  # a 20 MB body over --max-body-bytes is read whole, then closed


class _LingeringTransport:
    """The transport uvicorn's protocol holds: ``close`` lingers, and nothing is written after it."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.linger()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self.is_closing():
            self._transport.write(data)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline, a bound on open connections and
    lingering closes (see the module docstring). ``configure`` sets the two limits."""

    header_timeout = 10.0
    max_connections = 256
    refused: set[GuardedH11Protocol] = set()  # answered 503, closing

    @classmethod
    def configure(cls, *, header_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
        """A subclass with these limits (and its own ``refused``): uvicorn's ``http`` takes a class."""
        return type(
            cls.__name__,
            (cls,),
            {
                "header_timeout": header_timeout,
                "max_connections": max_connections,
                "refused": set(),
            },
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw_transport = transport
        self.lingering = False
        self._head_deadline: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_bytes = 0
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self._refuse()
        else:
            self._arm_head_deadline()

    def _refuse(self) -> None:
        self.connections.discard(self)  # not one uvicorn serves
        self.refused.add(self)
        logger.warning(
            "%d connections open: one more refused (--max-connections)", len(self.connections)
        )
        message = (
            f"too many open connections (--max-connections {self.max_connections}); try again later"
        )
        body = json.dumps({"error": message}).encode()
        self._raw_transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        if len(self.refused) > self.max_connections:
            self._raw_transport.close()  # a flood: no lingering for it
        else:
            self.linger()

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)
            return
        self._linger_bytes += len(data)  # thrown away
        self._last_data = self.loop.time()
        if self._linger_bytes > LINGER_MAX_BYTES:
            self._raw_transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()  # for the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        self.refused.discard(self)
        for timer in (self._head_deadline, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.header_timeout, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_deadline = None
        # No request under way (none yet, or the last one answered): the next one's head is late.
        if self.cycle is None or self.cycle.response_complete:
            self.linger()

    def linger(self) -> None:
        """Close: flush, shut our side, then read and discard until the client is done (bounded)."""
        raw = self._raw_transport
        if self.lingering or raw.is_closing():
            return
        self.lingering = True
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        if not raw.can_write_eof():
            raw.close()
            return
        raw.write_eof()  # after what is buffered: the client reads the whole response, then EOF
        raw.resume_reading()
        self._last_data = started = self.loop.time()

        def check() -> None:
            now = self.loop.time()
            if now - self._last_data >= LINGER_IDLE_S or now - started >= LINGER_TOTAL_S:
                raw.close()
            else:
                self._linger_timer = self.loop.call_later(LINGER_IDLE_S / 4, check)

        self._linger_timer = self.loop.call_later(LINGER_IDLE_S / 4, check)
