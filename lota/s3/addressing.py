"""Where a request points: path-style or virtual-hosted-style, bucket and key. No I/O.

Path style is ``http://host:port/bucket/key``; virtual-hosted style is
``http://bucket.<domain>:port/key``. The key is taken from the raw request target and
percent-decoded exactly once, so keys such as ``a//b``, ``../../etc/x`` or ``%2F`` survive
unchanged; nothing here (or anywhere) turns a key into a file path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import unquote

from lota.s3.errors import S3Error

MAX_KEY_BYTES = 1024
ADMIN_PREFIX = "/_lota/"

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"\d+\.\d+\.\d+\.\d+")


def is_valid_bucket_name(name: str) -> bool:
    """S3's bucket naming rules for new buckets (3-63 chars, lowercase, no IP addresses)."""
    return len(name) <= 63 and _valid_bucket_name(name)


@lru_cache(maxsize=1024)  # every request asks, about a few names
def _valid_bucket_name(name: str) -> bool:
    return (
        _BUCKET_RE.fullmatch(name) is not None
        and ".." not in name
        and ".-" not in name
        and "-." not in name
        and not _IPV4_RE.fullmatch(name)
        and not name.startswith("xn--")
    )


@dataclass(frozen=True, slots=True)
class Target:
    """The S3 resource a request addresses; ``bucket`` and ``key`` are empty when absent."""

    bucket: str
    key: str
    virtual_host: bool
    # The path exactly as the client sent it (still percent-encoded), for signature checks.
    raw_path: str
    query: tuple[tuple[str, str], ...]
    # The query's parameter names, for quick membership tests; derived from `query`.
    names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(dict(self.query)))

    @property
    def resource(self) -> str:
        return f"/{self.bucket}/{self.key}" if self.key else f"/{self.bucket}"


def split_target(raw_target: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Split a raw request target into its raw path and decoded query pairs (order kept).

    An absolute-form target (``http://host/path``, what clients send through a proxy)
    must be accepted too (RFC 9112 section 3.2.2); its authority is the Host header's.
    """
    if raw_target.startswith(("http://", "https://")):
        rest = raw_target.split("://", 1)[1]
        slash = rest.find("/")
        raw_target = rest[slash:] if slash >= 0 else "/"
    raw_path, _, raw_query = raw_target.partition("?")
    return raw_path, parse_query(raw_query)


def parse_query(raw_query: str) -> tuple[tuple[str, str], ...]:
    """Decoded (name, value) pairs, in order, blanks kept: ``urllib.parse.parse_qsl`` with
    ``keep_blank_values``, at a third of its cost (this runs on every request)."""
    pairs = []
    for item in raw_query.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((_unquote_plus(name), _unquote_plus(value)))
    return tuple(pairs)


def _unquote_plus(text: str) -> str:
    if "%" in text or "+" in text:
        return _decoded(text) if len(text) <= _MEMO_VALUE_CHARS else _decode(text)
    return text


def _decode(text: str) -> str:
    return unquote(text.replace("+", " "))


# Encoded query values repeat from request to request (a presigned URL's credential scope
# is the same in all of a client's URLs): decoding one costs more than remembering it.
_MEMO_VALUE_CHARS = 256
_decoded = lru_cache(maxsize=4096)(_decode)


def is_admin(host: str, raw_path: str, domain: str) -> bool:
    """Whether a request is one of LOTA's own calls (``/_lota/...``). Those live on the bare
    host only: on a virtual-hosted ``BUCKET.domain`` host, ``/_lota/x`` is the key
    ``_lota/x`` of that bucket. (Path style cannot clash: ``_lota`` is no bucket name.)"""
    if not raw_path.startswith(ADMIN_PREFIX):
        return False
    hostname = _strip_port(host).lower()
    return not (domain and hostname.endswith("." + domain.lower()))


def parse_target(host: str, raw_target: str, domain: str) -> Target:
    """Find bucket and key in a request; raise an :class:`S3Error` for malformed ones."""
    if len(raw_target) <= _MEMO_CHARS:
        return _parse_target_memo(host, raw_target, domain)
    return _parse_target(host, raw_target, domain)


# Targets are immutable and a function of the request line and Host alone, and readers
# send the same ones over and over (presigned URLs, range reads of one object): parsing
# one costs more than remembering it. Bounded: 1,024 entries of at most ~4 KiB each.
_MEMO_CHARS = 2048


def _parse_target(host: str, raw_target: str, domain: str) -> Target:
    raw_path, query = split_target(raw_target)
    if not raw_path.startswith("/"):
        raise S3Error("InvalidURI", "The request target must be an absolute path.")
    try:
        path = unquote(raw_path, errors="strict")
    except UnicodeDecodeError as exc:
        raise S3Error("InvalidURI", "The key is not valid UTF-8.") from exc
    hostname = _strip_port(host).lower()
    suffix = "." + domain.lower() if domain else ""
    if suffix and hostname.endswith(suffix) and len(hostname) > len(suffix):
        bucket, key, virtual = hostname[: -len(suffix)], path[1:], True
    else:
        bucket, _, key = path[1:].partition("/")
        virtual = False
    if bucket and not is_valid_bucket_name(bucket):
        raise S3Error("InvalidBucketName", resource=bucket)
    if len(key.encode()) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", "Your key is too long.")
    if "\x00" in key:
        raise S3Error("InvalidURI", "Keys may not contain NUL.")
    return Target(bucket=bucket, key=key, virtual_host=virtual, raw_path=raw_path, query=query)


_parse_target_memo = lru_cache(maxsize=1024)(_parse_target)


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[: host.index("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
