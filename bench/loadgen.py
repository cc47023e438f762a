"""A lean HTTP/1.1 GET load generator: keep-alive connections, a fixed number of requests
in flight, latency per request from sending it to having read the whole body.

Why not aiohttp's client: on a 2-core machine the load generator shares the CPU with the
server it measures, and aiohttp's client spends ~160 µs of CPU per small request, which
is taken from LOTA and shows up in LOTA's latency. This one spends a fraction of that: it
sends pre-built requests and frames responses by Content-Length only (what S3 GETs use).
Anything else (chunked bodies, a short body, a connection cut mid-response) is counted
as an error, never as a sample.

    client = LoadClient(concurrency=16)
    result = await client.run([get_request(url) for url in urls], expect_size=65536)
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

HEADER_LIMIT = 64 * 1024


def run_delay() -> float | None:
    """Seconds the calling thread has spent ready to run, waiting for a core, since it
    started (the second figure of ``/proc/thread-self/schedstat``); None without it."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Result:
    samples: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    # Seconds the load generator was ready to run but waited for a core (the kernel's
    # run delay of its thread, /proc/thread-self/schedstat); None where it is not told.
    client_wait_s: float | None = None
    sources: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    # Each sample again, under the x-lota-cache header of its response.
    by_source: dict[str, list[float]] = field(default_factory=dict)
    body_bytes: int = 0


@dataclass(frozen=True)
class Request:
    host: str
    port: int
    data: bytes


def get_request(url: str, headers: dict[str, str] | None = None) -> Request:
    """A GET of `url` with `headers`; path and query are sent exactly as given (a presigned
    URL stays valid), and so is a ``host`` among `headers` (a signed one stays signed)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"plain http URLs only: {url}")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    fields = {"host": parts.netloc, "user-agent": "lota-bench"}
    fields.update((name.lower(), value) for name, value in (headers or {}).items())
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return Request(
        parts.hostname, parts.port or 80, f"GET {target} HTTP/1.1\r\n{lines}\r\n".encode()
    )


class _Reply(asyncio.Protocol):
    """One connection's responses, framed by Content-Length as the bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, int, str]] | None = None
        self._head = bytearray()
        self._status = 0
        self._length = -1  # body bytes expected; -1 while the header section is read
        self._count = 0
        self._source = "-"
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def expect(self) -> asyncio.Future[tuple[int, int, str]]:
        self.waiter = asyncio.get_running_loop().create_future()
        self._head.clear()
        self._length, self._count = -1, 0
        return self.waiter

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._fail(ValueError("bytes from the server with no request outstanding"))
            return
        if self._length < 0:
            # The head is looked for where it is, and only its bytes are kept: a server
            # that sends a head and its body in one segment costs no more to read than
            # one that sends them apart.
            if self._head:
                self._head += data
                head: bytes | bytearray = self._head
            else:
                head = data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if not self._head:
                    self._head += data
                if len(self._head) > HEADER_LIMIT:
                    self._fail(ValueError("response header section too large"))
                return
            try:
                self._parse(bytes(head[:end]).decode("latin-1"))
            except ValueError as exc:
                self._fail(exc)
                return
            self._count = len(head) - end - 4
        else:
            self._count += len(data)
        if self._count > self._length:
            self._fail(ValueError(f"{self._count - self._length} bytes past Content-Length"))
        elif self._count == self._length:
            self.waiter.set_result((self._status, self._count, self._source))

    def _parse(self, head: str) -> None:
        lines = head.split("\r\n")
        version, status, _ = lines[0].split(" ", 2)
        self._status = int(status)
        self._source, self.close_after, length = "-", version == "HTTP/1.0", -1
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "x-lota-cache":
                self._source = value.strip()
            elif name == "connection":
                self.close_after = value.strip().lower() != "keep-alive"
            elif name == "transfer-encoding":
                raise ValueError(f"unsupported transfer-encoding {value.strip()}")
        if length < 0:
            raise ValueError("response without Content-Length")
        self._length = length

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._length >= 0:
            detail = f"body cut after {self._count} of {self._length} bytes"
        else:
            detail = "connection closed before the response headers"
        self._fail(ConnectionResetError(detail))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


class _Connection:
    """One keep-alive connection; reopened when the server closes it."""

    def __init__(self) -> None:
        self.reply: _Reply | None = None
        self.peer: tuple[str, int] | None = None

    async def get(self, request: Request) -> tuple[int, int, str]:
        """Send `request`; (status, body bytes, x-lota-cache) once the body is read."""
        if (
            self.reply is None
            or self.reply.transport is None
            or self.peer != (request.host, request.port)
        ):
            self.close()
            loop = asyncio.get_running_loop()
            _, self.reply = await loop.create_connection(_Reply, request.host, request.port)
            self.peer = (request.host, request.port)
        reply = self.reply
        if reply.transport is None:
            raise ConnectionResetError("the server closed the connection at once")
        done = reply.expect()
        reply.transport.write(request.data)
        result = await done
        if reply.close_after:
            self.close()
        return result

    def close(self) -> None:
        if self.reply is not None and self.reply.transport is not None:
            self.reply.transport.close()
        self.reply = None


class LoadClient:
    """`concurrency` workers, each with its own keep-alive connection, kept across runs."""

    def __init__(self, concurrency: int) -> None:
        self.connections = [_Connection() for _ in range(concurrency)]

    async def run(self, requests: list[Request], expect_size: int | None = None) -> Result:
        """Send every request, one per worker at a time."""
        result = Result()
        todo = iter(requests)

        async def worker(conn: _Connection) -> None:
            for request in todo:
                started = time.perf_counter()
                try:
                    status, count, source = await conn.get(request)
                except (OSError, ValueError) as exc:
                    conn.close()
                    result.errors[type(exc).__name__] += 1
                    continue
                if status != 200 or (expect_size is not None and count != expect_size):
                    result.errors[f"status {status}, {count} bytes"] += 1
                    continue
                took = time.perf_counter() - started
                result.samples.append(took)
                result.sources[source] += 1
                result.by_source.setdefault(source, []).append(took)
                result.body_bytes += count

        # The collector would pause the load generator, not the server: keep it out.
        gc.collect()
        gc.disable()
        # The run delay read within the wall time: a wait at either edge is in both.
        started, cpu, waited = time.perf_counter(), time.process_time(), run_delay()
        try:
            await asyncio.gather(*(worker(conn) for conn in self.connections))
        finally:
            now = run_delay()
            result.client_cpu_s = time.process_time() - cpu
            result.wall_s = time.perf_counter() - started
            if waited is not None and now is not None:
                result.client_wait_s = now - waited
            gc.enable()
        return result

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
