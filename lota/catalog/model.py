"""What the catalog stores, as plain data, and the pure rules both backends share.

Nothing here does I/O: the backends turn rows into these records with :func:`object_from_row`
and into rows with :func:`object_values`, and the key arithmetic (:func:`prefix_end`) and
batch shaping (:func:`merge_accesses`) are tested without a database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

State = Literal["pending", "migrating", "migrated"]
"""Where a version stands in migration: ``pending`` (waiting, or waiting to retry),
``migrating`` (a node holds its lease), ``migrated`` (the home region has it)."""

STATES: tuple[State, ...] = ("pending", "migrating", "migrated")


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingObject:
    """A write accepted through write acceleration, as its writer commits it.

    The data is either in the source region's staging bucket (``source_region``,
    ``staging_bucket``, ``staging_key``) or, in single-node local-disk mode, at
    ``local_path`` on the writing node.
    """

    bucket: str
    key: str
    size: int = 0
    etag: str = ""
    content_type: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    """User metadata, without the ``x-amz-meta-`` prefix."""
    checksums: dict[str, str] = field(default_factory=dict)
    """``x-amz-checksum-*`` header -> value, as the client sent or S3 would compute."""
    headers: tuple[tuple[str, str], ...] = ()
    """Other response headers to replay (Cache-Control, Content-Encoding, ...)."""
    parts: tuple[int, ...] = ()
    """Multipart part sizes, in order; empty for a single PUT."""
    source_region: str = ""
    staging_bucket: str = ""
    staging_key: str = ""
    local_path: str = ""

    @property
    def has_staging(self) -> bool:
        """Whether a staging copy exists that must be deleted once it is no longer needed."""
        return bool(self.staging_key or self.local_path)


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogObject(PendingObject):
    """One committed version of bucket/key, as the catalog knows it.

    ``seq`` orders every version of every key: for one key, a later commit always has a
    greater ``seq``, and the greatest is the truth (``latest``). A delete is a version too,
    a tombstone (``deleted``), so that readers answer 404 and the delete itself migrates.
    """

    seq: int
    latest: bool = True
    deleted: bool = False
    state: State = "pending"
    node: str = ""
    """The node that committed this version."""
    created_at: float = 0.0
    migrated_at: float | None = None
    attempts: int = 0
    """Claims so far (a node that died mid-copy counts too)."""
    last_error: str = ""
    retry_at: float = 0.0
    lease_node: str = ""
    lease_until: float = 0.0

    @property
    def pending(self) -> bool:
        """Not yet in its home region: readers must use the catalog's copy."""
        return self.state != "migrated"


