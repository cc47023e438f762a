"""An HTTP proxy in front of the test origin that records what reaches the origin.

Tests use it to prove what the cache saves: "the origin saw one GET", "the origin sent
each byte once". It runs its own event loop in a thread and streams bodies both ways.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from lota.testing.processes import free_port


@dataclass
class Seen:
    method: str
    path: str
    query: str
    range: str
    status: int
    body_bytes: int
    cut: bool = False
    """The receiver closed the connection as the body's last piece or its end was written:
    the body was recorded whole, but some of it perhaps only reached a socket buffer."""


class RecordingProxy:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[Seen] = []
        self.down = False  # when set, refuse connections' requests with a reset
        self.pace = 0.0  # seconds to pause after each 256 KiB of a body (a slow origin)
        self.delay = 0.0  # seconds to hold each request before forwarding it (a far origin)
        self.stall = False  # when set, hold each request unanswered until the proxy stops
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="recording-proxy", daemon=True)

    def requests(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        with self._lock:
            return [
                s
                for s in self.seen
                if (method is None or s.method == method) and (path is None or s.path == path)
            ]

    def bytes_sent(self, path: str | None = None, *, whole: bool = False) -> int:
        """Body bytes of the GETs of `path` (all paths if None); only those whose body was
        all written if `whole`."""
        return sum(s.body_bytes for s in self.requests("GET", path) if not (whole and s.cut))

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()

    def start(self) -> RecordingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            server = web.Server(lambda request: self._forward(session, request))
            runner = web.ServerRunner(server, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            await site.start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    async def _forward(
        self, session: aiohttp.ClientSession, request: web.BaseRequest
    ) -> web.StreamResponse:
        if self.down:
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("origin is down")
        if self.stall:  # an origin that accepts requests and never answers them
            assert self._stop is not None
            await self._stop.wait()
            raise ConnectionResetError("origin stopped")
        if self.delay:
            await asyncio.sleep(self.delay)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "transfer-encoding")
        }
        body = request.content if request.body_exists else None
        url = URL(self.target + request.raw_path, encoded=True)  # keep "..", "//" as sent
        async with session.request(
            request.method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in ("transfer-encoding", "connection"):
                    response.headers.add(name, value)
            # The request is recorded before its last bytes go out: a caller that has the
            # whole answer always finds it in `seen` (recording after write_eof raced it).
            pieces = upstream.content.iter_chunked(256 * 1024)
            piece = b"" if request.method == "HEAD" else await anext(pieces, b"")
            sent = 0
            recorded = None
            if not piece:
                recorded = self._record(request, upstream.status, 0)
            await response.prepare(request)
            try:
                while piece:
                    following = await anext(pieces, b"")
                    sent += len(piece)
                    if not following:
                        recorded = self._record(request, upstream.status, sent)
                    await response.write(piece)
                    if self.pace:
                        await asyncio.sleep(self.pace)
                    piece = following
                await response.write_eof()
            except ConnectionError:  # the receiver went before the body was all written
                if recorded is not None:  # (one gone before its last piece is not recorded)
                    recorded.cut = True
                raise
        return response

    def _record(self, request: web.BaseRequest, status: int, sent: int) -> Seen:
        seen = Seen(
            request.method,
            request.path,
            request.query_string,
            request.headers.get("range", ""),
            status,
            sent,
        )
        with self._lock:
            self.seen.append(seen)
        return seen


@contextmanager
def recording_proxy(target: str) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(target).start()
    try:
        yield proxy
    finally:
        proxy.stop()
