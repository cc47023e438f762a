"""The catalog's schema, as numbered migrations for each backend.

A migration is applied once, in order, inside one transaction that also records it in
``schema_version``; the backends serialize concurrent openers (a PostgreSQL advisory lock,
SQLite's ``BEGIN IMMEDIATE``), so two processes starting at once apply each migration
exactly once. Never edit a released migration: append a new one.

Tables (version 1):

``objects``
    One row per committed version of bucket/key (``seq``, ever increasing; for one key a
    later commit always has a greater ``seq``). ``latest`` marks the head of each key (a
    unique partial index keeps it unique); a delete is a tombstone version. Migration
    state and lease live on the version (``state``, ``lease_node``, ``lease_until``,
    ``attempts``, ``last_error``, ``retry_at``). ``retired_at`` is when the version's
    staging copy stopped being needed (superseded or migrated); ``staging_deleted`` when
    it is gone. Keys sort in UTF-8 byte order: SQLite's BINARY collation, ``COLLATE "C"``
    on PostgreSQL.
``leases``
    Named leases for singleton engines (``lifecycle``): holder node and expiry.
``object_usage``
    Last access time and storage tier per object, keyed (bucket, key) for paging.
``events``
    What other nodes should hear (invalidations, new writes), ``id`` ordered; pruned
    after a retention period.

Version 2 adds:

``uploads``
    Multipart uploads of accelerated writes in progress (ListMultipartUploads).
``swept``
    Staging copies the orphan sweep deleted, by name (``staging_key`` or ``local_path``):
    a commit that names one fails, so a sweep never takes a copy a write still needs.
``documents``
    Versioned documents every node follows (the lifecycle rules, ``lifecycle-rules``).

PostgreSQL also gets ``lota_commit(...)``, which commits a version in one round trip, and
``lota_sweep(...)``, which records orphans under the same per-name lock as commits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


_SQLITE_V1 = (
    """CREATE TABLE objects (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        latest INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'migrating', 'migrated')),
        size INTEGER NOT NULL,
        etag TEXT NOT NULL,
        content_type TEXT NOT NULL,
        metadata TEXT NOT NULL,
        checksums TEXT NOT NULL,
        headers TEXT NOT NULL,
        parts TEXT NOT NULL,
        source_region TEXT NOT NULL,
        staging_bucket TEXT NOT NULL,
        staging_key TEXT NOT NULL,
        local_path TEXT NOT NULL,
        node TEXT NOT NULL,
        created_at REAL NOT NULL,
        migrated_at REAL,
        retired_at REAL,
        staging_deleted INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT '',
        retry_at REAL NOT NULL DEFAULT 0,
        lease_node TEXT NOT NULL DEFAULT '',
        lease_until REAL NOT NULL DEFAULT 0
    )""",
    "CREATE UNIQUE INDEX objects_head ON objects (bucket, key) WHERE latest",
    "CREATE INDEX objects_versions ON objects (bucket, key, seq)",
    "CREATE INDEX objects_work ON objects (seq) WHERE state <> 'migrated'",
    "CREATE INDEX objects_retired ON objects (retired_at) WHERE retired_at IS NOT NULL",
    """CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        expires_at REAL NOT NULL
    )""",
    """CREATE TABLE object_usage (
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        last_access REAL,
        tier TEXT,
        tier_at REAL,
        PRIMARY KEY (bucket, key)
    ) WITHOUT ROWID""",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        node TEXT NOT NULL
    )""",
    "CREATE INDEX events_at ON events (at)",
)

