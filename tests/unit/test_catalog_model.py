"""The catalog's pure parts: key ranges, access batches, backoff, URLs, rows, event cursor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lota.catalog import PendingObject, parse_url, retry_delay
from lota.catalog.base import CatalogSettings, redact
from lota.catalog.events import MAX_GAPS, EventCursor
from lota.catalog.model import (
    INSERT_COLUMNS,
    OBJECT_COLUMNS,
    Event,
    merge_accesses,
    object_from_row,
    object_values,
    prefix_end,
)
from lota.errors import CatalogError

# Keys as S3 sees them: any characters but surrogates (not valid in UTF-8).
keys = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        ("", None),
        ("a", "b"),
        ("a/", "a0"),
        ("ä", "å"),
        ("a\U0010ffff", "b"),
        ("\U0010ffff\U0010ffff", None),
        ("x\ud7ff", "x\ue000"),
    ],
)
def test_prefix_end(prefix: str, end: str | None) -> None:
    assert prefix_end(prefix) == end


@given(key=keys, prefix=keys)
def test_prefix_range_holds_exactly_the_keys_under_the_prefix(key: str, prefix: str) -> None:
    end = prefix_end(prefix)
    in_range = prefix.encode() <= key.encode() and (end is None or key.encode() < end.encode())
    assert in_range == key.startswith(prefix)


def test_merge_accesses_keeps_the_latest_time_per_object_in_key_order() -> None:
    batch = [("b", "k2", 5.0), ("b", "k1", 3.0), ("b", "k2", 9.0), ("a", "z", 1.0), ("b", "k2", 7)]
    assert merge_accesses(batch) == [("a", "z", 1.0), ("b", "k1", 3.0), ("b", "k2", 9.0)]


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [retry_delay(n, base=2, cap=30) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert retry_delay(10_000) == 900.0


@pytest.mark.parametrize(
    ("url", "backend", "target"),
    [
        ("sqlite:////var/lib/lota/catalog.db", "sqlite", "/var/lib/lota/catalog.db"),
        ("sqlite:///catalog.db", "sqlite", "catalog.db"),
        ("postgresql://lota@db:5432/lota", "postgresql", "postgresql://lota@db:5432/lota"),
        ("postgres://lota@db/lota", "postgresql", "postgres://lota@db/lota"),
    ],
)
def test_parse_url(url: str, backend: str, target: str) -> None:
    parsed = parse_url(url)
    assert (parsed.backend, parsed.target) == (backend, target)


@pytest.mark.parametrize(
    "url", ["", "catalog.db", "sqlite://catalog.db", "sqlite:///", "mysql://db/x", "sqlite:"]
)
def test_parse_url_refuses_what_it_cannot_open(url: str) -> None:
    with pytest.raises(CatalogError):
        parse_url(url)


def test_redact_hides_the_password_only() -> None:
    assert redact("postgresql://lota:s3cret@db:5432/x") == "postgresql://lota:***@db:5432/x"
    assert redact("postgresql://lota@db/x") == "postgresql://lota@db/x"


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(CatalogError):
        CatalogSettings(poll_interval=0)
    with pytest.raises(CatalogError):
        CatalogSettings(pool_size=1)


def test_object_row_round_trip() -> None:
    obj = PendingObject(
        bucket="b",
        key="dir/ä",
        size=10,
        etag='"abc-2"',
        content_type="text/plain",
        metadata={"owner": "me"},
        checksums={"x-amz-checksum-crc32": "AAAAAA=="},
        headers=(("cache-control", "no-cache"),),
        parts=(5, 5),
        source_region="us-east",
        staging_bucket="stage",
        staging_key="s/1",
    )
    values = object_values(obj, deleted=False, node="n1", now=12.5)
    row = dict(zip(INSERT_COLUMNS.split(", "), values, strict=True))
    row |= {"seq": 7, "migrated_at": None, "attempts": 0, "last_error": "", "retry_at": 0.0}
    row |= {"lease_node": "", "lease_until": 0.0}
    assert set(row) >= set(OBJECT_COLUMNS.split(", "))
    back = object_from_row(row)
    assert back.seq == 7
    assert back.node == "n1"
    assert back.created_at == 12.5
    assert back.pending
    assert not row["staging_deleted"]
    for name in PendingObject.__dataclass_fields__:
        assert getattr(back, name) == getattr(obj, name), name


def _events(*ids: int) -> list[Event]:
    return [Event(id=i, kind="put", bucket="b", key=str(i)) for i in ids]


def test_event_cursor_delivers_late_commits_once() -> None:
    cursor = EventCursor(0, gap_timeout=10)
    assert [e.id for e in cursor.accept(_events(1, 2, 4), now=0)] == [1, 2, 4]
    assert cursor.gaps == [3]
    assert cursor.floor == 2
    # id 3 committed after 4: delivered once, and the hole is closed.
    assert [e.id for e in cursor.accept(_events(3, 4), now=1)] == [3]
    assert cursor.gaps == []
    assert cursor.floor == 4
    assert cursor.accept(_events(1, 2, 3, 4), now=2) == []


def test_event_cursor_gives_up_holes_after_the_timeout() -> None:
    cursor = EventCursor(10, gap_timeout=5)
    cursor.accept(_events(13), now=100)
    assert cursor.gaps == [11, 12]
    cursor.expire(104)
    assert cursor.gaps == [11, 12]
    cursor.expire(105)
    assert cursor.gaps == []
    assert cursor.floor == 13


def test_event_cursor_bounds_the_holes_it_remembers() -> None:
    cursor = EventCursor(0, gap_timeout=5)
    cursor.accept(_events(5 * MAX_GAPS), now=0)
    assert len(cursor.gaps) == MAX_GAPS
    assert cursor.gaps[-1] == 5 * MAX_GAPS - 1


def test_event_cursor_from_now_awaits_ids_handed_out_before_it_that_commit_later() -> None:
    cursor = EventCursor(10, gap_timeout=5)
    cursor.await_uncommitted([1, 2, 3, 5, 6, 7, 8], now=0)  # 10, the newest, not seen either
    assert cursor.gaps == [4, 9, 10]
    assert cursor.floor == 3
    assert [e.id for e in cursor.accept(_events(9, 11), now=1)] == [9, 11]
    assert [e.id for e in cursor.accept(_events(10, 11), now=2)] == [10]
    assert cursor.gaps == [4]
    cursor.expire(5)  # never committed (rolled back, or pruned): given up
    assert cursor.gaps == []


def test_event_cursor_from_now_awaits_at_most_max_gaps_ids() -> None:
    cursor = EventCursor(3 * MAX_GAPS, gap_timeout=5)
    cursor.await_uncommitted([], now=0)
    assert cursor.gaps == list(range(2 * MAX_GAPS + 1, 3 * MAX_GAPS + 1))
