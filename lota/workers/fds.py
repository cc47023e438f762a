"""Handing a cached chunk's file descriptor to a sibling worker (``SCM_RIGHTS``).

The worker that owns a chunk answers on its ``worker-K.fds`` Unix socket: one JSON line
asks for a chunk, ``{"bucket", "key", "etag", "index"}``; the answer is one JSON line,
``{"length": N, "path": P}`` with the chunk file's descriptor attached, or ``{"length": -1}``
when it does not hold that chunk of that version. (A line ``{"from": K, "news": [...]}``
is what a sibling learnt, :mod:`lota.workers.news`, answered ``{"length": -1}`` once heard.)
The asking worker then sends the bytes to its
client with ``sendfile`` from its own copy of the descriptor: the file's blocks stay
readable through it even if the owner evicts the chunk meanwhile (its bytes never change:
a chunk belongs to one version of one object).

Both ends run on their worker's event loop, on non-blocking sockets: a request is a few
microseconds of work, less than handing it to a thread and back (which is what it cost
when both ends were blocking sockets on threads: with a hot set of 20,000 objects, most
of a worker's time went to those hand-offs). The owner looks the chunk up where its
store lives, on that loop; an asker waits at most :data:`OPEN_TIMEOUT` and then closes
the connection (a descriptor that arrives later is closed with it). The asking side keeps
descriptors (:class:`lota.workers.siblings.SiblingSource`), so this runs about once per
chunk per worker, not once per read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from lota.tasks import TaskGroup

log = logging.getLogger("lota.workers")

# Seconds an asker waits for an answer (the owner's first read of a chunk verifies it).
OPEN_TIMEOUT = 10.0
MAX_REQUEST = 64 * 1024
# Idle connections an asker keeps to one sibling.
MAX_IDLE = 8
# Seconds the owner stops accepting after accept() failed (out of descriptors).
ACCEPT_PAUSE = 0.1

Opened = tuple[int, int, str, Callable[[], None]]
Opener = Callable[[str, str, str, int], Coroutine[Any, Any, Opened | None]]
"""(bucket, key, etag, index) -> (descriptor, length, path, release) of a chunk held, or None."""
Hearer = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]
"""Takes a sibling's news (the line, parsed)."""
Handed = tuple[int, int, str]
"""A chunk handed over: (descriptor, now the asker's own; length; the file's path)."""


class FdServer:
    """Answers siblings' requests for chunk descriptors on a Unix socket."""

    def __init__(
        self,
        path: str,
        opener: Opener,
        loop: asyncio.AbstractEventLoop,
        hear: Hearer | None = None,
    ) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)
            self._listener.listen(128)
        except BaseException:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._opener = opener
        self._hear = hear
        self._loop = loop
        self._asked: set[_Asked] = set()
        self._answers = TaskGroup("fds")

    def start(self) -> None:
        os.chmod(self.path, 0o600)
        self._loop.add_reader(self._listener.fileno(), self._accept)

    async def close(self) -> None:
        """Stop answering; opens under way are cancelled."""
        self._loop.remove_reader(self._listener.fileno())
        self._listener.close()
        for asked in list(self._asked):
            asked.close()
        await self._answers.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the listener stays readable
                log.warning("cannot accept a sibling's descriptor request: %s", exc)
                self._loop.remove_reader(self._listener.fileno())
                self._loop.call_later(ACCEPT_PAUSE, self._resume)
                return
            connection.setblocking(False)
            self._asked.add(_Asked(connection, self, self._asked))

    def _resume(self) -> None:
        if self._listener.fileno() >= 0:
            self._loop.add_reader(self._listener.fileno(), self._accept)


