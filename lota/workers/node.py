"""What one worker keeps of its siblings: an HTTP session to each one's Unix socket (peer
calls, metrics), and the descriptor socket it answers them on.

A worker says it is ready only once every sibling has answered it (or after
:data:`MEET_TIMEOUT`): otherwise the first reads after the node starts would find a
sibling still starting, and read its chunks from the origin instead of having it fill them
once for the node."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from lota.cache.service import ChunkService
from lota.tasks import TaskGroup
from lota.workers.fds import FdServer, Hearer, Opened
from lota.workers.spec import WorkerSpec

log = logging.getLogger("lota.workers")

_SIBLING = re.compile(r"worker-[0-9]+")
# Seconds to wait for a sibling's metrics before rendering without them.
METRICS_TIMEOUT = 2.0
# Seconds a starting worker waits for its siblings to answer before it is ready without
# them (a sibling that does not start stops the node sooner); and how often it asks.
MEET_TIMEOUT = 30.0
MEET_INTERVAL = 0.05


def worker_name(index: int) -> str:
    """How a worker is named among its siblings (peer calls' sender, membership)."""
    return f"worker-{index}"


def is_sibling(sender: str) -> bool:
    """Whether a peer call came from a worker of this node (else from another node, named
    HOST:PORT: a host called ``worker-12.gpu.internal`` is another node)."""
    return _SIBLING.fullmatch(sender) is not None


class Siblings:
    """This worker's sessions to the other workers of its node."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.me = worker_name(spec.index)
        self.sessions = {
            worker_name(k): aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=spec.http_socket(k)),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=2, sock_read=60),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            for k in range(spec.count)
            if k != spec.index
        }
        self.met = False
        """Whether every sibling has answered once (or :data:`MEET_TIMEOUT` passed)."""
        self._unmet = set(self.sessions)

    async def meet(self) -> None:
        """Ask each sibling's ``/_lota/healthz`` until it answers, up to
        :data:`MEET_TIMEOUT` in all; then :attr:`met`."""

        async def one(k: str, session: aiohttp.ClientSession) -> None:
            while True:
                try:
                    async with session.get("http://localhost/_lota/healthz") as response:
                        if response.status == 200:
                            self._unmet.discard(k)
                            return
                except (aiohttp.ClientError, OSError):
                    pass  # not listening yet
                await asyncio.sleep(MEET_INTERVAL)

        try:
            async with asyncio.timeout(MEET_TIMEOUT):
                await asyncio.gather(*(one(k, s) for k, s in self.sessions.items()))
        except TimeoutError:
            log.warning(
                "not every sibling worker answered within %.0f s: serving without them",
                MEET_TIMEOUT,
            )
        self.met = True

    def waiting(self) -> str:
        """What this worker waits for before it serves ("" once every sibling answered)."""
        if self.met:
            return ""
        unmet = ", ".join(sorted(self._unmet))
        return f"waiting for sibling workers to answer: {unmet}"

    @property
    def indexes(self) -> list[int]:
        return [k for k in range(self.spec.count) if k != self.spec.index]

    async def metrics(self) -> list[bytes]:
        """Each sibling's own metrics (``/_lota/metrics?worker=own``); one that does not
        answer in time is left out (it is restarting)."""

        async def one(session: aiohttp.ClientSession) -> bytes | None:
            try:
                async with session.get(
                    "http://localhost/_lota/metrics?worker=own",
                    timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT),
                ) as response:
                    return await response.read() if response.status == 200 else None
            except (aiohttp.ClientError, OSError, TimeoutError):
                return None

        found = await asyncio.gather(*(one(s) for s in self.sessions.values()))
        return [text for text in found if text is not None]

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()


@asynccontextmanager
async def siblings(spec: WorkerSpec) -> AsyncIterator[Siblings]:
    """The sessions to the siblings, meeting them in the background; closed on exit."""
    found = Siblings(spec)
    meeting = TaskGroup("siblings")
    meeting.start(found.meet(), "meet")
    try:
        yield found
    finally:
        await meeting.close()
        await found.close()


@asynccontextmanager
async def descriptor_server(
    spec: WorkerSpec, cache: ChunkService, hear: Hearer
) -> AsyncIterator[FdServer]:
    """Answer the siblings' requests for the chunks this worker holds (zero-copy sends),
    and hear their news."""

    async def opener(bucket: str, key: str, etag: str, index: int) -> Opened | None:
        obj = cache.lookup(bucket, key)
        if obj is None or obj.meta.etag != etag or not cache.has_chunk(obj, index):
            return None
        reader = await cache.open_chunk(obj, index, read=False)  # the asker tells its reads
        if reader is None:
            return None
        return reader.fd, reader.length, cache.chunk_path(obj, index), reader.close

    server = FdServer(spec.fd_socket(spec.index), opener, asyncio.get_running_loop(), hear)
    server.start()
    try:
        yield server
    finally:
        await server.close()