_POSTGRES_V1 = (
    """CREATE TABLE objects (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        bucket TEXT COLLATE "C" NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        latest BOOLEAN NOT NULL,
        deleted BOOLEAN NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'migrating', 'migrated')),
        size BIGINT NOT NULL,
        etag TEXT NOT NULL,
        content_type TEXT NOT NULL,
        metadata TEXT NOT NULL,
        checksums TEXT NOT NULL,
        headers TEXT NOT NULL,
        parts TEXT NOT NULL,
        source_region TEXT NOT NULL,
        staging_bucket TEXT NOT NULL,
        staging_key TEXT NOT NULL,
        local_path TEXT NOT NULL,
        node TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        migrated_at DOUBLE PRECISION,
        retired_at DOUBLE PRECISION,
        staging_deleted BOOLEAN NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT '',
        retry_at DOUBLE PRECISION NOT NULL DEFAULT 0,
        lease_node TEXT NOT NULL DEFAULT '',
        lease_until DOUBLE PRECISION NOT NULL DEFAULT 0
    )""",
    "CREATE UNIQUE INDEX objects_head ON objects (bucket, key) WHERE latest",
    "CREATE INDEX objects_versions ON objects (bucket, key, seq)",
    "CREATE INDEX objects_work ON objects (seq) WHERE state <> 'migrated'",
    "CREATE INDEX objects_retired ON objects (retired_at) WHERE retired_at IS NOT NULL",
    """CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE object_usage (
        bucket TEXT COLLATE "C" NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        last_access DOUBLE PRECISION,
        tier TEXT,
        tier_at DOUBLE PRECISION,
        PRIMARY KEY (bucket, key)
    )""",
    """CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        seq BIGINT NOT NULL,
        node TEXT NOT NULL
    )""",
    "CREATE INDEX events_at ON events (at)",
    # One round trip per commit, however far away the database is: lock the key (so seq
    # order is commit order for it), supersede the head, insert, tell the other nodes.
    """CREATE FUNCTION lota_commit(
        p_bucket TEXT, p_key TEXT, p_latest BOOLEAN, p_deleted BOOLEAN, p_state TEXT,
        p_size BIGINT, p_etag TEXT, p_content_type TEXT, p_metadata TEXT, p_checksums TEXT,
        p_headers TEXT, p_parts TEXT, p_source_region TEXT, p_staging_bucket TEXT,
        p_staging_key TEXT, p_local_path TEXT, p_node TEXT, p_now DOUBLE PRECISION,
        p_staging_deleted BOOLEAN
    ) RETURNS BIGINT LANGUAGE plpgsql AS $$
    DECLARE
        new_seq BIGINT;
        event_id BIGINT;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext(p_bucket), hashtext(p_key));
        UPDATE objects SET latest = false, retired_at = coalesce(retired_at, p_now)
            WHERE bucket = p_bucket AND key = p_key AND latest;
        INSERT INTO objects (
            bucket, key, latest, deleted, state, size, etag, content_type, metadata,
            checksums, headers, parts, source_region, staging_bucket, staging_key, local_path,
            node, created_at, staging_deleted
        ) VALUES (
            p_bucket, p_key, p_latest, p_deleted, p_state, p_size, p_etag, p_content_type,
            p_metadata, p_checksums, p_headers, p_parts, p_source_region, p_staging_bucket,
            p_staging_key, p_local_path, p_node, p_now, p_staging_deleted
        ) RETURNING seq INTO new_seq;
        INSERT INTO events (at, kind, bucket, key, seq, node)
            VALUES (p_now, CASE WHEN p_deleted THEN 'delete' ELSE 'put' END,
                    p_bucket, p_key, new_seq, p_node)
            RETURNING id INTO event_id;
        PERFORM pg_notify('lota_catalog', event_id::TEXT);
        RETURN new_seq;
    END
    $$""",
)

