"""Which reads the cache may answer."""

from __future__ import annotations

from multidict import CIMultiDict

from lota.cache.reads import cacheable
from lota.s3.addressing import parse_target


def _cacheable(target: str, headers: dict[str, str] | None = None) -> bool:
    return cacheable(parse_target("localhost", target, ""), CIMultiDict(headers or {}))


def test_plain_reads_of_a_key_are_cacheable() -> None:
    assert _cacheable("/bkt/k")
    assert _cacheable("/bkt/k?X-Amz-Signature=abc&partNumber=2", {"Range": "bytes=0-9"})


def test_versions_buckets_and_customer_key_encryption_go_to_the_origin() -> None:
    assert not _cacheable("/bkt/k?versionId=3")
    assert not _cacheable("/bkt")
    for name in ("Algorithm", "Key", "Key-MD5"):
        assert not _cacheable("/bkt/k", {f"X-Amz-Server-Side-Encryption-Customer-{name}": "x"})
