"""Client side of LOTA's admin calls (``/_lota/…``), used by the ``lota`` command.

Admin calls are SigV4-signed with the caller's ordinary S3 credentials
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) and authorized by the node like
S3 requests: warming a prefix needs ``s3:GetObject`` on it.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime

import aiohttp
from yarl import URL

from lota.auth.sigv4 import sign_headers
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


async def warm(endpoint: str, bucket: str, prefix: str, concurrency: int) -> int:
    """Ask the node to warm the prefix; draw its progress; return an exit status."""
    query = encode_query(
        [("bucket", bucket), ("concurrency", str(concurrency)), ("prefix", prefix)]
    )
    url = f"{endpoint.rstrip('/')}/_lota/warm?{query}"
    last: dict[str, int] = {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=600)) as session,
        session.post(URL(url, encoded=True), headers=signed("POST", url)) as response,
    ):
        if response.status != 200:
            print(f"lota warm: {response.status} {(await response.text())[:500]}", file=sys.stderr)
            return 1
        async for line in response.content:
            if line.strip():
                last = json.loads(line)
                _draw(last)
    print(file=sys.stderr)
    print(
        f"warmed {last.get('objects_done', 0)} objects,"
        f" {last.get('bytes_done', 0) / 2**20:.1f} MiB;"
        f" {last.get('failed', 0)} failed"
    )
    return 1 if last.get("failed") else 0


def _draw(p: dict[str, int]) -> None:
    total = max(p.get("bytes_listed", 0), 1)
    done = p.get("bytes_done", 0)
    width = 30
    filled = int(width * done / total)
    more = "" if p.get("listing_done") else "+"
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {p.get('objects_done', 0)}/"
        f"{p.get('objects_listed', 0)}{more} objects"
        f"  {done / 2**20:.1f}/{total / 2**20:.1f}{more} MiB"
    )
    sys.stderr.flush()
