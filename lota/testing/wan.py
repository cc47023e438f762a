"""An emulated WAN link: a loopback TCP proxy that adds one-way latency and a bandwidth cap.

LOTA's demo, benchmarks and tests need an origin that is *far away* (10 ms one way for a
same-continent bucket, 30 ms and 100 Mbit/s for a cross-region one) while it really runs
on this machine. :class:`WanLink` sits in front of it and makes every TCP connection behave
like one across such a link::

    async with EmbeddedOrigin() as origin, WanLink("127.0.0.1", origin.port, latency=0.01) as wan:
        s3 = boto3.client("s3", endpoint_url=wan.endpoint, ...)

How the link is modelled, per connection and per direction:

- Latency is a pipeline delay, not a per-read sleep: bytes read at time *t* are written at
  *t + latency*, and while they travel the next bytes are already being read, so a stream
  keeps flowing at full speed (a real link holds a bandwidth-delay product in flight).
- Bandwidth is paced store-and-forward per chunk: a chunk of *n* bytes leaves *n / bandwidth*
  seconds after the one before it (one TCP stream's share, as across regions).
- A new connection pays the TCP handshake: its first bytes to the target wait one extra
  round trip (*2 * latency*), so the first request on a fresh connection costs two round
  trips and later ones one, as over a real WAN.
- At most a window of bytes is in flight per direction (like a TCP receive window); the
  reader stops reading when it is full, so memory stays bounded and the sender feels
  backpressure through its socket.
- EOF is forwarded (``write_eof``) after the data before it; a reset or error on either side
  closes both sides; closing the link closes every connection.

``python -m lota.testing.wan --target 127.0.0.1:5000 --latency 10ms --bandwidth 100Mbit`` runs one
from the shell.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import re
import signal
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from lota.tasks import TaskGroup

_log = logging.getLogger("lota.wan")

READ_SIZE = 64 * 1024
# Bytes in flight per direction: enough for ~1.6 GB/s at 10 ms one way without a cap.
MAX_WINDOW = 16 * 1024 * 1024
MIN_WINDOW = 4 * READ_SIZE
# A graceful close waits this long for buffered bytes to reach a peer before aborting.
_CLOSE_TIMEOUT = 5.0

_LATENCY_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_RATE_PREFIXES = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_latency(text: str) -> float:
    """``"10ms"`` -> 0.01, ``"0.03"`` -> 0.03 (plain numbers are seconds), ``"500us"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]*)\s*", text.lower())
    if not match or match.group(2) not in _LATENCY_UNITS:
        raise ValueError(f"not a latency: {text!r} (use e.g. 10ms, 0.03, 1s)")
    return float(match.group(1)) * _LATENCY_UNITS[match.group(2)]


def parse_bandwidth(text: str) -> float | None:
    """A rate in bytes per second; ``None`` for ``"none"``, ``"unlimited"`` or ``"0"``.

    Bits: ``"100Mbit"``, ``"1Gbit"``, ``"100Mbps"``, ``"100Mb/s"``. Bytes: ``"12.5MB/s"``,
    ``"10MiB/s"``, or a plain number. Decimal prefixes are powers of 1000, ``Ki``/``Mi``/…
    powers of 1024, as ``tc`` and S3 tools use them.
    """
    if text.strip().lower() in {"none", "unlimited", "inf", "0", ""}:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*?)(bit|bps|b|B)?(/s)?\s*", text)
    prefix = match.group(2).lower() if match else "?"
    if not match or prefix not in _RATE_PREFIXES or (match.group(3) is None and prefix):
        raise ValueError(f"not a bandwidth: {text!r} (use e.g. 100Mbit, 1Gbit, 12.5MB/s)")
    per_bit = match.group(3) in {"bit", "bps", "b"}
    rate = float(match.group(1)) * _RATE_PREFIXES[prefix] / (8 if per_bit else 1)
    if rate <= 0:
        raise ValueError(f"bandwidth must be positive: {text!r}")
    return rate


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``"127.0.0.1:5000"`` -> ("127.0.0.1", 5000); ``"5000"`` uses the default host."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host.strip("[]") or default_host, int(port)


