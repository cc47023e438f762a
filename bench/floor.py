"""The least a Python server on uvloop spends on a 64 KiB hit: the floor LOTA's hits are
measured against.

`--workers` forked processes share one port (``SO_REUSEPORT``). Each answers a request
line and headers it has seen before from a dict keyed by their bytes (the response head,
the file), with the system calls a LOTA hit makes: ``cachestat(2)``, the head sent with
``MSG_MORE``, the body with ``sendfile(2)`` (:mod:`lota.zerocopy`), what the socket does
not take written through the transport; a file is kept open while fewer than `--keep`
are. Nothing is verified, counted or logged, no cache is kept
in order. The objects, the presigned URLs and the load generator are
:mod:`bench.nginx`'s, so the figures stand beside that bench's: req/s, p50/p99 ms, and
the server's CPU µs per request (what LOTA spends above it is LOTA's own work).

    python -m bench.floor
    python -m bench.floor --sets 20000
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import cast

import uvloop

from bench.common import presigned_urls, stop_on_sigterm, table
from bench.nginx import BUCKET, cell, write_objects
from lota import zerocopy

# A request's bytes -> its file, the response's head, the body's size.
Seen = dict[bytes, tuple[str, bytes, int]]


class _Hits(asyncio.Protocol):
    """One connection: each request is one read, answered from `seen` (see the module)."""

    def __init__(self, root: Path, seen: Seen, fds: dict[str, int], keep: int) -> None:
        self._root = root
        self._seen = seen
        self._fds = fds
        self._keep = keep
        self._transport: asyncio.Transport | None = None
        self._socket: zerocopy.Borrowed | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._socket = zerocopy.borrow(transport.get_extra_info("socket").fileno())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._socket is not None:
            self._socket.detach()
            self._socket = None

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        known = self._seen.get(data)
        if known is None:
            path = str(self._root) + data.split(b" ", 2)[1].split(b"?")[0].decode()
            size = os.path.getsize(path)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
            known = self._seen[data] = (path, head, size)
        path, head, size = known
        fd = self._fds.get(path, -1)
        opened = fd < 0
        if opened:
            fd = os.open(path, os.O_RDONLY)
        sent = 0
        if self._socket is not None and zerocopy.resident(fd, 0, size):
            sent = zerocopy.send(self._socket, head, zerocopy.FileSpan(fd, 0, size))
        if sent < len(head):  # what the socket did not take goes through the transport
            self._transport.write(head[sent:])
            sent = len(head)
        if sent - len(head) < size:
            self._transport.write(os.pread(fd, size, sent - len(head)))
        if opened and len(self._fds) < self._keep:
            self._fds[path] = fd
        elif opened:
            os.close(fd)


def _serve(sock: socket.socket, root: Path, keep: int) -> None:
    seen: Seen = {}
    fds: dict[str, int] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: _Hits(root, seen, fds, keep), sock=sock)
        await asyncio.Event().wait()

    uvloop.run(main())


async def run(args: argparse.Namespace, work: Path) -> list[list[object]]:
    root = work / "origin"
    keys = write_objects(root, max(args.sets))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    pids: list[int] = []
    rows: list[list[object]] = []
    try:
        for _ in range(args.workers):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child serves until killed
                try:
                    _serve(sock, root, args.keep)
                finally:
                    os._exit(0)
            pids.append(pid)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            for size in args.sets:
                urls = presigned_urls(endpoint, BUCKET, keys[:size])
                await cell(pool, urls, len(urls), 64, pids)  # every request seen once
                for concurrency in (16, 64):
                    got = await cell(pool, urls, args.requests, concurrency, pids)
                    rows.append(
                        [
                            f"{size:,}",
                            concurrency,
                            f"{got['req_per_s']:,.0f}",
                            f"{got['p50']:.2f} / {got['p99']:.2f}",
                            f"{got['cpu_us_per_req']:.0f}",
                            f"{got['client_cpu_us_per_req']:.0f}",
                            got["errors"] or "",
                        ]
                    )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        sock.close()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000, help="per cell")
    parser.add_argument("--sets", default="1000", help="hot set sizes")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--keep", type=int, default=4096, help="files kept open per worker")
    args = parser.parse_args()
    args.sets = [int(s) for s in args.sets.split(",")]
    if not zerocopy.AVAILABLE:
        raise SystemExit("bench.floor needs cachestat(2): Linux 6.5 or later")
    with tempfile.TemporaryDirectory(prefix="lota-bench-floor-") as tmp:
        rows = await run(args, Path(tmp))
    print(f"64 KiB hits from {args.workers} uvloop workers doing nothing but the system calls")
    headers = [
        "hot set",
        "conc",
        "req/s",
        "p50 / p99 ms",
        "CPU µs/req",
        "load generator µs/req",
        "errors",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
