"""What the front end learns about each request, and the ids requests are answered with."""

from __future__ import annotations

import itertools
import time
import uuid

from lota.s3.operations import Op


class RequestContext:
    """What the handler learns about a request as it goes, for metrics and the access log."""

    __slots__ = (
        "bucket",
        "copy_source",
        "error",
        "key",
        "operation",
        "principal",
        "request_id",
        "started",
    )

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.request_id = next_request_id()
        self.operation: str = Op.UNKNOWN
        self.bucket = self.key = ""
        self.copy_source: tuple[str, str] | None = None
        self.principal = "-"
        self.error = ""  # the S3 error code LOTA answered with


_REQUEST_PREFIX = uuid.uuid4().hex[:6].upper()
_request_numbers = itertools.count(1)


def next_request_id() -> str:
    """Unique per process run and cheap: a random prefix and a counter."""
    return f"{_REQUEST_PREFIX}{next(_request_numbers):010X}"