class _Asked:
    """One sibling's connection: its requests answered one after the other, in order."""

    def __init__(
        self,
        connection: socket.socket,
        server: FdServer,
        registry: set[_Asked],
    ) -> None:
        self._connection = connection
        self._opener = server._opener
        self._hear = server._hear
        self._loop = server._loop
        self._answers = server._answers
        self._registry = registry
        self._buffer = bytearray()
        self._answering = False
        self._loop.add_reader(connection.fileno(), self._readable)

    def close(self) -> None:
        """Closed (the asker left): an open under way finishes, and its chunk is let go
        (not cut short: the store's first read of a chunk may be verifying it for others)."""
        self._registry.discard(self)
        if self._connection.fileno() >= 0:
            self._loop.remove_reader(self._connection.fileno())
            self._connection.close()

    def _readable(self) -> None:
        try:
            data = self._connection.recv(MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self._buffer += data
        # An asker sends its next request once it has the answer to the last: more than
        # one request's worth waiting here is no asker of ours.
        if len(self._buffer) > MAX_REQUEST:
            self.close()
            return
        self._next()

    def _next(self) -> None:
        if self._answering or self._connection.fileno() < 0:
            return
        end = self._buffer.find(b"\n")
        if end < 0:
            return
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._answering = True
        self._answers.start(self._answer(line), "answer")

    async def _answer(self, line: bytes) -> None:
        found: Opened | None = None
        try:
            asked = json.loads(line)
            if "news" in asked:
                if self._hear is not None:
                    await self._hear(asked)
            else:
                wanted = (str(asked["bucket"]), str(asked["key"]), str(asked["etag"]))
                found = await self._opener(*wanted, int(asked["index"]))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bad line, a failing store: this chunk is just not handed over
            log.debug("chunk descriptor request or news failed", exc_info=True)
        try:
            self._send(found)
        finally:
            try:
                if found is not None:
                    found[3]()  # the message in flight holds its own reference to the file
            finally:  # whatever failed, the connection's next request is answered
                self._answering = False
                self._next()

    def _send(self, found: Opened | None) -> None:
        if self._connection.fileno() < 0:  # the asker gave up and left
            return
        if found is None:
            message, fds = b'{"length": -1}\n', []
        else:
            answer = {"length": found[1], "path": found[2]}
            message, fds = json.dumps(answer).encode() + b"\n", [found[0]]
        try:
            # The asker reads each answer before it asks again: a few bytes always fit.
            if socket.send_fds(self._connection, [message], fds) != len(message):
                raise ConnectionError("a partial answer")
        except OSError:
            self.close()


class FdClient:
    """Asks one sibling for chunk descriptors; keeps a few connections open."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[socket.socket] = []
        self._closed = False

    async def open(self, bucket: str, key: str, etag: str, index: int) -> Handed | None:
        """The chunk, its descriptor now this process's own; None when the sibling does
        not hold it. OSError when the sibling cannot be reached or does not
        answer within :data:`OPEN_TIMEOUT` (TimeoutError)."""
        request = {"bucket": bucket, "key": key, "etag": etag, "index": index}
        return await self._request(json.dumps(request).encode() + b"\n")

    async def tell(self, news: bytes) -> None:
        """Send `news` (one line, :mod:`lota.workers.news`) and wait until it is heard.
        OSError as for :meth:`open`."""
        handed = await self._request(news)
        if handed is not None:
            os.close(handed[0])

    async def _request(self, line: bytes) -> Handed | None:
        while self._idle:
            try:
                return await self._ask(self._idle.pop(), line)
            except _Stale:  # the sibling closed it while it was idle (it restarted)
                continue
        return await self._ask(await self._connect(), line)

    async def _ask(self, sock: socket.socket, line: bytes) -> Handed | None:
        fds: list[int] = []
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                try:
                    sent = sock.send(line)
                except (BrokenPipeError, ConnectionResetError) as exc:
                    raise _Stale() from exc
                if sent != len(line):
                    raise ConnectionError("the sibling's socket is full")
                data = await _answer(sock, fds)
            answer = json.loads(data)
            length = int(answer["length"])
            path = str(answer.get("path", "")) if length >= 0 else ""
        except BaseException as exc:
            sock.close()
            for fd in fds:
                os.close(fd)
            if isinstance(exc, (ValueError, KeyError, TypeError)):
                raise ConnectionError(f"the sibling answered {exc!r}") from exc
            raise
        self._put_back(sock)
        if length < 0 or not fds:
            for fd in fds:
                os.close(fd)
            return None
        for extra in fds[1:]:
            os.close(extra)
        return fds[0], length, path

    async def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    def _put_back(self, sock: socket.socket) -> None:
        if len(self._idle) < MAX_IDLE and not self._closed:
            self._idle.append(sock)
        else:
            sock.close()

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


class _Stale(ConnectionError):
    """The sibling closed the connection before it answered anything (a pooled connection
    it closed while it was idle): the request can be asked again on a new one."""

    def __init__(self) -> None:
        super().__init__("the sibling closed the connection")


async def _answer(sock: socket.socket, fds: list[int]) -> bytes:
    """One answer line from `sock`, the descriptors that came with it added to `fds`."""
    data = b""
    while True:
        try:
            piece, got, _, _ = socket.recv_fds(sock, 4096, 1)
        except (BlockingIOError, InterruptedError):
            await _readable(sock)
            continue
        fds.extend(got)
        if not piece:
            raise _Stale() if not data else ConnectionError("the sibling closed the connection")
        data += piece
        if data.endswith(b"\n"):
            return data
        if len(data) > MAX_REQUEST:
            raise ConnectionError("the sibling's answer is too long")


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, _set, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
