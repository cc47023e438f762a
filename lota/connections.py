"""Client connections: how long one may dawdle over a request head or sit idle, and how many
may be open at once.

Left to aiohttp's defaults, a connection that sends nothing, or trickles a header byte at a
time, stays open for an hour; a thousand of them use up the process's descriptors and every
real client is refused. Here:

* ``header_timeout``: a request head must be complete within this long after the connection
  opened or, on a kept-alive connection, after the first byte of its next request (nginx's
  ``client_header_timeout``). A client that sent part of a head is told 408 RequestTimeout;
  one that sent nothing is just closed.
* ``keepalive_timeout``: a connection idle between requests is closed after this long.
* ``max_connections``: a connection past the cap closes the one that has waited longest for
  a request head (idle, or dawdling), as nginx reuses its keep-alive connections when it
  runs out; only when every connection is busy with a request is the new one closed at once.
  Refusing to accept instead would queue a real client behind every idle socket.

The cap defaults to what the descriptor limit leaves after LOTA's own needs (origin, peer
and sibling sockets, open chunk files, the catalog), and at least 1,024 (a quarter of a
limit under 4,096: :func:`client_room`); open chunk files take the rest, up to 95%
(:func:`chunk_descriptors`). :func:`raise_descriptor_limit`
lifts the soft limit to the hard one at start.

:class:`HeadClock` holds the timing rules (no I/O); :class:`GuardedRequestHandler` applies
them to one connection; :class:`GuardedServer` counts connections and picks who gives way.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from lota.aiohttp_internals import (
    handler_kwargs,
    handler_loop,
    keep_alive_until,
    request_queue,
    server_loop,
)
from lota.cache.store import open_chunk_limit
from lota.cluster.peers import POOL_SIZE as PEER_POOL_SIZE
from lota.config import Config
from lota.metrics import Metrics
from lota.regions.origin import POOL_SIZE
from lota.s3.errors import S3Error

log = logging.getLogger("lota.connections")

# Descriptors LOTA holds besides client connections, origin, peer and sibling sockets and
# cached chunk files: listening sockets, the event loop, logs, the cache index, catalog
# connections, chunk files being written.
BASE_RESERVE = 128
# Sockets to and from each sibling worker: a session's pool each way (aiohttp's 100), and
# the descriptor sockets.
SIBLING_SOCKETS = 2 * 100 + 2
# Client connections keep at least this many descriptors, or this share of a limit too low
# for that: the rest, besides LOTA's own, is for chunk files (a hot set of 20,000 small
# objects under a 20,000 limit with two workers: a quarter kept for connections left each
# worker 7,000 descriptors of its chunks and 7,000 of its sibling's, and it reopened a file
# for three hits in ten; with 1,024 for connections, one in ten).
CLIENT_ROOM = 1024
MIN_SHARE = 0.25
_WARN_EVERY = 60.0  # seconds between warnings that the cap is reached

Reason = Literal["header_timeout", "idle_timeout"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The connection settings of :class:`lota.config.Config`, as one value."""

    header_timeout: float
    keepalive_timeout: float
    max_connections: int


def connection_limits(config: Config) -> ConnectionLimits:
    """Raise the descriptor limit, then settle the cap (logged, with a warning when the
    limit leaves too little for LOTA's own descriptors)."""
    soft, hard = raise_descriptor_limit()
    # Chunk descriptors: the worker's own, and as many of each sibling's.
    chunk_files = chunk_descriptors(config) * config.worker_count if config.cache.dirs else 0
    reserve = own_descriptors(config) + chunk_files
    cap = config.max_connections or connection_cap(soft, reserve)
    log.info("descriptor limit %d (hard %d): at most %d client connections", soft, hard, cap)
    if soft != resource.RLIM_INFINITY and soft < cap + reserve:
        log.warning(
            "descriptor limit %d is low: besides %d client connections, LOTA may need %d for "
            "origin, peer and sibling sockets, cache files and the catalog; raise the hard "
            "limit (ulimit -Hn, LimitNOFILE)",
            soft,
            cap,
            reserve,
        )
    return ConnectionLimits(config.header_timeout, config.keepalive_timeout, cap)


def own_descriptors(config: Config) -> int:
    """Descriptors LOTA may hold besides client connections and cached chunk files."""
    peers = PEER_POOL_SIZE if config.cluster.on else 0
    return BASE_RESERVE + POOL_SIZE + peers + (config.worker_count - 1) * SIBLING_SOCKETS