_COMMON_V2 = (
    "CREATE INDEX objects_staging_key ON objects (staging_key) WHERE staging_key <> ''",
    "CREATE INDEX objects_local_path ON objects (local_path) WHERE local_path <> ''",
)
_SQLITE_V2 = (
    *_COMMON_V2,
    """CREATE TABLE uploads (
        upload_id TEXT PRIMARY KEY,
        bucket TEXT NOT NULL,
        key TEXT NOT NULL,
        node TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX uploads_keys ON uploads (bucket, key, upload_id)",
    "CREATE TABLE swept (name TEXT PRIMARY KEY, at REAL NOT NULL)",
    """CREATE TABLE documents (
        name TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        body TEXT NOT NULL,
        node TEXT NOT NULL,
        updated_at REAL NOT NULL
    )""",
)
_POSTGRES_V2 = (
    *_COMMON_V2,
    """CREATE TABLE uploads (
        upload_id TEXT COLLATE "C" PRIMARY KEY,
        bucket TEXT COLLATE "C" NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        node TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX uploads_keys ON uploads (bucket, key, upload_id)",
    "CREATE TABLE swept (name TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL)",
    """CREATE TABLE documents (
        name TEXT PRIMARY KEY,
        version BIGINT NOT NULL,
        body TEXT NOT NULL,
        node TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
    # A commit and the orphan sweep (lota_sweep) take the same lock on a staging name: the
    # sweep never deletes a copy a commit names, and a commit never names a swept copy
    # (NULL: the write fails, unacknowledged).
    """CREATE OR REPLACE FUNCTION lota_commit(
        p_bucket TEXT, p_key TEXT, p_latest BOOLEAN, p_deleted BOOLEAN, p_state TEXT,
        p_size BIGINT, p_etag TEXT, p_content_type TEXT, p_metadata TEXT, p_checksums TEXT,
        p_headers TEXT, p_parts TEXT, p_source_region TEXT, p_staging_bucket TEXT,
        p_staging_key TEXT, p_local_path TEXT, p_node TEXT, p_now DOUBLE PRECISION,
        p_staging_deleted BOOLEAN
    ) RETURNS BIGINT LANGUAGE plpgsql AS $$
    DECLARE
        new_seq BIGINT;
        event_id BIGINT;
        staged TEXT := p_staging_key || p_local_path;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext(p_bucket), hashtext(p_key));
        IF staged <> '' THEN
            PERFORM pg_advisory_xact_lock(hashtext(staged));
            IF EXISTS (SELECT 1 FROM swept WHERE name = staged) THEN
                RETURN NULL;
            END IF;
        END IF;
        UPDATE objects SET latest = false, retired_at = coalesce(retired_at, p_now)
            WHERE bucket = p_bucket AND key = p_key AND latest;
        INSERT INTO objects (
            bucket, key, latest, deleted, state, size, etag, content_type, metadata,
            checksums, headers, parts, source_region, staging_bucket, staging_key, local_path,
            node, created_at, staging_deleted
        ) VALUES (
            p_bucket, p_key, p_latest, p_deleted, p_state, p_size, p_etag, p_content_type,
            p_metadata, p_checksums, p_headers, p_parts, p_source_region, p_staging_bucket,
            p_staging_key, p_local_path, p_node, p_now, p_staging_deleted
        ) RETURNING seq INTO new_seq;
        INSERT INTO events (at, kind, bucket, key, seq, node)
            VALUES (p_now, CASE WHEN p_deleted THEN 'delete' ELSE 'put' END,
                    p_bucket, p_key, new_seq, p_node)
            RETURNING id INTO event_id;
        PERFORM pg_notify('lota_catalog', event_id::TEXT);
        RETURN new_seq;
    END
    $$""",
    """CREATE FUNCTION lota_sweep(p_names TEXT[], p_now DOUBLE PRECISION)
    RETURNS SETOF TEXT LANGUAGE plpgsql AS $$
    DECLARE
        staged TEXT;
    BEGIN
        FOREACH staged IN ARRAY (SELECT array_agg(n ORDER BY n) FROM unnest(p_names) n) LOOP
            PERFORM pg_advisory_xact_lock(hashtext(staged));
            IF NOT EXISTS (SELECT 1 FROM objects WHERE staging_key = staged)
               AND NOT EXISTS (SELECT 1 FROM objects WHERE local_path = staged) THEN
                INSERT INTO swept (name, at) VALUES (staged, p_now) ON CONFLICT DO NOTHING;
                RETURN NEXT staged;
            END IF;
        END LOOP;
    END
    $$""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "objects, leases, object_usage, events", _SQLITE_V1, _POSTGRES_V1),
    Migration(
        2,
        "uploads, swept staging copies, documents (lifecycle rules)",
        _SQLITE_V2,
        _POSTGRES_V2,
    ),
)
LATEST_VERSION = MIGRATIONS[-1].version

SQLITE_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""
POSTGRES_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
)"""
POSTGRES_CHANNEL = "lota_catalog"
"""The NOTIFY channel; the payload is only the new event's id."""
POSTGRES_MIGRATION_LOCK = 0x4C4F5441_00000001
"""The advisory lock key that serializes migrations ("LOTA" + 1)."""


def to_apply(current: int) -> tuple[Migration, ...]:
    """The migrations a database at schema `current` still needs, in order."""
    return tuple(m for m in MIGRATIONS if m.version > current)
