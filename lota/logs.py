"""Logging set-up: named loggers, one line per record, written by a background thread.

Writing a log line is blocking I/O: the event loop only puts records on a queue, and a
listener thread formats and writes them. The access log writes one line per request, so
it skips the logging machinery altogether (:class:`AccessLog`): the loop formats a line
into a list, and the list goes to the writer thread as one record every few milliseconds.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import logging.handlers
import queue
import time

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
ACCESS = "lota.access"
# An access-log batch is handed to the writer after this long, or at this many lines.
FLUSH_AFTER = 0.05
FLUSH_LINES = 512

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
    ) -> None:
        if not self._logger.isEnabledFor(logging.INFO):
            return
        message = (
            f'{remote} "{method} {path[:256]}" {status} {operation}'
            f" {seconds * 1000:.1f}ms id={request_id}"
        )
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
