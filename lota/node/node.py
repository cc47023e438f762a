"""A built node's lifecycle: start serving, drain, stop.

:func:`lota.node.build.build_node` makes a :class:`Node` with everything it serves with
already open; the node only listens, drains and stops::

    async with build_node(config) as node:
        url = await node.start()      # listening; /_lota/readyz says ready
        ...
        await node.drain()            # not ready; new S3 requests get 503 until in-flight ones end
        await node.stop()             # the listener closes
    # leaving build_node: fills drained, tasks cancelled, cache, catalog and session closed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from lota import zerocopy
from lota.aiohttp_internals import bound_address
from lota.config import Config
from lota.connections import ConnectionLimits
from lota.errors import StartupError
from lota.metrics import Metrics
from lota.node.listener import (
    MAX_REQUEST_LINE,
    Answers,
    S3Server,
    ssl_context,
)
from lota.node.requests import next_request_id
from lota.workers.spec import WorkerSpec

log = logging.getLogger("lota.node")

# Once the drain is over, seconds left for responses aiohttp is still writing.
FLUSH_GRACE = 1.0

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Drain:
    """What the lifecycle and the front end share: whether the node is ready, whether it
    is draining (and until when), and how many requests are in flight."""

    __slots__ = ("_quiet", "_timeout", "draining", "inflight", "ready", "until")

    def __init__(self, timeout: float, metrics: Metrics) -> None:
        self._timeout = timeout
        self.ready = False
        self.draining = False
        self.until = math.inf  # when the drain time is up (once draining)
        self.inflight = 0  # requests being answered; the gauge reads it when scraped
        self._quiet = asyncio.Event()  # set when the drain finds no request in flight
        metrics.inflight.set_function(lambda: self.inflight)

    def stop_serving(self) -> None:
        """Not ready any more (health probes say so); the drain time starts now. Until it
        ends, new S3 requests are answered 503 and their connections closed: serving them
        could keep the drain from ever ending, and the client's retry finds a ready node
        (or this node's successor, which cannot start before this process exits)."""
        self.ready = False
        self.draining = True
        self.until = time.monotonic() + self._timeout

    def deadline(self) -> float:
        """When work still running must end: the drain's end, or a drain time from now."""
        return self.until if self.draining else time.monotonic() + self._timeout

    def finished(self) -> None:
        """A request was answered (the front end calls this as each one ends)."""
        self.inflight -= 1
        if not self.inflight and self.draining:
            self._quiet.set()

    async def drained(self) -> None:
        """Until no request is in flight, or the drain time is up."""
        remaining = self.until - time.monotonic()
        if self.inflight and remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), remaining)


class Node:
    """One LOTA node, built: serves `handler` on ``config.listen`` between start and stop."""

    def __init__(
        self,
        config: Config,
        handler: Handler,
        drain: Drain,
        limits: ConnectionLimits,
        metrics: Metrics,
        worker: WorkerSpec | None = None,
        answers: Answers | None = None,
    ) -> None:
        """`answers`: requests answered as they are parsed (see lota.node.listener)."""
        self.config = config
        self.metrics = metrics
        self._drain = drain
        self._worker = worker
        self.answers = answers or Answers()
        server = S3Server(
            handler,
            answers=self.answers,
            limits=limits,
            metrics=metrics,
            request_id=next_request_id,
            access_log=None,
            max_line_size=MAX_REQUEST_LINE,
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=FLUSH_GRACE, handle_signals=False)

    @property
    def inflight(self) -> int:
        return self._drain.inflight

    async def start(self) -> str:
        """Listen; returns the URL bound (the port chosen, when ``listen`` asked for 0)."""
        await self._runner.setup()
        host, port = self.config.listen_address
        ssl = ssl_context(self.config)
        worker = self._worker
        site: web.TCPSite | web.SockSite
        if worker is None:
            site = web.TCPSite(self._runner, host, port, ssl_context=ssl, backlog=1024)
        else:
            # The supervisor's socket for this worker; and one for its siblings' calls.
            listening = socket.socket(fileno=worker.listen_fd)
            site = web.SockSite(self._runner, listening, ssl_context=ssl)
            await web.UnixSite(self._runner, worker.http_socket(worker.index)).start()
        try:
            await site.start()
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise StartupError(
                f"cannot listen on {self.config.listen}: {reason} "
                "(is another process on that port? choose one with --listen or LOTA_LISTEN)"
            ) from exc
        url = _bound_url(site, self.config)
        log.info("LOTA %s listening on %s (region %s)", _version(), url, self.config.region)
        if self.config.cache.dirs and not zerocopy.AVAILABLE:
            log.warning(
                "cachestat(2) is not available (Linux before 6.5, or a seccomp filter): small "
                "hits are copied to the socket, not sent from the page cache"
            )
        return url

    async def drain(self) -> None:
        """Stop serving, then wait until no request is in flight or the drain time is up.
        The listener stays open meanwhile: probes see "not ready", not a refusal."""
        timeout = self.config.drain_timeout
        log.info("shutting down: draining in-flight requests (up to %.0fs)", timeout)
        self._drain.stop_serving()
        await self._drain.drained()
        if self._drain.inflight:
            log.warning("drain time is up: cutting %d requests in flight", self._drain.inflight)

    async def stop(self) -> None:
        """Close the listener and every connection (responses still being written get
        :data:`FLUSH_GRACE` seconds)."""
        await self._runner.cleanup()
        log.info("stopped")


def _bound_url(site: web.TCPSite | web.SockSite, config: Config) -> str:
    host, port = bound_address(site)
    scheme = "https" if config.tls_cert else "http"
    return f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"


def _version() -> str:
    from lota import __version__

    return __version__