def window_size(latency: float, bandwidth: float | None) -> int:
    """Bytes allowed in flight per direction.

    Uncapped, the window is large so that latency does not throttle a stream; capped, two
    bandwidth-delay products keep the link busy without queueing seconds of data behind it.
    """
    if bandwidth is None:
        return MAX_WINDOW
    return max(MIN_WINDOW, min(MAX_WINDOW, int(2 * bandwidth * latency)))


def format_bandwidth(bandwidth: float | None) -> str:
    """Bytes per second as a human reads a link: ``"100 Mbit/s"``."""
    if bandwidth is None:
        return "unlimited"
    return f"{bandwidth * 8 / 1e6:g} Mbit/s"


class Pacer:
    """When each chunk of one direction reaches the far side; pure arithmetic, no clock.

    A chunk sent at ``sent_at`` arrives ``latency`` later, but never before the chunk ahead
    of it has finished arriving: with a cap, that takes ``size / bandwidth`` per chunk.
    ``not_before`` holds the first bytes back (the handshake of a new connection).
    """

    def __init__(self, latency: float, bandwidth: float | None, not_before: float = 0.0) -> None:
        self.latency = latency
        self.bandwidth = bandwidth
        self._not_before = not_before
        self._free_at = 0.0

    def arrival(self, sent_at: float, size: int) -> float:
        start = max(max(sent_at, self._not_before) + self.latency, self._free_at)
        if self.bandwidth is not None:
            start += size / self.bandwidth
        self._free_at = start
        return start


class _Reset(Exception):
    """One side of a connection failed or reset; the connection is torn down."""