def chunk_descriptors(config: Config) -> int:
    """Chunk descriptors a worker keeps open per worker's chunks
    (:func:`lota.cache.store.open_chunk_limit`), in the room client connections leave (at
    least :func:`client_room`, or ``max_connections`` when set) besides LOTA's
    own (:func:`own_descriptors`). Call after :func:`raise_descriptor_limit`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return open_chunk_limit(config.worker_count)
    clients = config.max_connections or client_room(soft)
    return open_chunk_limit(config.worker_count, soft - clients - own_descriptors(config))


def raise_descriptor_limit() -> tuple[int, int]:
    """Lift RLIMIT_NOFILE's soft limit to the hard one where the system allows; returns the
    (soft, hard) limits in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit cannot be the soft one on Linux: try the kernel's usual cap.
    for target in (hard, 1 << 20):
        if soft == resource.RLIM_INFINITY or 0 <= target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def client_room(descriptor_limit: int) -> int:
    """The descriptors client connections keep at least: :data:`CLIENT_ROOM`, or a quarter
    of a limit too low for that."""
    return min(CLIENT_ROOM, int(descriptor_limit * MIN_SHARE))


def connection_cap(descriptor_limit: int, reserve: int) -> int:
    """Client connections allowed at once: the descriptor limit less `reserve`, but at least
    :func:`client_room` (with a very low limit, idle sockets must not take everything either)."""
    if descriptor_limit == resource.RLIM_INFINITY or descriptor_limit < 0:
        descriptor_limit = 1 << 20
    return max(1, client_room(descriptor_limit), descriptor_limit - reserve)


