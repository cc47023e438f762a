"""Sending a file's bytes from the page cache (lota.zerocopy): what is resident, and a
head and a span written whole, or as far as the socket takes them."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lota import zerocopy
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


def test_this_kernel_has_cachestat() -> None:
    """CI's kernel has what the hit path relies on: if this fails, hits are copied."""
    assert zerocopy.AVAILABLE


def test_a_file_just_written_is_resident_and_what_lies_past_its_end_is_not(
    data_file: tuple[int, bytes],
) -> None:
    fd, _ = data_file
    assert resident(fd, 0, SIZE)
    assert resident(fd, 100, 5000)
    assert not resident(fd, SIZE - 10, 4096 * 3)
    assert not resident(-1, 0, SIZE)


def test_pages_the_kernel_dropped_are_not_resident(data_file: tuple[int, bytes]) -> None:
    fd, _ = data_file
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    assert not resident(fd, 0, SIZE)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead
    os.pread(fd, 4096, 0)  # the first page comes back, the rest does not
    assert resident(fd, 0, 4096)
    assert not resident(fd, 0, 8192)


def test_send_writes_the_head_then_the_span(data_file: tuple[int, bytes]) -> None:
    fd, data = data_file
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"
    with _connected() as (a, b):
        assert zerocopy.send(a.fileno(), head, FileSpan(fd, 123, 10000)) == len(head) + 10000
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
        sent = zerocopy.send(a.fileno(), head, span)
        assert len(head) < sent < len(head) + SIZE
        got = bytearray()
        while len(got) < sent:
            got += b.recv(1 << 20)
    rest = span.read(sent - len(head))
    assert rest is not None
    assert bytes(got) + rest == head + data


def test_a_span_past_the_end_of_its_file_is_short_and_says_so(
    data_file: tuple[int, bytes],
) -> None:
    fd, data = data_file
    shorts: list[bool] = []
    span = FileSpan(fd, SIZE - 100, 200, lambda: shorts.append(True))
    with _connected() as (a, _):
        assert zerocopy.send(a.fileno(), b"h", span) == 1 + 100
    assert span.read(100) is None
    assert shorts == [True]
    assert FileSpan(fd, 0, 100).read() == data[:100]
