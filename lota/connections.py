"""Client connections: how long one may dawdle over a request head or sit idle.

Left to aiohttp's defaults, a connection that sends nothing, or trickles a header byte at a
time, stays open for an hour; a thousand of them use up the process's descriptors and every
real client is refused. Here:

* ``header_timeout``: a request head must be complete within this long after the connection
  opened or, on a kept-alive connection, after the first byte of its next request (nginx's
  ``client_header_timeout``). A client that sent part of a head is told 408 RequestTimeout;
  one that sent nothing is just closed.
* ``keepalive_timeout``: a connection idle between requests is closed after this long.

:class:`HeadClock` holds the timing rules (no I/O); :class:`GuardedRequestHandler` applies
them to one connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from lota.config import Config
from lota.metrics import Metrics
from lota.s3.errors import S3Error

log = logging.getLogger("lota.connections")

Reason = Literal["header_timeout", "idle_timeout"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The connection settings of :class:`lota.config.Config`, as one value."""

    header_timeout: float
    keepalive_timeout: float


def connection_limits(config: Config) -> ConnectionLimits:
    return ConnectionLimits(config.header_timeout, config.keepalive_timeout)


class HeadClock:
    """When a connection waiting for a request head is due to be closed, and why.

    Times are the caller's clock (the event loop's); nothing here does I/O.
    """

    __slots__ = ("deadline", "header_timeout", "keepalive_timeout", "partial", "reason")

    def __init__(self, header_timeout: float, keepalive_timeout: float) -> None:
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.deadline: float | None = None  # None: a request is being handled
        self.reason: Reason = "header_timeout"
        self.partial = False  # bytes of a request head have arrived

    @property
    def waiting(self) -> bool:
        """Whether the connection is waiting for a request head (so may give way)."""
        return self.deadline is not None

    def opened(self, now: float) -> None:
        self.deadline, self.reason, self.partial = (
            now + self.header_timeout,
            "header_timeout",
            False,
        )

    def response_done(self, now: float) -> None:
        self.deadline, self.reason, self.partial = (
            now + self.keepalive_timeout,
            "idle_timeout",
            False,
        )

    def head_bytes(self, now: float) -> bool:
        """Bytes of a head arrived; True when that moved the deadline. The first byte after
        an idle spell starts the header clock; later ones change nothing (a trickle gains
        no time)."""
        if self.deadline is None or self.partial:
            return False
        self.partial = True
        if self.reason == "idle_timeout":
            self.deadline, self.reason = now + self.header_timeout, "header_timeout"
            return True
        return False

    def head_complete(self) -> None:
        self.deadline, self.partial = None, False

    def expired(self, now: float) -> Reason | None:
        if self.deadline is None or now < self.deadline:
            return None
        return self.reason


class GuardedRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with the header and keep-alive timeouts of
    :class:`HeadClock`."""

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        limits = manager.limits
        self._clock = HeadClock(limits.header_timeout, limits.keepalive_timeout)
        self._timer: Any = None  # asyncio.TimerHandle for the clock's deadline
        self._last_body: Any = None  # the last request's body, while it may still arrive

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._clock.opened(self._loop.time())
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        body = self._last_body  # bytes still due for it are not a head's
        head = data and (body is None or body.is_eof())
        if head and self._clock.head_bytes(self._loop.time()):
            self._arm()
        super().data_received(data)
        # aiohttp queues each request whose head it has parsed: that head is complete.
        if self._messages and self._clock.waiting:
            self._clock.head_complete()
            self._cancel_timer()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if not self._messages and self.transport is not None:
            self._last_body = request.content
            self._clock.response_done(self._loop.time())
            self._arm()
        return result

    def _arm(self) -> None:
        self._cancel_timer()
        if self._clock.deadline is not None:
            self._timer = self._loop.call_at(self._clock.deadline, self._on_deadline)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_deadline(self) -> None:
        self._timer = None
        reason = self._clock.expired(self._loop.time())
        if reason is None or self.transport is None:
            return
        if self._clock.partial:
            # Part of a head came: say why the connection closes, as S3 XML.
            self.transport.write(self._guard.timeout_reply())
        log.debug("closing connection from %s: %s", self.peername, reason)
        self._guard.closed(reason)
        self.force_close()


class GuardedServer(web.Server):
    """aiohttp's low-level server with :class:`GuardedRequestHandler` connections."""

    def __init__(
        self,
        handler: Any,
        *,
        limits: ConnectionLimits,
        metrics: Metrics,
        request_id: Callable[[], str],
        **kwargs: Any,
    ) -> None:
        # aiohttp's own keep-alive timer stays as a backstop behind the handler's clock.
        backstop = limits.keepalive_timeout + limits.header_timeout
        super().__init__(handler, keepalive_timeout=backstop, **kwargs)
        self.limits = limits
        self._metrics = metrics
        self._request_id = request_id

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)

    def closed(self, reason: str) -> None:
        self._metrics.client_connections_closed.labels(reason).inc()

    def timeout_reply(self) -> bytes:
        """A whole HTTP response: 408 RequestTimeout as S3 XML, closing the connection."""
        err = S3Error(
            "RequestTimeout",
            "Your socket connection to the server was not read from or written to within "
            "the timeout period.",
            status=408,
        )
        request_id = self._request_id()
        body = err.to_xml(request_id)
        head = (
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nx-amz-request-id: {request_id}\r\n"
            "Connection: close\r\n\r\n"
        )
        return head.encode() + body
