"""HTTP plumbing shared by every path that relays bytes: header filtering, URL encoding.

No I/O here; the relaying itself lives with the paths that do it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import quote

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
