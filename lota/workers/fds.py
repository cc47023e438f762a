"""Handing a cached chunk's file descriptor to a sibling worker (``SCM_RIGHTS``).

The worker that owns a chunk answers on its ``worker-K.fds`` Unix socket: one JSON line
asks for a chunk, ``{"bucket", "key", "etag", "index"}``; the answer is one JSON line,
``{"length": N}`` with the chunk file's descriptor attached, or ``{"length": -1}`` when it
does not hold that chunk of that version. The asking worker then sends the bytes to its
client with ``sendfile`` from its own copy of the descriptor: the file's blocks stay
readable through it even if the owner evicts the chunk meanwhile (its bytes never change:
a chunk belongs to one version of one object).

Both ends are plain blocking sockets on threads: a request is a few microseconds of work,
and the asking side keeps descriptors (:class:`lota.workers.siblings.SiblingSource`), so
this runs about once per chunk per worker, not once per read. The owner's side looks the
chunk up on its event loop (:func:`asyncio.run_coroutine_threadsafe`), where its store lives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("lota.workers")

# Seconds the owner's loop may take to open a chunk (a first read verifies its digest).
OPEN_TIMEOUT = 10.0
MAX_REQUEST = 64 * 1024

Opened = tuple[int, int, Callable[[], None]]
Opener = Callable[[str, str, str, int], Coroutine[Any, Any, Opened | None]]
"""(bucket, key, etag, index) -> (descriptor, length, release) of a chunk held, or None."""


class FdServer:
    """Answers siblings' requests for chunk descriptors on a Unix socket."""

    def __init__(self, path: str, opener: Opener, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while line := self.rfile.readline(MAX_REQUEST):
                    owner._answer(self.connection, line)

        self._server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self._server.daemon_threads = True
        self._opener = opener
        self._loop = loop
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lota-fds", daemon=True
        )

    def start(self) -> None:
        os.chmod(self.path, 0o600)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _answer(self, connection: socket.socket, line: bytes) -> None:
        found: Opened | None = None
        try:
            asked = json.loads(line)
            wanted = (str(asked["bucket"]), str(asked["key"]), str(asked["etag"]))
            opening = self._opener(*wanted, int(asked["index"]))
            future = asyncio.run_coroutine_threadsafe(opening, self._loop)
            try:
                found = future.result(OPEN_TIMEOUT)
            except TimeoutError:
                # Too late for this request: the chunk is let go once it is open (not
                # cancelled: an open cut short on its thread could leave its descriptor).
                future.add_done_callback(self._release_late)
                raise
        except Exception:  # a bad line, a stopping loop: this chunk is just not handed over
            log.debug("chunk descriptor request failed", exc_info=True)
        if found is None:
            connection.sendall(b'{"length": -1}\n')
            return
        fd, length, release = found
        try:
            socket.send_fds(connection, [json.dumps({"length": length}).encode() + b"\n"], [fd])
        finally:
            self._loop.call_soon_threadsafe(release)

    def _release_late(self, future: concurrent.futures.Future[Opened | None]) -> None:
        if not future.cancelled() and future.exception() is None:
            late = future.result()
            if late is not None:
                self._loop.call_soon_threadsafe(late[2])


class FdClient:
    """Asks one sibling for chunk descriptors; keeps a few connections open."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self, bucket: str, key: str, etag: str, index: int) -> tuple[int, int] | None:
        """(descriptor, length) of the chunk, now this process's own; None when the
        sibling does not hold it. Blocking: call it on a thread. OSError when the
        sibling cannot be reached."""
        sock = self._connection()
        try:
            request = {"bucket": bucket, "key": key, "etag": etag, "index": index}
            sock.sendall(json.dumps(request).encode() + b"\n")
            data, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        except BaseException:
            sock.close()
            raise
        answer = json.loads(data) if data.endswith(b"\n") else None
        if answer is None:
            sock.close()
            for fd in fds:
                os.close(fd)
            raise ConnectionError("the sibling answered half a line")
        self._put_back(sock)
        length = int(answer["length"])
        if length < 0 or not fds:
            for fd in fds:
                os.close(fd)
            return None
        return fds[0], length

    def _connection(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(OPEN_TIMEOUT + 1)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    def _put_back(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