class PendingSummary(NamedTuple):
    """What ``lota migrations`` shows: latest versions not yet in their home region."""

    objects: int
    bytes: int
    oldest_age: float
    """Seconds since the oldest of them was committed (0 when there are none)."""
    failures: int
    """How many of them failed their last attempt."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessRecord:
    """Last access and storage tier of one object (lifecycle's view of it)."""

    bucket: str
    key: str
    last_access: float | None = None
    tier: str | None = None
    tier_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadRecord:
    """A multipart upload of an accelerated write, in progress."""

    bucket: str
    key: str
    upload_id: str
    node: str = ""
    created_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Something other nodes should hear about. ``id`` orders events; ``seq`` is the object
    version it concerns (0 when none)."""

    id: int
    kind: str
    bucket: str
    key: str
    seq: int = 0
    node: str = ""
    at: float = 0.0


class EventKind:
    """Kinds the catalog publishes by itself; callers may publish others (``invalidate``)."""

    PUT = "put"
    DELETE = "delete"
    MIGRATED = "migrated"
    REQUEUED = "requeued"
    """A migrated version (``seq``) is pending again (it goes home once more)."""
    INVALIDATE = "invalidate"
    DOCUMENT = "document"
    """A document (``key``: its name) has a new version; ``seq`` is that version."""


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (None: no bound).

    Keys starting with `prefix` are exactly those in ``[prefix, prefix_end(prefix))`` in
    code-point order, which is UTF-8 byte order, which is S3's key order; so a prefix
    listing is an index range scan in both backends.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= 0x10FFFF:
            if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters: skip them
                code = 0xE000
            return "".join(chars) + chr(code)
    return None


def merge_accesses(batch: Iterable[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """One row per object with its latest time, in (bucket, key) order.

    One upsert statement must not touch a row twice (PostgreSQL refuses), and writers that
    lock rows in the same order cannot deadlock each other.
    """
    latest: dict[tuple[str, str], float] = {}
    for bucket, key, at in batch:
        if latest.get((bucket, key), float("-inf")) < at:
            latest[bucket, key] = at
    return [(bucket, key, at) for (bucket, key), at in sorted(latest.items())]


def retry_delay(attempts: int, *, base: float = 1.0, cap: float = 900.0) -> float:
    """Exponential backoff for the `attempts`-th failure: base, 2x base, 4x base ... cap."""
    return float(min(cap, base * 2 ** max(0, min(attempts - 1, 60))))


# Row mapping. Both backends store the same columns; JSON columns are TEXT.

OBJECT_COLUMNS = (
    "seq, bucket, key, latest, deleted, state, size, etag, content_type, metadata, "
    "checksums, headers, parts, source_region, staging_bucket, staging_key, local_path, "
    "node, created_at, migrated_at, attempts, last_error, retry_at, lease_node, lease_until"
)
INSERT_COLUMNS = (
    "bucket, key, latest, deleted, state, size, etag, content_type, metadata, checksums, "
    "headers, parts, source_region, staging_bucket, staging_key, local_path, node, "
    "created_at, staging_deleted"
)


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def object_values(obj: PendingObject, *, deleted: bool, node: str, now: float) -> tuple[Any, ...]:
    """The values of INSERT_COLUMNS for a new latest version of `obj`."""
    return (
        obj.bucket,
        obj.key,
        True,
        deleted,
        "pending",
        obj.size,
        obj.etag,
        obj.content_type,
        _json(obj.metadata),
        _json(obj.checksums),
        _json([list(pair) for pair in obj.headers]),
        _json(list(obj.parts)),
        obj.source_region,
        obj.staging_bucket,
        obj.staging_key,
        obj.local_path,
        node,
        now,
        not obj.has_staging,
    )


class Row(Protocol):
    """A database row read by column name (sqlite3.Row, asyncpg.Record)."""

    def __getitem__(self, name: str, /) -> Any: ...


def object_from_row(row: Row) -> CatalogObject:
    """A :class:`CatalogObject` from a row of OBJECT_COLUMNS (sqlite3.Row or asyncpg.Record)."""
    state = row["state"]
    if state not in STATES:
        raise ValueError(f"unknown object state {state!r}")
    return CatalogObject(
        seq=row["seq"],
        bucket=row["bucket"],
        key=row["key"],
        latest=bool(row["latest"]),
        deleted=bool(row["deleted"]),
        state=state,
        size=row["size"],
        etag=row["etag"],
        content_type=row["content_type"],
        metadata=json.loads(row["metadata"]),
        checksums=json.loads(row["checksums"]),
        headers=tuple((str(k), str(v)) for k, v in json.loads(row["headers"])),
        parts=tuple(int(size) for size in json.loads(row["parts"])),
        source_region=row["source_region"],
        staging_bucket=row["staging_bucket"],
        staging_key=row["staging_key"],
        local_path=row["local_path"],
        node=row["node"],
        created_at=row["created_at"],
        migrated_at=row["migrated_at"],
        attempts=row["attempts"],
        last_error=row["last_error"],
        retry_at=row["retry_at"],
        lease_node=row["lease_node"],
        lease_until=row["lease_until"],
    )
