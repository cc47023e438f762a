"""Paging through an origin's listing: the one place LOTA sends ListObjectsV2 itself.

Warming (:mod:`lota.cache.warm`), the lifecycle engine's scan and the merged listing of
write acceleration (:mod:`lota.regions.writes`) all read an origin's keys through
:func:`origin_page` (one page, from a token or after a key) or :func:`origin_pages`
(every page under a prefix). Keys are asked for URL-encoded, so any key survives the
XML, and decoded by :func:`lota.regions.listing.parse_origin_page`.

A refusal with an S3 error code (4xx: ``NoSuchBucket``, ``AccessDenied``) is raised as
that :class:`~lota.s3.errors.S3Error`, for the caller to pass on; anything else (a 5xx,
a body that is no S3 error, no answer) is an :class:`~lota.errors.OriginError`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from lota.errors import LotaError, OriginError
from lota.regions.listing import Entry, parse_origin_page
from lota.regions.origin import OriginClient
from lota.s3.errors import S3Error

PAGE_KEYS = 1000


@dataclass(frozen=True, slots=True)
class OriginPage:
    contents: list[Entry]
    truncated: bool
    token: str
    """The continuation token of the next page ("" if none)."""


async def origin_page(
    origin: OriginClient, bucket: str, prefix: str, *, token: str = "", start_after: str = ""
) -> OriginPage:
    """One page of `bucket`'s keys under `prefix`: after `token`, else after `start_after`."""
    query = [
        ("list-type", "2"),
        ("prefix", prefix),
        ("encoding-type", "url"),
        ("max-keys", str(PAGE_KEYS)),
    ]
    if token:
        query.append(("continuation-token", token))
    elif start_after:
        query.append(("start-after", start_after))
    async with origin.request("GET", bucket, "", query=query) as reply:
        body = await reply.read()
        status = reply.status
    if status != 200:
        raise refusal(f"listing {bucket}/{prefix} at the origin", status, body)
    contents, _, truncated, following = parse_origin_page(body)
    return OriginPage(contents, truncated, following if truncated else "")


async def origin_pages(
    origin: OriginClient, bucket: str, prefix: str
) -> AsyncGenerator[list[Entry], None]:
    """Every page of `bucket`'s keys under `prefix`, in order."""
    token = ""
    while True:
        page = await origin_page(origin, bucket, prefix, token=token)
        yield page.contents
        if not page.token:
            return
        token = page.token


def refusal(what: str, status: int, body: bytes) -> LotaError:
    """The origin's 4xx S3 error as ours (NoSuchBucket stays a 404); anything else, a 5xx
    or a body that is no S3 error, means the origin is not working."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        root = ET.Element("none")
    code = root.findtext("Code") if root.tag == "Error" else None
    if code and 400 <= status < 500:
        return S3Error(code, root.findtext("Message") or code, status=status)
    return OriginError(f"{what}: origin answered {status} {body[:200]!r}")
