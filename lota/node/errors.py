"""How a failure becomes an S3 answer: XML with a status and code, or an aborted response.

:func:`as_s3_error` is the one translation of what a request may fail with into the S3
error the client gets; :func:`error_response` renders it.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from lota.errors import CatalogUnavailable, OriginError
from lota.s3.errors import S3Error

log = logging.getLogger("lota.node")


def as_s3_error(exc: Exception, request_id: str) -> S3Error:
    """The S3 error a failure is answered with: unreachable dependencies are 503s (retry
    later), anything unexpected a logged 500."""
    if isinstance(exc, S3Error):
        return exc
    if isinstance(exc, OriginError):
        log.warning("request %s: %s", request_id, exc)
        return S3Error("ServiceUnavailable", "The origin could not be reached; retry later.")
    if isinstance(exc, CatalogUnavailable):
        log.warning("request %s: %s", request_id, exc)
        return S3Error("ServiceUnavailable", "The catalog could not be reached; retry later.")
    log.error("request %s failed", request_id, exc_info=exc)
    return S3Error("InternalError")


def error_response(exc: S3Error, request_id: str) -> web.Response:
    """An S3 XML error response (aiohttp leaves the body out for HEAD by itself)."""
    return web.Response(
        status=exc.status,
        body=exc.to_xml(request_id),
        content_type="application/xml",
        headers={"x-amz-request-id": request_id},
    )


def response_started(request: web.BaseRequest) -> bool:
    """Whether any part of a response (headers included) has been handed to aiohttp; an
    interim ``100 Continue`` is not one (an error may still be answered after it)."""
    writer: Any = request.writer
    return bool(
        writer.output_size > getattr(writer, "interim", 0)
        or getattr(writer, "_headers_buf", None)
        or getattr(writer, "_headers_written", False)
    )
