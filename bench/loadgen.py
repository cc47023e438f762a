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
from urllib.parse import urlsplit

HEADER_LIMIT = 64 * 1024


@dataclass
class Result:
    samples: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    sources: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


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


class _Connection:
    """One keep-alive connection; reopened when the server closes it."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.peer: tuple[str, int] | None = None

    async def get(self, request: Request) -> tuple[int, int, str]:
        """Send `request`; (status, body bytes, x-lota-cache) once the body is read."""
        if self.writer is None or self.peer != (request.host, request.port):
            self.close()
            self.reader, self.writer = await asyncio.open_connection(request.host, request.port)
            self.peer = (request.host, request.port)
        assert self.reader is not None
        self.writer.write(request.data)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ValueError("response header section too large") from None
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, source, close = -1, "-", False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "x-lota-cache":
                source = value.strip()
            elif name == "connection":
                close = value.strip().lower() == "close"
            elif name == "transfer-encoding":
                raise ValueError(f"unsupported transfer-encoding {value.strip()}")
        if length < 0:
            raise ValueError("response without Content-Length")
        count = 0
        while count < length:
            piece = await self.reader.read(min(length - count, 1024 * 1024))
            if not piece:
                raise ConnectionResetError(f"body cut after {count} of {length} bytes")
            count += len(piece)
        if close:
            self.close()
        return status, count, source

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


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
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    conn.close()
                    result.errors[type(exc).__name__] += 1
                    continue
                if status != 200 or (expect_size is not None and count != expect_size):
                    result.errors[f"status {status}, {count} bytes"] += 1
                    continue
                result.samples.append(time.perf_counter() - started)
                result.sources[source] += 1

        # The collector would pause the load generator, not the server: keep it out.
        gc.collect()
        gc.disable()
        cpu, started = time.process_time(), time.perf_counter()
        try:
            await asyncio.gather(*(worker(conn) for conn in self.connections))
        finally:
            result.wall_s = time.perf_counter() - started
            result.client_cpu_s = time.process_time() - cpu
            gc.enable()
        return result

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