class _Direction:
    """One direction of a proxied connection: reads chunks, writes each when it is due.

    ``pump_in`` and ``pump_out`` run as two tasks so that reading never waits for the
    delay of earlier data: that is what makes latency a pipeline delay.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pacer: Pacer,
        window: int,
        delivered: Callable[[int], None],
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._pacer = pacer
        self._window = window
        self._delivered = delivered
        self._chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self._in_flight = 0
        self._room = asyncio.Event()
        self._room.set()
        self._ready = asyncio.Event()

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._room.wait()
            try:
                data = await self._reader.read(READ_SIZE)
            except OSError as exc:
                raise _Reset from exc
            self._push(loop.time(), data)
            if not data:
                return

    def _push(self, now: float, data: bytes) -> None:
        self._chunks.append((now, data))
        self._in_flight += len(data)
        if self._in_flight >= self._window:
            self._room.clear()
        self._ready.set()

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sent_at, data = await self._pop()
            if not data:
                self._write_eof()
                return
            delay = self._pacer.arrival(sent_at, len(data)) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._write(data)

    async def _pop(self) -> tuple[float, bytes]:
        while not self._chunks:
            self._ready.clear()
            await self._ready.wait()
        return self._chunks.popleft()

    async def _write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as exc:
            raise _Reset from exc
        self._in_flight -= len(data)
        if self._in_flight < self._window:
            self._room.set()
        self._delivered(len(data))

    def _write_eof(self) -> None:
        if self._writer.can_write_eof() and not self._writer.is_closing():
            with contextlib.suppress(OSError):
                self._writer.write_eof()


class WanLink:
    """Listens on a loopback port and forwards every connection to the target over an emulated WAN.

    ``latency`` is seconds added one way, in each direction (a request/response round trip
    gains ``2 * latency``, and a new connection's first request one more round trip for the
    handshake). ``bandwidth`` caps each direction of each connection, in bytes per second;
    ``None`` is unlimited. Counters: ``bytes_up`` (client to target), ``bytes_down`` (target to
    client), ``connections`` (accepted so far).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must not be negative: {latency}")
        if bandwidth is not None and bandwidth <= 0:
            raise ValueError(f"bandwidth must be positive or None: {bandwidth}")
        self.target_host = target_host
        self.target_port = target_port
        self.latency = latency
        self.bandwidth = bandwidth
        self.listen_host = listen_host
        self.port = listen_port
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks = TaskGroup("wan")
        self._closing = False

    @property
    def endpoint(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"http://{host}:{self.port}"

    @property
    def active_connections(self) -> int:
        return len(self._tasks)

    async def __aenter__(self) -> WanLink:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("WanLink already started")
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.port, limit=2 * READ_SIZE
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        _log.debug(
            "wan link %s -> %s:%d up (latency %.1f ms, %s)",
            self.endpoint,
            self.target_host,
            self.target_port,
            self.latency * 1e3,
            format_bandwidth(self.bandwidth),
        )

    async def close(self) -> None:
        """Stop accepting, tear down every connection, and wait until they are gone."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        await self._tasks.close()
        if self._server is not None:
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.transport.abort()
            return
        self.connections += 1
        self._tasks.start(self._serve(reader, writer), name=f"connection {self.connections}")

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        accepted = asyncio.get_running_loop().time()
        try:
            target_r, target_w = await asyncio.open_connection(
                self.target_host, self.target_port, limit=2 * READ_SIZE
            )
        except OSError as exc:
            _log.warning("wan link cannot reach %s:%d: %s", self.target_host, self.target_port, exc)
            await _close(client_w, graceful=False)
            return
        handshake = accepted + 2 * self.latency
        up = self._direction(client_r, target_w, handshake, self._count_up)
        down = self._direction(target_r, client_w, 0.0, self._count_down)
        await _relay(up, down, client_w, target_w)

    def _direction(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        not_before: float,
        delivered: Callable[[int], None],
    ) -> _Direction:
        pacer = Pacer(self.latency, self.bandwidth, not_before)
        return _Direction(
            reader, writer, pacer, window_size(self.latency, self.bandwidth), delivered
        )

    def _count_up(self, size: int) -> None:
        self.bytes_up += size

    def _count_down(self, size: int) -> None:
        self.bytes_down += size


async def _relay(up: _Direction, down: _Direction, *writers: asyncio.StreamWriter) -> None:
    """Run both directions until both reach EOF; on a reset or cancellation, drop both sides."""
    finished = False
    try:
        async with asyncio.TaskGroup() as group:
            for direction in (up, down):
                group.create_task(direction.pump_in())
                group.create_task(direction.pump_out())
        finished = True
    except* _Reset:
        pass
    finally:
        await asyncio.gather(*(_close(w, graceful=finished) for w in writers))


async def _close(writer: asyncio.StreamWriter, *, graceful: bool) -> None:
    """Close one socket; a peer that stops reading cannot hold a graceful close forever."""
    if not graceful:
        writer.transport.abort()
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lota.testing.wan",
        description="Forward a loopback port to a target through an emulated WAN link.",
    )
    parser.add_argument("--target", required=True, type=parse_address, help="HOST:PORT")
    parser.add_argument(
        "--listen", default="127.0.0.1:0", type=parse_address, help="HOST:PORT (default: any port)"
    )
    parser.add_argument(
        "--latency", default="0", type=parse_latency, help="one way, e.g. 10ms (default 0)"
    )
    parser.add_argument(
        "--bandwidth", default="none", type=parse_bandwidth, help="per direction, e.g. 100Mbit"
    )
    return parser


async def _run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    (target_host, target_port), (listen_host, listen_port) = args.target, args.listen
    async with WanLink(
        target_host,
        target_port,
        latency=args.latency,
        bandwidth=args.bandwidth,
        listen_host=listen_host,
        listen_port=listen_port,
    ) as link:
        _log.info(
            "%s -> %s:%d, latency %g ms each way, bandwidth %s (Ctrl-C stops)",
            link.endpoint,
            target_host,
            target_port,
            args.latency * 1e3,
            format_bandwidth(args.bandwidth),
        )
        started = time.monotonic()
        await stop.wait()
        _log.info(
            "stopping after %.0f s: %d connections, %d bytes up, %d bytes down",
            time.monotonic() - started,
            link.connections,
            link.bytes_up,
            link.bytes_down,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """The ``python -m lota.testing.wan`` entry point."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
    except ImportError:
        asyncio.run(_run(args))
    else:
        uvloop.run(_run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
