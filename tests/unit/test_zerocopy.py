"""Sending a file's bytes from the page cache (lota.zerocopy): what is resident, and a
head and a span written whole, or as far as the socket takes them."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lota import zerocopy
from lota.cache.reads import SMALL_BODY
from lota.cache.store import reader
from lota.cache.store.reader import read_or_span, read_resident
from lota.node.listener import S3RequestHandler
from lota.zerocopy import FileSpan, resident

SIZE = 64 * 1024


@pytest.fixture
def data_file(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(SIZE)
    path = tmp_path / "chunk"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, data
    finally:
        os.close(fd)


@contextmanager
def _connected(small: bool = False) -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two ends of a TCP connection on loopback, the first non-blocking (as a server's);
    `small`: with small buffers, so that it takes little before its peer reads."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        b = socket.socket()
        if small:
            b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        b.connect(server.getsockname())
        a, _ = server.accept()
    if small:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.setblocking(False)
    with a, b:
        yield a, b


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def test_a_kernel_with_cachestat_sends_hits_from_the_page_cache() -> None:
    """Linux 6.5 has cachestat(2): off there only if a seccomp filter refuses it."""
    assert zerocopy.AVAILABLE or _kernel() < (6, 5)


def test_a_file_just_written_is_resident_and_what_lies_past_its_end_is_not(
    data_file: tuple[int, bytes],
) -> None:
    fd, _ = data_file
    held = zerocopy.AVAILABLE  # without cachestat, nothing is ever said to be held
    assert resident(fd, 0, SIZE) == held
    assert resident(fd, 100, 5000) == held
    assert not resident(fd, SIZE - 10, 4096 * 3)
    assert not resident(-1, 0, SIZE)


def _drop_pages(fd: int) -> None:
    """Have the kernel forget the file's pages (a file system that keeps its files in
    memory, tmpfs, cannot: the test is not for it). The kernel may hold pages a moment
    longer (per-CPU batches): evicted again until they are gone, as a loaded CI run
    needed."""
    os.fsync(fd)
    for _ in range(100):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead on later reads
        if read_resident(fd, 1, 0) is None:
            return
        time.sleep(0.02)
    pytest.skip("this file system keeps its files' pages")


def test_pages_the_kernel_dropped_are_not_resident(data_file: tuple[int, bytes]) -> None:
    fd, _ = data_file
    _drop_pages(fd)
    assert not resident(fd, 0, SIZE)
    os.pread(fd, 4096, 0)  # the first page comes back, the rest does not
    assert resident(fd, 0, 4096) == zerocopy.AVAILABLE
    assert not resident(fd, 0, 8192)


@dataclass
class Seen:
    warm: tuple[int, int] | None = None


def test_a_span_is_made_only_of_bytes_read_whole_from_memory(
    data_file: tuple[int, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """cachestat counts pages still being read in from the drive as held: a span of them
    would wait for the drive. So a span is made only of bytes read whole from memory: now
    (read, then dropped), or before (remembered, then checked with cachestat)."""
    fd, data = data_file
    seen = Seen()
    spanned = FileSpan(fd, 0, 5000) if zerocopy.AVAILABLE else data[:5000]  # else copied
    assert read_or_span(fd, 0, 5000, seen, span=True) == spanned
    assert seen.warm == (0, 5000)
    assert len(reader._proof) >= SMALL_BODY  # a span of any small hit can be proved
    assert read_or_span(fd, 100, 4000, seen, span=False) == data[100:4100]
    assert seen.warm == (100, 4100)
    seen.warm = (0, 5000)
    monkeypatch.setattr(zerocopy, "AVAILABLE", True)
    monkeypatch.setattr(reader, "_read_whole", lambda *args: False)  # as if coming in
    monkeypatch.setattr(reader, "resident", lambda *args: True)  # cachestat counts them
    assert read_or_span(fd, 100, 4000, seen, span=True) == FileSpan(fd, 100, 4000)  # known
    assert read_or_span(fd, 0, 8000, seen, span=True) is None  # not all known yet
    assert seen.warm is None
    assert read_or_span(fd, 100, 4000, seen, span=True) is None
    monkeypatch.setattr(reader, "resident", lambda *args: False)
    seen.warm = (0, 5000)
    assert read_or_span(fd, 100, 4000, seen, span=True) is None  # known, found gone


def test_pages_being_read_in_are_never_sent_as_a_span(data_file: tuple[int, bytes]) -> None:
    """A read that found the pages gone starts reading them in (RWF_NOWAIT's read-ahead):
    the reads after it get nothing while they come, then spans once they are all in."""
    fd, data = data_file
    seen = Seen()
    spanned = FileSpan(fd, 0, SIZE) if zerocopy.AVAILABLE else data  # else copied
    assert read_or_span(fd, 0, SIZE, seen, span=True) == spanned
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
    _drop_pages(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)  # read-ahead, as chunk reads have
    kinds = []
    for _ in range(10_000):
        got = read_or_span(fd, 0, SIZE, seen, span=True)
        assert got is None or got == spanned
        kinds.append("-" if got is None else "span")
        if got is not None:
            break
    # Nothing while the pages come in, then a span.
    assert kinds[0] == "-" and kinds[-1] == "span" and "span" not in kinds[:-1]
    assert os.pread(fd, SIZE, 0) == data


def test_send_writes_the_head_then_the_span(data_file: tuple[int, bytes]) -> None:
    fd, data = data_file
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"
    with _connected() as (a, b):
        assert zerocopy.send(a, head, FileSpan(fd, 123, 10000)) == len(head) + 10000
        got = b""
        while len(got) < len(head) + 10000:
            got += b.recv(1 << 20)
    assert got == head + data[123:10123]


def test_send_stops_where_the_socket_is_full_and_the_rest_is_read_from_there(
    data_file: tuple[int, bytes],
) -> None:
    fd, data = data_file
    head = b"head\r\n\r\n"
    span = FileSpan(fd, 0, SIZE)
    with _connected(small=True) as (a, b):
        sent = zerocopy.send(a, head, span)
        assert len(head) < sent < len(head) + SIZE
        got = bytearray()
        while len(got) < sent:
            got += b.recv(1 << 20)
    rest = span.read(sent - len(head))
    assert rest is not None
    assert bytes(got) + rest == head + data


def test_a_borrowed_socket_writes_on_the_connection_and_never_closes_it(
    data_file: tuple[int, bytes],
) -> None:
    """The listener writes on its transport's socket through a Borrowed one: collected
    without being detached (a bug, say), it leaves the descriptor open, the transport's
    to close; a socket that takes nothing more sends nothing at once, and says so."""
    fd, _ = data_file
    with _connected(small=True) as (a, b):
        default = socket.getdefaulttimeout()
        socket.setdefaulttimeout(5.0)  # were it taken, a full socket would wait for 5 s
        try:
            borrowed = zerocopy.borrow(a.fileno())
        finally:
            socket.setdefaulttimeout(default)
        assert borrowed.gettimeout() == 0.0
        while zerocopy.send(borrowed, b"h", FileSpan(fd, 0, SIZE)):
            pass  # until the socket takes nothing more
        assert zerocopy.send(borrowed, b"h", FileSpan(fd, 0, 1)) == 0
        del borrowed
        gc.collect()
        os.fstat(a.fileno())  # still open
        b.setblocking(False)
        assert b.recv(1 << 20)  # and still the connection
    os.fstat(fd)


def test_a_span_past_the_end_of_its_file_is_short_and_says_so(
    data_file: tuple[int, bytes],
) -> None:
    fd, data = data_file
    shorts: list[bool] = []
    span = FileSpan(fd, SIZE - 100, 200, lambda: shorts.append(True))
    with _connected() as (a, _):
        assert zerocopy.send(a, b"h", span) == 1 + 100
    assert span.read(100) is None
    assert shorts == [True]
    assert FileSpan(fd, 0, 100).read() == data[:100]


async def test_a_span_never_overtakes_what_the_transport_still_holds(
    data_file: tuple[int, bytes],
) -> None:
    """The listener writes a span on the socket itself only when the transport holds
    nothing: bytes it still holds (the socket was full; the peer has read some since, and
    the loop has not written more yet) go first, the span after them."""
    fd, data = data_file
    loop = asyncio.get_running_loop()
    with _connected() as (a, b):
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        blob = os.urandom(8 * 1024 * 1024)
        transport.write(blob)
        assert transport.get_write_buffer_size() > 0
        b.settimeout(10)
        first = b.recv(1 << 20)  # room in the socket again, the loop not run since
        handler = S3RequestHandler.__new__(S3RequestHandler)
        handler._socket = zerocopy.borrow(a.fileno())
        span = handler._can_span(transport)  # as the listener asks, then writes at once
        assert not span
        assert handler._write(transport, (b"HEAD", FileSpan(fd, 0, SIZE)), span)
        expected = blob + b"HEAD" + data
        got = first + await asyncio.to_thread(_read_exactly, b, len(expected) - len(first))
        # A connection being closed takes no more answers on its socket.
        assert handler._can_span(transport)
        transport.close()
        assert not handler._can_span(transport)
        handler._socket.detach()
    assert got == expected


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    got = bytearray()
    while len(got) < count:
        piece = sock.recv(1 << 20)
        assert piece, "connection closed"
        got += piece
    return bytes(got)
