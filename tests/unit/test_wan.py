"""The emulated WAN link: timing (loose bounds), stream semantics, counters, parsing, the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

import lota
from lota.testing.wan import (
    MAX_WINDOW,
    MIN_WINDOW,
    Pacer,
    WanLink,
    parse_address,
    parse_bandwidth,
    parse_latency,
    window_size,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
StartServer = Callable[[Handler], Awaitable[int]]
MiB = 1024 * 1024


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until EOF, then close: the far side of a request/response exchange."""
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Count bytes until EOF, then answer with the count: needs half-close to work."""
    total = 0
    try:
        while data := await reader.read(1024 * 1024):
            total += len(data)
        writer.write(str(total).encode())
        await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start loopback TCP servers for a test; all are closed after it."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def connect(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def linked(
    target_host: str, target_port: int, **options: Any
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection to the target through a WanLink of its own."""
    async with WanLink(target_host, target_port, **options) as link, connect(link.port) as conn:
        yield conn


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    started = time.perf_counter()
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    return time.perf_counter() - started


async def send_all(writer: asyncio.StreamWriter, size: int) -> None:
    block = b"x" * MiB
    for _ in range(size // MiB):
        writer.write(block)
        await writer.drain()
    writer.write_eof()


async def test_round_trip_on_open_connection_gains_two_latencies(start_server: StartServer) -> None:
    latency = 0.05
    async with linked("127.0.0.1", await start_server(echo), latency=latency) as (reader, writer):
        first = await round_trip(reader, writer)
        second = await round_trip(reader, writer)
    assert 2 * latency * 0.9 <= second < 2 * latency + 0.1
    # The first request on a new connection also pays the handshake round trip.
    assert 4 * latency * 0.9 <= first < 4 * latency + 0.1


async def test_bandwidth_cap_paces_a_4_mib_transfer(start_server: StartServer) -> None:
    async with linked("127.0.0.1", await start_server(sink), bandwidth=8e6) as (reader, writer):
        started = time.perf_counter()
        await send_all(writer, 4 * MiB)
        assert int(await reader.read()) == 4 * MiB
        elapsed = time.perf_counter() - started
    assert 0.45 <= elapsed < 2.0  # 4 MiB / 8 MB/s = 0.52 s


async def test_latency_without_cap_pipelines_a_stream(start_server: StartServer) -> None:
    """32 MiB over a 50 ms link: a per-read sleep would take 512 x 50 ms, a pipeline ~4 x 50 ms."""
    latency = 0.05
    async with linked("127.0.0.1", await start_server(sink), latency=latency) as (reader, writer):
        started = time.perf_counter()
        await send_all(writer, 32 * MiB)
        assert int(await reader.read()) == 32 * MiB
        elapsed = time.perf_counter() - started
    assert 4 * latency * 0.9 <= elapsed < 16 * latency


async def test_eof_from_client_reaches_target_which_still_answers(
    start_server: StartServer,
) -> None:
    async with linked("127.0.0.1", await start_server(sink), latency=0.01) as (reader, writer):
        writer.write(b"hello")
        writer.write_eof()
        assert await reader.read() == b"5"


async def test_eof_from_target_reaches_client(start_server: StartServer) -> None:
    async with linked("127.0.0.1", await start_server(echo)) as (reader, writer):
        writer.write(b"last words")
        writer.write_eof()
        assert await reader.read() == b"last words"


async def test_reset_by_target_closes_client(start_server: StartServer) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        writer.transport.abort()

    async with WanLink("127.0.0.1", await start_server(reset)) as link:
        async with connect(link.port) as (reader, writer):
            writer.write(b"ping")
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 2) == b""
        await _until(lambda: link.active_connections == 0)


async def test_unreachable_target_closes_client() -> None:
    async with WanLink("127.0.0.1", _closed_port(), latency=0.01) as link:
        async with connect(link.port) as (reader, _):
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 2) == b""
        await _until(lambda: link.active_connections == 0)
    assert link.connections == 1


async def test_closing_the_link_closes_its_connections(start_server: StartServer) -> None:
    target_saw_eof = asyncio.Event()

    async def watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        target_saw_eof.set()
        writer.close()

    link = WanLink("127.0.0.1", await start_server(watch), latency=0.01)
    await link.start()
    async with connect(link.port) as (reader, writer):
        writer.write(b"idle connection")
        await _until(lambda: link.bytes_up == 15)
        await link.close()
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 2) == b""
        await asyncio.wait_for(target_saw_eof.wait(), 2)
    assert link.active_connections == 0


