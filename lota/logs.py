"""Logging set-up: named loggers, one line per record, written by a background thread.

Writing a log line is blocking I/O: the event loop only puts records on a queue, and a
listener thread formats and writes them. The access log writes one line per request, so
it skips the logging machinery altogether (:class:`AccessLog`): the loop formats a line
into a list, and the list goes to the writer thread as one record every few milliseconds.

An access line::

    REMOTE "METHOD PATH" STATUS OPERATION 1.5ms id=REQUEST_ID cache=HIT out=BODY_BYTES_SENT
        in=BODY_BYTES_RECEIVED principal=NAME [err=S3_ERROR_CODE]

It never holds a secret: no Authorization header, and presigned signatures and session
tokens in the path are replaced by ``REDACTED``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import logging.handlers
import queue
import time
from collections.abc import Callable
from functools import partial

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACCESS = "lota.access"
# An access-log batch is handed to the writer after this long, or at this many lines.
FLUSH_AFTER = 0.05
FLUSH_LINES = 512

# Query parameters that would let whoever reads the log replay the request (presigned
# signatures, SigV4's X-Amz-Signature and SigV2's Signature, and session tokens), by how
# their names end, whatever the case of their first letters.
_SECRET_PARAMS = ("ignature=", "ecurity-Token=", "ecurity-token=")

# Where batches of finished lines go once `setup` has run; before, they are logged one by
# one through the "lota.access" logger (tests and embedders with their own handlers).
_batches: list[queue.SimpleQueue[logging.LogRecord]] = []


class _EnqueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: the listener thread does the formatting."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


class _Formatter(logging.Formatter):
    """The usual format, except for access-log batches, which arrive formatted."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "preformatted", False):
            return str(record.msg)
        return super().format(record)


def setup(level: str) -> None:
    """Route every logger through a queue to stderr; flushed when the process exits."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = logging.StreamHandler()
    stream.setFormatter(_Formatter(FORMAT))
    listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
    root = logging.getLogger()
    root.handlers[:] = [_EnqueueHandler(records)]
    root.setLevel(level.upper())
    _batches[:] = [records]
    listener.start()
    atexit.register(listener.stop)


class AccessLog:
    """One line per request, in the same format as every other log line, batched."""

    def __init__(self) -> None:
        self._logger = logging.getLogger(ACCESS)
        # Whether lines are written (a caller may skip making one): the logger's own check,
        # bound once (it is asked for every request).
        self.enabled: Callable[[], bool] = partial(self._logger.isEnabledFor, logging.INFO)
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._second = -1
        self._stamp = ""

    def write(
        self,
        remote: str | None,
        method: str,
        path: str,
        status: int,
        operation: str,
        seconds: float,
        request_id: str,
        *,
        cache: str = "-",
        sent: int = 0,
        received: int = 0,
        principal: str = "-",
        error: str = "",
    ) -> None:
        """One line: `sent` and `received` are body bytes; `cache` the x-lota-cache header;
        `error` the S3 error code LOTA answered with, if any. Status 0: nothing was sent."""
        if not self.enabled():
            return
        if "?" in path:
            path = redacted(path)
        message = (
            f'{remote} "{method} {path[:256]}" {status} {operation}'
            f" {seconds * 1000:.1f}ms id={request_id} cache={cache} out={sent} in={received}"
            f" principal={principal}"
        )
        if error:
            message += f" err={error}"
        if not _batches:
            self._logger.info("%s", message)
            return
        self._lines.append(f"{self._timestamp()} INFO {ACCESS} {message}")
        if len(self._lines) >= FLUSH_LINES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_AFTER, self.flush)

    def flush(self) -> None:
        """Hand the lines written so far to the log writer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines or not _batches:
            return
        record = logging.makeLogRecord(
            {"name": ACCESS, "levelno": logging.INFO, "levelname": "INFO"}
        )
        record.msg, record.preformatted = "\n".join(self._lines), True
        self._lines = []
        _batches[0].put(record)

    def _timestamp(self) -> str:
        """``logging``'s default asctime, with the date part formatted once a second."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._stamp},{int((now - second) * 1000):03d}"


def redacted(path: str) -> str:
    """`path` with the value of each secret query parameter replaced by ``REDACTED``."""
    for marker in _SECRET_PARAMS:
        start = path.find(marker)
        while start != -1:
            start += len(marker)
            end = path.find("&", start)
            path = path[:start] + "REDACTED" + ("" if end == -1 else path[end:])
            start = path.find(marker, start)
    return path
