"""Logging set-up: named loggers, one line per record, written by a background thread.

Writing a log line is blocking I/O, and the access log writes one per request: the event
loop only puts records on a queue, and a listener thread formats and writes them.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _EnqueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: the listener thread does the formatting."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def setup(level: str) -> None:
    """Route every logger through a queue to stderr; flushed when the process exits."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = logging.StreamHandler()
    stream.setFormatter(logging.Formatter(FORMAT))
    listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
    root = logging.getLogger()
    root.handlers[:] = [_EnqueueHandler(records)]
    root.setLevel(level.upper())
    listener.start()
    atexit.register(listener.stop)
