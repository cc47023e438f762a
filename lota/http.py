"""HTTP plumbing shared by every path that relays bytes: header filtering, URL encoding,
and the response writer that keeps count of what each client was sent.

No I/O here; the relaying itself lives with the paths that do it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import quote

from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from lota.cache.plan import CACHE_HEADER
from lota.s3.ranges import parse_range

# RFC 9110 section 7.6.1 hop-by-hop headers, plus the ones the relay sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "expect",
        "content-length",
    }
)
# What the client used to authenticate to LOTA; LOTA signs its own origin requests.
CLIENT_AUTH = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "x-amz-decoded-content-length",
        "x-amz-trailer",
    }
)
PRESIGN_QUERY = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
        # SigV2 query authentication
        "AWSAccessKeyId",
        "Signature",
        "Expires",
    }
)


def uri_encode(text: str, *, keep_slash: bool) -> str:
    """Percent-encode all but RFC 3986 unreserved characters, as SigV4 requires."""
    return quote(text, safe="-_.~/" if keep_slash else "-_.~")


def encode_query(pairs: Iterable[tuple[str, str]]) -> str:
    return "&".join(
        f"{uri_encode(k, keep_slash=False)}={uri_encode(v, keep_slash=False)}" for k, v in pairs
    )


def forwardable_request_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers that travel on to the origin (repeated headers are joined)."""
    out: dict[str, str] = {}
    for name, raw in headers.items():
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in CLIENT_AUTH:
            continue
        if lname == "range" and parse_range(raw) is None:
            continue  # S3 ignores what it cannot read; an origin might not
        value = raw
        if lname == "content-encoding":
            value = ",".join(v for v in (p.strip() for p in raw.split(",")) if v != "aws-chunked")
            if not value:
                continue
        out[lname] = f"{out[lname]},{value}" if lname in out else value
    return out


def forwardable_response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The origin's response headers that travel on to the client, repeated ones kept."""
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP or name.lower() == "content-length"
    ]


class BodyWriter(StreamWriter):
    """aiohttp's response writer, keeping count of what the client is sent: the status and
    ``x-lota-cache`` header of the response, and its body bytes as handed to the socket
    (without the header section, chunked framing or an interim ``100 Continue``).

    The server gives each request one (:class:`lota.node.listener.S3Server`) and reads it when
    the response is over; body bytes sent around it are added with :func:`sent_beside`.
    """

    status = 0  # until the response's headers are written
    cache = ""
    body_size = 0
    interim = 0  # bytes of interim responses (100 Continue) sent before the headers

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        self.status = int(status_line.split(" ", 2)[1])
        self.cache = headers.get(CACHE_HEADER, "")
        await super().write_headers(status_line, headers)

    async def write(
        self,
        chunk: bytes | bytearray | memoryview[int] | memoryview[bytes],
        *,
        drain: bool = True,
        LIMIT: int = 0x10000,
    ) -> None:
        if self.status:
            # aiohttp drops what would go past the declared Content-Length.
            size = len(chunk)
            self.body_size += size if self.length is None else min(size, self.length)
        else:
            self.interim += len(chunk)
        await super().write(chunk, drain=drain, LIMIT=LIMIT)

    async def write_eof(self, chunk: bytes = b"") -> None:
        self.body_size += len(chunk)
        await super().write_eof(chunk)


def sent_beside(writer: AbstractStreamWriter, count: int) -> None:
    """Account for `count` body bytes sent on the socket itself (``sendfile``), not through
    `writer`, as if they had been."""
    writer.output_size += count
    if isinstance(writer, BodyWriter):
        writer.body_size += count
