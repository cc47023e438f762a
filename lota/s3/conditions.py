"""Conditional GET/HEAD (If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since).

Evaluated the way S3 documents it, which follows RFC 9110 section 13.2.2: If-Match beats
If-Unmodified-Since, If-None-Match beats If-Modified-Since; a failed If-Match or
If-Unmodified-Since is 412, a matched If-None-Match or an unmodified If-Modified-Since is
304. Unparsable dates are ignored, as HTTP requires. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from lota.errors import LotaError
from lota.s3.errors import S3Error


class NotModified(LotaError):
    """The client's copy is current: answer 304 with the object's headers and no body."""


def check(headers: Mapping[str, str], etag: str, last_modified: str) -> None:
    """Raise 412 PreconditionFailed or :class:`NotModified`, or return to serve the object."""
    if_match = headers.get("if-match")
    if if_match is not None:
        if not _etag_in(if_match, etag):
            raise _failed("If-Match")
    elif (since := _date(headers.get("if-unmodified-since"))) and (
        (modified := _date(last_modified)) and modified > since
    ):
        raise _failed("If-Unmodified-Since")
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None:
        if _etag_in(if_none_match, etag):
            raise NotModified()
    elif (since := _date(headers.get("if-modified-since"))) and (
        (modified := _date(last_modified)) and modified <= since
    ):
        raise NotModified()


def _etag_in(header: str, etag: str) -> bool:
    wanted = etag.strip().removeprefix("W/").strip('"')
    for raw in header.split(","):
        candidate = raw.strip()
        if candidate == "*" or candidate.removeprefix("W/").strip('"') == wanted:
            return True
    return False


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _failed(condition: str) -> S3Error:
    return S3Error(
        "PreconditionFailed",
        "At least one of the pre-conditions you specified did not hold",
        extra={"Condition": condition},
    )
