"""The read path's decisions (lota.cache.plan), without a node: which reads the cache
answers, when a copy is revalidated or served stale, what a miss asks for, and which
bytes and headers an answer carries. The functional tests in test_cache.py check the same
through real clients; these say which rule is which."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from lota.cache import plan
from lota.cache.plan import ColdFetch, cacheable
from lota.config import CacheConfig
from lota.s3 import conditions
from lota.s3.addressing import parse_target
from lota.s3.errors import S3Error

CS = 64 * 1024


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


# -- part numbers ---------------------------------------------------------------------------


def test_a_part_number_is_a_whole_number_from_1_to_10000() -> None:
    assert plan.part_number(parse_target("localhost", "/bkt/k", "")) is None
    assert plan.part_number(parse_target("localhost", "/bkt/k?partNumber=2", "")) == 2
    for bad in ("0", "10001", "x", "-1", ""):
        with pytest.raises(S3Error) as err:
            plan.part_number(parse_target("localhost", f"/bkt/k?partNumber={bad}", ""))
        assert err.value.code == "InvalidArgument"


# -- freshness ------------------------------------------------------------------------------

FRESHNESS = CacheConfig(
    revalidate_after=1.0,
    stale_if_error=60.0,
    immutable=("b/ckpt/",),
    revalidate=(("b/slow/", 3600.0), ("b/", 2.0)),
)


def test_immutable_prefixes_are_never_due_and_the_first_matching_override_decides() -> None:
    due = [
        plan.revalidation_due(path, 0.0, FRESHNESS, now)
        for path, now in [
            ("b/ckpt/a", 10**9),  # immutable: never
            ("b/slow/a", 2.5),  # 1h
            ("b/slow/a", 3601.0),
            ("b/fast/a", 1.5),  # b/'s 2s, not the global 1s
            ("b/fast/a", 2.5),
            ("other/a", 1.5),  # no prefix matches: the global 1s
        ]
    ]
    assert due == [False, False, True, False, True, True]


def test_a_copy_is_served_stale_within_stale_if_error_past_revalidate_after() -> None:
    assert plan.may_serve_stale(0.0, FRESHNESS, 61.0)
    assert not plan.may_serve_stale(0.0, FRESHNESS, 61.5)


# -- misses ---------------------------------------------------------------------------------


def test_a_cold_read_asks_for_the_first_chunk_it_needs_and_learns_the_size() -> None:
    """The chunks after the first are fetched in parallel as the reader goes (the answer
    says how many there are)."""

    def fetch(range_header: str, method: str = "GET", part: int | None = None) -> ColdFetch:
        return plan.cold_fetch(method, range_header, part, CS)

    assert fetch("") == ColdFetch(0, 0, whole=True)
    assert fetch("").byte_range(CS) == f"bytes=0-{CS - 1}"
    assert fetch("bytes=0-9") == ColdFetch(0, 0)
    assert fetch("bytes=0-9").byte_range(CS) == f"bytes=0-{CS - 1}"
    assert fetch(f"bytes={CS - 5}-{CS + 5}") == ColdFetch(0, 0)
    assert fetch(f"bytes={2 * CS}-") == ColdFetch(2, 2)
    assert ColdFetch(2, None).byte_range(CS) == f"bytes={2 * CS}-"
    # A suffix: one GET of enough of the tail to hold its whole chunks (no HEAD first).
    assert fetch("bytes=-7") == ColdFetch(suffix=7 + CS - 1)
    assert fetch("bytes=-7").byte_range(CS) == f"bytes=-{7 + CS - 1}"
    # S3 ignores a range it cannot read: the whole object.
    assert fetch("bytes=5-2") == fetch("bytes=0-1,3-4") == fetch("")
    # Only the metadata: a HEAD, a part (its bounds are not known yet), an empty suffix.
    assert fetch("", method="HEAD").head
    assert fetch("bytes=0-9", part=2).head
    assert fetch("bytes=-0").head


def test_a_suffix_answer_is_kept_from_its_first_whole_chunk() -> None:
    size = 10 * CS + 300
    suffix = 7 + CS - 1
    start = size - suffix
    assert plan.body_start(206, f"bytes {start}-{size - 1}/{size}") == start
    first = plan.first_whole_chunk(start, CS)
    assert first == 10 and first * CS <= size - 7  # the 7 bytes asked for are in it
    # An origin that answers 200 (the whole object) starts at 0; so does a small object.
    assert plan.body_start(200, "") == 0
    assert plan.body_start(206, "bytes 0-99/100") == 0 and plan.first_whole_chunk(0, CS) == 0
    assert plan.parse_content_range("bytes 5-9/10") == (5, 9, 10)
    assert plan.parse_content_range("") is None and plan.parse_content_range("bytes x/1") is None


# -- answers --------------------------------------------------------------------------------


def test_ranges_are_answered_like_s3() -> None:
    size = 2 * CS + 100
    assert plan.answer_range("", size) == (0, size - 1, 200)
    assert plan.answer_range("bytes=0-9", size) == (0, 9, 206)
    assert plan.answer_range(f"bytes={CS - 5}-{CS + 5}", size) == (CS - 5, CS + 5, 206)
    assert plan.answer_range("bytes=-7", size) == (size - 7, size - 1, 206)
    assert plan.answer_range(f"bytes={2 * CS}-", size) == (2 * CS, size - 1, 206)
    assert plan.answer_range(f"bytes=0-{10 * size}", size) == (0, size - 1, 206)
    assert plan.answer_range("bytes=5-2", size) == (0, size - 1, 200)
    for past in (f"bytes={size + 10}-", "bytes=-0"):
        with pytest.raises(S3Error) as err:
            plan.answer_range(past, size)
        assert (err.value.code, err.value.status) == ("InvalidRange", 416)


def test_a_range_is_sent_chunk_by_chunk() -> None:
    assert list(plan.pieces(CS - 5, 2 * CS + 4, CS)) == [(0, CS - 5, CS), (1, 0, CS), (2, 0, 5)]
    assert list(plan.pieces(3, 3, CS)) == [(0, 3, 4)]
    assert list(plan.pieces(0, -1, CS)) == []  # an empty object


OBJECT_HEADERS = (
    ("content-type", "application/x-tar"),
    ("etag", '"e"'),
    ("last-modified", "Wed, 02 Dec 2026 10:00:00 GMT"),
    ("x-amz-meta-m", "1"),
    ("x-amz-checksum-crc32", "AAAAAA=="),
    ("x-amz-checksum-type", "FULL_OBJECT"),
    ("x-amz-mp-parts-count", "2"),
)


def _headers(**given: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "status": 200,
        "checksums": False,
        "part": False,
        "overrides": [],
        "source": "HIT",
        "first": 0,
        "last": 99,
        "size": 100,
    }
    return dict(plan.response_headers(OBJECT_HEADERS, **{**args, **given}))


def test_checksums_are_sent_on_a_whole_object_asked_for_them_and_parts_count_on_parts() -> None:
    plain = _headers()
    assert plain["x-lota-cache"] == "HIT" and plain["Accept-Ranges"] == "bytes"
    assert "x-amz-checksum-crc32" not in plain and plain["x-amz-checksum-type"] == "FULL_OBJECT"
    assert "x-amz-mp-parts-count" not in plain and "Content-Range" not in plain
    assert _headers(checksums=True)["x-amz-checksum-crc32"] == "AAAAAA=="
    ranged = _headers(status=206, checksums=True, first=10, last=19)
    assert "x-amz-checksum-crc32" not in ranged
    assert ranged["Content-Range"] == "bytes 10-19/100"
    assert _headers(status=206, part=True)["x-amz-mp-parts-count"] == "2"


def test_response_overrides_replace_the_objects_own_headers() -> None:
    target = parse_target(
        "localhost", "/bkt/k?response-content-type=text/plain&response-expires=never&x=1", ""
    )
    overrides = plan.overrides(target)
    assert overrides == [("Content-Type", "text/plain"), ("Expires", "never")]
    got = plan.response_headers(
        OBJECT_HEADERS,
        status=200,
        checksums=False,
        part=False,
        overrides=overrides,
        source="MISS",
        first=0,
        last=0,
        size=1,
    )
    assert [v for n, v in got if n.lower() == "content-type"] == ["text/plain"]
    assert plan.overrides(parse_target("localhost", "/bkt/k", "")) == []


def test_a_304_carries_the_validators_only() -> None:
    assert plan.not_modified_headers(OBJECT_HEADERS, "HIT") == [
        ("etag", '"e"'),
        ("last-modified", "Wed, 02 Dec 2026 10:00:00 GMT"),
        ("x-lota-cache", "HIT"),
    ]


def test_conditions_are_checked_against_the_cached_version() -> None:
    etag, modified = '"e"', "Wed, 02 Dec 2026 10:00:00 GMT"
    conditions.check(CIMultiDict({"If-Match": etag}), etag, modified)
    with pytest.raises(conditions.NotModified):
        conditions.check(CIMultiDict({"If-None-Match": etag}), etag, modified)
    with pytest.raises(conditions.NotModified):
        conditions.check(
            CIMultiDict({"If-Modified-Since": "Thu, 03 Dec 2026 10:00:00 GMT"}), etag, modified
        )
    with pytest.raises(S3Error) as err:
        conditions.check(CIMultiDict({"If-Match": '"0123"'}), etag, modified)
    assert (err.value.code, err.value.status) == ("PreconditionFailed", 412)


# -- read-ahead -----------------------------------------------------------------------------


def test_a_reader_moving_through_an_object_gets_the_next_chunks_fetched_ahead() -> None:
    ahead = plan.Sequential(readahead=4, chunk_size=CS, memory=2)
    size = 10 * CS
    one = ("b", "k", '"e"')
    assert ahead.ahead(one, 0, CS - 1, size) == range(0)  # the first read says nothing yet
    assert ahead.ahead(one, CS, 2 * CS - 1, size) == range(2, 6)  # it follows on
    assert ahead.ahead(one, 2 * CS, 2 * CS + 9, size) == range(3, 7)  # the next chunk
    assert ahead.ahead(one, 8 * CS, 9 * CS - 1, size) == range(0)  # a jump: random access
    assert ahead.ahead(one, 9 * CS, size - 1, size) == range(0)  # at the end: nothing ahead
    assert ahead.ahead(one, 0, size - 1, size) == range(0)  # the whole object
    # Only the last `memory` versions are remembered.
    for other in (("b", "x", '"e"'), ("b", "y", '"e"')):
        ahead.ahead(other, 0, CS - 1, size)
    assert ahead.ahead(one, 0, CS - 1, size) == range(0)