class HeadClock:
    """When a connection waiting for a request head is due to be closed, and why.

    Times are the caller's clock (the event loop's); nothing here does I/O.
    """

    __slots__ = ("deadline", "header_timeout", "keepalive_timeout", "partial", "reason", "since")

    def __init__(self, header_timeout: float, keepalive_timeout: float) -> None:
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.deadline: float | None = None  # None: a request is being handled
        self.reason: Reason = "header_timeout"
        self.partial = False  # bytes of a request head have arrived
        self.since = 0.0  # when the connection last began to wait for a head

    @property
    def waiting(self) -> bool:
        """Whether the connection is waiting for a request head (so may give way)."""
        return self.deadline is not None

    def opened(self, now: float) -> None:
        self.since, self.deadline, self.reason, self.partial = (
            now,
            now + self.header_timeout,
            "header_timeout",
            False,
        )

    def response_done(self, now: float) -> None:
        # Written out: this runs for every request answered.
        self.since, self.deadline, self.reason, self.partial = (
            now,
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
    :class:`HeadClock` and a place in :class:`GuardedServer`'s count."""

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        limits = manager.limits
        self._clock = HeadClock(limits.header_timeout, limits.keepalive_timeout)
        # An asyncio.TimerHandle due at `_timer_at`, no later than the clock's deadline: a
        # deadline that moves later keeps it (it fires, finds nothing due and is set again),
        # so a request answered at once costs no timer.
        self._timer: Any = None
        self._timer_at = 0.0
        self._last_body: Any = None  # the last request's body, while it may still arrive
        self._loop_time = handler_loop(self).time
        self._queued = request_queue(self)
        self._aiohttp_keepalive = self.keepalive_timeout  # aiohttp's: see head_answered

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._clock.opened(self._loop_time())
        if not self._guard.admit(self):
            self.force_close()
            return
        self._guard.waiting(self)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.forget(self)
        self._cancel_timer()
        self._last_body = None  # it refers back to this protocol
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        body = self._last_body  # bytes still due for it are not a head's
        head = data and (body is None or body.is_eof())
        started = head and self._clock.head_bytes(self._loop_time())
        super().data_received(data)
        # aiohttp queues each request whose head it has parsed: that head is complete.
        if self._queued and self._clock.waiting:
            self._clock.head_complete()  # the server sees it busy when it looks
        elif started:  # part of a head: the header clock runs
            self._arm()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if not self._queued and self.transport is not None:
            self._last_body = request.content
            self._wait_again(self._loop_time())
        return result

    def head_answered(self) -> None:
        """Requests were answered as they were parsed (see lota.node.listener): aiohttp's
        own keep-alive timer is put off (it counts from the responses it writes) and, with
        none left queued, the connection waits for its next head, as after any response.
        This runs for every small hit."""
        now = self._loop_time()
        keep_alive_until(self, now + self._aiohttp_keepalive)
        if not self._queued and self.transport is not None:
            self._wait_again(now)

    def _wait_again(self, now: float) -> None:
        """The connection's requests are answered: it waits for its next head from `now`.
        The server hears of it only if it had stopped waiting (it took a request); one
        answered as its bytes came never did. Either way the server puts its list right
        when it looks (:meth:`GuardedServer._longest_waiting`)."""
        clock = self._clock
        listed = clock.deadline is not None  # clock.waiting, written out
        clock.response_done(now)
        if not listed:
            self._guard.waiting(self)
        if self._timer is None or self._timer_at > now + clock.keepalive_timeout:
            self._arm()

    def waiting_since(self) -> float | None:
        """When the connection last began to wait for a request head; None while it is
        handling a request."""
        clock = self._clock
        return clock.since if clock.deadline is not None else None

    def give_way(self) -> None:
        """Close to make room for a new connection (this one waits for a head)."""
        self._guard.closed("evicted")
        self.force_close()

    def _arm(self) -> None:
        deadline = self._clock.deadline
        if deadline is None:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return  # due first: it looks again then
            self._timer.cancel()
        self._timer = handler_loop(self).call_at(deadline, self._on_deadline)
        self._timer_at = deadline

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_deadline(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        reason = self._clock.expired(self._loop_time())
        if reason is None:  # the deadline moved on (or a request is in hand)
            self._arm()
            return
        if self._clock.partial:
            # Part of a head came: say why the connection closes, as S3 XML.
            self.transport.write(self._guard.timeout_reply())
        log.debug("closing connection from %s: %s", self.peername, reason)
        self._guard.closed(reason)
        self.force_close()


class GuardedServer(web.Server):
    """aiohttp's low-level server, keeping at most ``limits.max_connections`` connections."""

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
        self._open: set[GuardedRequestHandler] = set()
        # Connections listed as waiting for a request head, each with when it began to as
        # last listed (:attr:`HeadClock.since`), and the same as a heap, earliest first,
        # one entry each; a forgotten connection's entry stays until it comes up (or the
        # heap is rebuilt, at twice the connections listed): see :meth:`_longest_waiting`.
        self._waiting: dict[GuardedRequestHandler, float] = {}
        self._heap: list[tuple[float, int, GuardedRequestHandler]] = []
        self._listed = itertools.count()  # breaks ties between entries of the heap
        self._warned = float("-inf")
        metrics.client_connections.set_function(lambda: len(self._open))
        metrics.client_connection_limit.set(limits.max_connections)

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=server_loop(self), **handler_kwargs(self))

    def admit(self, handler: GuardedRequestHandler) -> bool:
        """Count a new connection in; False when it must close at once."""
        if len(self._open) >= self.limits.max_connections:
            oldest = self._longest_waiting()
            self._warn_full(oldest is not None)
            if oldest is None:
                self.closed("refused")
                return False
            oldest.give_way()
            self.forget(oldest)
        self._open.add(handler)
        return True

    def waiting(self, handler: GuardedRequestHandler) -> None:
        """`handler` began to wait for a request head: listed, unless it still is (a
        connection that took a request is not unlisted then; see
        :meth:`_longest_waiting`)."""
        if handler not in self._waiting:
            since = handler.waiting_since()
            assert since is not None
            self._waiting[handler] = since
            heapq.heappush(self._heap, (since, next(self._listed), handler))

    def _longest_waiting(self) -> GuardedRequestHandler | None:
        """The connection that has waited longest for a request head. The list is put right
        here, not as requests come and go: a listed connection handling a request is
        unlisted when it comes up, and one that waits since later than it was listed (it
        took a request since, or was answered from its bytes, see
        :meth:`GuardedRequestHandler._wait_again`) is listed again, in its place. A
        listed time is never later than the connection's own, so the first whose time
        holds is the one."""
        heap, listed = self._heap, self._waiting
        while heap:
            since, _, handler = heap[0]
            if listed.get(handler) != since:  # forgotten
                heapq.heappop(heap)
                continue
            now = handler.waiting_since()
            if now is None:  # handling a request
                heapq.heappop(heap)
                del listed[handler]
            elif now <= since:
                return handler
            else:
                listed[handler] = now
                heapq.heapreplace(heap, (now, next(self._listed), handler))
        return None

    def forget(self, handler: GuardedRequestHandler) -> None:
        self._open.discard(handler)
        if (
            self._waiting.pop(handler, None) is not None
            and len(self._heap) > 2 * len(self._waiting) + 64
        ):  # the forgotten's entries: at most as many again as those listed, and 64
            self._heap = [(since, next(self._listed), h) for h, since in self._waiting.items()]
            heapq.heapify(self._heap)

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

    def _warn_full(self, evicting: bool) -> None:
        now = time.monotonic()
        if now - self._warned >= _WARN_EVERY:
            self._warned = now
            log.warning(
                "%d client connections open (max_connections): %s",
                len(self._open),
                "closing the ones idle longest"
                if evicting
                else "refusing new ones, every connection is busy",
            )
