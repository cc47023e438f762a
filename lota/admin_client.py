"""Client side of LOTA's admin calls (``/_lota/…``), used by the ``lota`` command.

Admin calls are SigV4-signed with the caller's ordinary S3 credentials
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) and authorized by the node like
S3 requests: warming a prefix needs ``s3:ListBucket`` on the bucket, and fills only the
objects the caller may ``s3:GetObject`` (see :mod:`lota.cache.warm`).

``lota warm`` prints one summary line on stdout when the node finished the warm, e.g.
``lota warm: 31 filled (412.0 MiB), 20 already cached, 1 denied, 0 failed``, and one
``lota warm: ...`` line on stderr for anything that went wrong; its exit statuses are
``WARM_OK``, ``WARM_ERROR`` and ``WARM_INCOMPLETE`` below.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

import aiohttp
from yarl import URL

from lota.auth.sigv4 import sign_headers
from lota.errors import WarmFailed
from lota.http import encode_query

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def signed(method: str, url: str) -> dict[str, str]:
    key = os.environ.get("AWS_ACCESS_KEY_ID", "")
    if not key:
        return {}
    return sign_headers(
        method,
        url,
        {},
        access_key_id=key,
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        payload_hash=EMPTY_SHA256,
        now=datetime.now(UTC),
    )


# Exit statuses of ``lota warm`` (2, a usage error, is the command line's own).
WARM_OK = 0  # every listed object is in the cache now: filled or already cached
WARM_ERROR = 1  # no warm, or not to the end: unreachable, refused, stopped early, cut short
WARM_INCOMPLETE = 3  # it ran to the end, but some objects were denied or failed


async def warm(endpoint: str, bucket: str, prefix: str, concurrency: int) -> int:
    """Ask the node to warm the prefix; draw its progress; return an exit status."""
    bar = ProgressBar()
    try:
        last = await _warm_lines(endpoint, bucket, prefix, concurrency, bar)
    except WarmFailed as exc:
        bar.end()
        print(f"lota warm: {exc}", file=sys.stderr)
        return WARM_ERROR
    bar.end()
    print(f"lota warm: {summary(last)}")
    error = last.get("error")
    if isinstance(error, dict):
        print(
            f"lota warm: stopped early: {error.get('code')}: {error.get('message')}",
            file=sys.stderr,
        )
        return WARM_ERROR
    return WARM_INCOMPLETE if last.get("denied") or last.get("failed") else WARM_OK


def summary(p: dict[str, Any]) -> str:
    return (
        f"{p.get('filled', 0)} filled ({p.get('bytes_filled', 0) / 2**20:.1f} MiB),"
        f" {p.get('cached', 0)} already cached, {p.get('denied', 0)} denied,"
        f" {p.get('failed', 0)} failed"
    )


async def _warm_lines(
    endpoint: str, bucket: str, prefix: str, concurrency: int, bar: ProgressBar
) -> dict[str, Any]:
    """POST the warm and follow its JSON lines; the final one, or WarmFailed."""
    query = encode_query(
        [("bucket", bucket), ("concurrency", str(concurrency)), ("prefix", prefix)]
    )
    url = f"{endpoint.rstrip('/')}/_lota/warm?{query}"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            response = await session.post(URL(url, encoded=True), headers=signed("POST", url))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise WarmFailed(f"cannot reach {endpoint}: {exc or type(exc).__name__}") from exc
        async with response:
            if response.status != 200:
                raise WarmFailed(_refusal(response.status, await response.read()))
            if response.content_type != "application/x-ndjson":
                raise WarmFailed(f"{endpoint} answered {response.content_type}: not a LOTA node?")
            return await _follow(response, bar)


async def _follow(response: aiohttp.ClientResponse, bar: ProgressBar) -> dict[str, Any]:
    last: dict[str, Any] = {}
    try:
        async for line in response.content:
            if line.strip():
                last = _progress(line)
                bar.draw(last)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise WarmFailed(_cut_short(last, exc)) from exc
    if not last.get("final"):
        raise WarmFailed(_cut_short(last, None))
    return last


def _progress(line: bytes) -> dict[str, Any]:
    try:
        progress = json.loads(line)
    except ValueError:
        progress = None
    if not isinstance(progress, dict):
        raise WarmFailed(f"not a progress line: {line[:200]!r}")
    return progress


def _cut_short(last: dict[str, Any], exc: BaseException | None) -> str:
    why = f" ({exc or type(exc).__name__})" if exc is not None else ""
    return (
        f"the answer broke off before its summary{why}, after {summary(last)};"
        " the warm may not have finished"
    )


def _refusal(status: int, body: bytes) -> str:
    """``Code (status): Message`` from an S3 XML error, or what the answer began with."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        root = None
    if root is not None and root.tag == "Error" and root.findtext("Code"):
        return f"{root.findtext('Code')} ({status}): {root.findtext('Message') or ''}"
    return f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"


class ProgressBar:
    """The progress bar on stderr, redrawn in place; :meth:`end` ends its line. Chunks are
    counted over the whole cluster (each filled on its owner node)."""

    def __init__(self) -> None:
        self._drawn = False

    def draw(self, p: dict[str, Any]) -> None:
        total = max(p.get("bytes_listed", 0), 1)
        done = p.get("bytes_done", 0)
        width = 30
        filled = int(width * done / total)
        more = "" if p.get("listing_done") else "+"
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {p.get('objects_done', 0)}/"
            f"{p.get('objects_listed', 0)}{more} objects"
            f"  {done / 2**20:.1f}/{total / 2**20:.1f}{more} MiB"
            f"  chunks: {p.get('chunks_filled', 0)} filled, {p.get('chunks_cached', 0)} held"
        )
        sys.stderr.flush()
        self._drawn = True

    def end(self) -> None:
        if self._drawn:
            print(file=sys.stderr)
            self._drawn = False