async def test_counters_count_delivered_bytes_and_connections(start_server: StartServer) -> None:
    async with WanLink("127.0.0.1", await start_server(echo), latency=0.001) as link:
        for size in (1, 100_000):
            async with connect(link.port) as (reader, writer):
                writer.write(b"z" * size)
                writer.write_eof()
                assert len(await reader.read()) == size
        await _until(lambda: link.active_connections == 0)
    assert (link.connections, link.bytes_up, link.bytes_down) == (2, 100_001, 100_001)


def test_works_under_uvloop() -> None:
    async def scenario() -> tuple[float, bytes]:
        server = await asyncio.start_server(sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with linked("127.0.0.1", port, latency=0.02, bandwidth=50e6) as (reader, writer):
                started = time.perf_counter()
                await send_all(writer, 2 * MiB)
                answer = await reader.read()
                return time.perf_counter() - started, answer
        finally:
            server.close()
            await server.wait_closed()

    elapsed, answer = uvloop.run(scenario())
    assert int(answer) == 2 * MiB
    assert elapsed >= 4 * 0.02 * 0.9


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10ms", 0.01), ("0.03", 0.03), ("1s", 1.0), ("500us", 0.0005), (" 30 ms ", 0.03), ("0", 0)],
)
def test_parse_latency(text: str, seconds: float) -> None:
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100Mbit", 12.5e6),
        ("1Gbit", 125e6),
        ("12.5MB/s", 12.5e6),
        ("100Mbps", 12.5e6),
        ("100Mb/s", 12.5e6),
        ("10MiB/s", 10 * MiB),
        ("1000", 1000.0),
        ("none", None),
        ("unlimited", None),
    ],
)
def test_parse_bandwidth(text: str, rate: float | None) -> None:
    assert parse_bandwidth(text) == (None if rate is None else pytest.approx(rate))


@pytest.mark.parametrize("text", ["fast", "10ms", "-5MB/s", "10Xbit", "M"])
def test_parse_bandwidth_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


@pytest.mark.parametrize("text", ["soon", "10 parsecs", "-1ms"])
def test_parse_latency_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="latency"):
        parse_latency(text)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert parse_address("5001") == ("127.0.0.1", 5001)
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError):
        parse_address("127.0.0.1:http")


def test_window_holds_two_bandwidth_delay_products_within_bounds() -> None:
    assert window_size(0.03, None) == MAX_WINDOW
    assert window_size(0.03, 12.5e6) == 750_000
    assert window_size(0.0, 12.5e6) == MIN_WINDOW
    assert window_size(10.0, 1e9) == MAX_WINDOW


def test_pacer_delays_by_latency_and_spaces_chunks_by_bandwidth() -> None:
    pacer = Pacer(latency=0.01, bandwidth=1000.0)
    assert pacer.arrival(0.0, 100) == pytest.approx(0.11)  # 10 ms + 100 B at 1 kB/s
    assert pacer.arrival(0.0, 100) == pytest.approx(0.21)  # queued behind the first
    assert pacer.arrival(5.0, 100) == pytest.approx(5.11)  # idle link: latency again


def test_pacer_without_cap_only_adds_latency_and_handshake() -> None:
    pacer = Pacer(latency=0.01, bandwidth=None, not_before=0.02)
    assert pacer.arrival(0.0, 10**9) == pytest.approx(0.03)
    assert pacer.arrival(0.025, 10**9) == pytest.approx(0.035)


def test_cli_forwards_and_stops_on_sigterm(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as target:
        target_port = target.getsockname()[1]
        listen_port = _closed_port()
        root = str(Path(lota.__file__).resolve().parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        log = tmp_path / "wan.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "lota.testing.wan",
                    "--target", f"127.0.0.1:{target_port}",
                    "--listen", f"127.0.0.1:{listen_port}",
                    "--latency", "5ms", "--bandwidth", "100Mbit",
                ],
                stderr=out,
                env=env,
            )  # fmt: skip
        try:
            client = _connect_with_retry(listen_port, proc)
            with client, target.accept()[0] as far:
                client.sendall(b"hi")
                assert far.recv(2) == b"hi"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
    text = log.read_text()
    assert "latency 5 ms each way, bandwidth 100 Mbit/s" in text
    assert "1 connections, 2 bytes up" in text


def _connect_with_retry(port: int, proc: subprocess.Popen[bytes]) -> socket.socket:
    deadline = time.monotonic() + 15
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(condition: Callable[[], bool]) -> None:
    """Wait up to 2 s for a side effect the link reports only through a counter."""
    async with asyncio.timeout(2):
        while not condition():
            await asyncio.sleep(0.005)
