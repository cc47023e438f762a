"""The embedded catalog: one SQLite file in WAL mode, safe for several processes on a machine.

All SQLite work of an instance runs on its own thread, over one connection, so the event
loop never waits for the disk. Writers take the database lock up front (``BEGIN
IMMEDIATE``), which serializes them across processes and makes read-then-write steps
(claiming work, taking a lease) atomic; a writer waits up to ``busy_timeout`` for another
process's lock. ``synchronous=FULL``: a commit that returned survives a power loss, since
commits acknowledge writes. Keys compare with SQLite's BINARY collation, which is UTF-8
byte order, S3's order. Other nodes learn of new events by polling the ``events`` table.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from lota.catalog.base import Catalog, CatalogSettings
from lota.catalog.events import Waker
from lota.catalog.model import (
    INSERT_COLUMNS,
    OBJECT_COLUMNS,
    AccessRecord,
    CatalogObject,
    Event,
    EventKind,
    PendingObject,
    PendingSummary,
    UploadRecord,
    merge_accesses,
    object_from_row,
    object_values,
    prefix_end,
)
from lota.catalog.schema import LATEST_VERSION, SQLITE_VERSION_TABLE, to_apply
from lota.clock import Clock
from lota.errors import CatalogError, CatalogUnavailable, CatalogVersionError, StagingSwept
from lota.threads import run_in_thread

log = logging.getLogger("lota.catalog")

T = TypeVar("T")

_INSERT_OBJECT = f"INSERT INTO objects ({INSERT_COLUMNS}) VALUES ({', '.join('?' * 19)})"
_SUPERSEDE = (
    "UPDATE objects SET latest = 0, retired_at = coalesce(retired_at, ?)"
    " WHERE bucket = ? AND key = ? AND latest"
)
_CLAIM = f"""
UPDATE objects
SET state = 'migrating', lease_node = :node, lease_until = :until, attempts = attempts + 1
WHERE seq IN (
    SELECT o.seq FROM objects AS o
    WHERE o.state <> 'migrated' AND o.latest
      AND ((o.state = 'pending' AND o.retry_at <= :now)
           OR (o.state = 'migrating' AND o.lease_until < :now))
      AND NOT EXISTS (
          SELECT 1 FROM objects AS p
          WHERE p.bucket = o.bucket AND p.key = o.key AND p.seq < o.seq
            AND p.state = 'migrating' AND p.lease_until >= :now)
    ORDER BY o.seq LIMIT :limit)
RETURNING {OBJECT_COLUMNS}
"""
_HELD = (
    "seq = :seq AND bucket = :bucket AND key = :key AND state = 'migrating' AND lease_node = :node"
)
_COMPLETE = f"""
UPDATE objects SET state = 'migrated', migrated_at = :now, retired_at = coalesce(retired_at, :now),
    lease_until = 0, last_error = ''
WHERE {_HELD}
"""
_FAIL = f"""
UPDATE objects SET state = 'pending', last_error = :error, retry_at = :retry_at, lease_until = 0
WHERE {_HELD}
"""
_RETIRED = """
retired_at IS NOT NULL AND retired_at <= :cutoff AND NOT staging_deleted
AND NOT (state = 'migrating' AND lease_until >= :now)
"""
_PRUNE_OBJECTS = """
DELETE FROM objects
WHERE retired_at IS NOT NULL AND retired_at <= :cutoff AND staging_deleted
  AND (NOT latest OR state = 'migrated')
  AND NOT (state = 'migrating' AND lease_until >= :now)
"""
_ACQUIRE = """
INSERT INTO leases (name, node, expires_at) VALUES (:name, :node, :until)
ON CONFLICT (name) DO UPDATE SET node = excluded.node, expires_at = excluded.expires_at
WHERE leases.node = excluded.node OR leases.expires_at < :now
RETURNING node
"""
_RECORD_ACCESS = """
INSERT INTO object_usage (bucket, key, last_access) VALUES (?, ?, ?)
ON CONFLICT (bucket, key) DO UPDATE SET last_access =
    max(coalesce(object_usage.last_access, excluded.last_access), excluded.last_access)
"""
_SET_TIER = """
INSERT INTO object_usage (bucket, key, tier, tier_at) VALUES (?, ?, ?, ?)
ON CONFLICT (bucket, key) DO UPDATE SET tier = excluded.tier, tier_at = excluded.tier_at
"""
_REQUEUE = """
UPDATE objects SET state = 'pending', retry_at = 0, retired_at = NULL, migrated_at = NULL,
    lease_until = 0, last_error = ''
WHERE seq = ? AND bucket = ? AND key = ? AND latest AND state = 'migrated' AND NOT staging_deleted
"""
_NAMED = (
    "SELECT EXISTS (SELECT 1 FROM objects WHERE staging_key = :n)"
    " OR EXISTS (SELECT 1 FROM objects WHERE local_path = :n)"
)
_UPLOAD_COLUMNS = "SELECT bucket, key, upload_id, node, created_at FROM uploads"
_UPLOADS = f"""
{_UPLOAD_COLUMNS}
WHERE bucket = ? AND (key > ? OR (key = ? AND upload_id > ?)) AND key >= ?{{end}}
ORDER BY key, upload_id LIMIT ?
"""
_EVENT_COLUMNS = "id, kind, bucket, key, seq, node, at"
_ACCESS_BATCH = 20_000


def _key_range(prefix: str, after: str) -> tuple[str, list[Any]]:
    """SQL conditions and parameters for keys under `prefix` and after `after`."""
    sql, params = " AND key > ? AND key >= ?", [after, prefix]
    if (end := prefix_end(prefix)) is not None:
        sql += " AND key < ?"
        params.append(end)
    return sql, params


def _event(row: sqlite3.Row) -> Event:
    return Event(
        id=row["id"],
        kind=row["kind"],
        bucket=row["bucket"],
        key=row["key"],
        seq=row["seq"],
        node=row["node"],
        at=row["at"],
    )


class SQLiteCatalog(Catalog):
    """The catalog in one SQLite file. Open it with :func:`lota.catalog.open_catalog`."""

    def __init__(
        self, path: str, *, url: str, clock: Clock, node: str, settings: CatalogSettings
    ) -> None:
        super().__init__(url=url, clock=clock, node=node, settings=settings)
        self.path = path
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lota-catalog")
        self._conn: sqlite3.Connection | None = None

    @classmethod
    async def open(
        cls, path: str, *, url: str, clock: Clock, node: str, settings: CatalogSettings
    ) -> SQLiteCatalog:
        catalog = cls(path, url=url, clock=clock, node=node, settings=settings)
        try:
            await catalog._run(catalog._open)
        except BaseException:
            await catalog.close()
            raise
        return catalog

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the catalog thread; translate SQLite's errors into CatalogError."""
        self._check_open()
        try:
            return await run_in_thread(fn, *args, executor=self._thread)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise CatalogUnavailable(f"catalog {self.path}: {exc}") from exc
            raise CatalogError(f"catalog {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise CatalogError(f"catalog {self.path}: {exc}") from exc

    # -- objects ------------------------------------------------------------------------

    async def commit_object(self, obj: PendingObject) -> int:
        seq = await self._run(self._commit, obj, False, self.clock.time())
        self._wake_streams()
        return seq

    async def commit_delete(self, bucket: str, key: str) -> int:
        obj = PendingObject(bucket=bucket, key=key)
        seq = await self._run(self._commit, obj, True, self.clock.time())
        self._wake_streams()
        return seq

    async def get_object(self, bucket: str, key: str) -> CatalogObject | None:
        sql = f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = ? AND key = ? AND latest"
        rows = await self._run(self._query, sql, (bucket, key))
        return object_from_row(rows[0]) if rows else None

    async def list_objects(
        self, bucket: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[CatalogObject]:
        where, params = _key_range(prefix, start_after)
        sql = (
            f"SELECT {OBJECT_COLUMNS} FROM objects WHERE latest AND bucket = ?{where}"
            " ORDER BY key LIMIT ?"
        )
        rows = await self._run(self._query, sql, (bucket, *params, limit))
        return [object_from_row(row) for row in rows]

    async def pending_keys(self, limit: int) -> list[tuple[str, str, int]]:
        sql = (
            "SELECT bucket, key, seq FROM objects INDEXED BY objects_work"
            " WHERE state <> 'migrated' AND latest LIMIT ?"
        )
        return [(r[0], r[1], int(r[2])) for r in await self._run(self._query, sql, (limit,))]

    async def pending_summary(self) -> PendingSummary:
        sql = (
            "SELECT count(*), coalesce(sum(size), 0), min(created_at),"
            " coalesce(sum(last_error <> ''), 0)"
            " FROM objects INDEXED BY objects_work WHERE state <> 'migrated' AND latest"
        )
        (count, size, oldest, failures), *_ = await self._run(self._query, sql, ())
        age = max(0.0, self.clock.time() - oldest) if oldest is not None else 0.0
        return PendingSummary(count, size, age, failures)

    # -- migration work ----------------------------------------------------------------

    async def claim_migrations(self, limit: int, lease_seconds: float) -> list[CatalogObject]:
        now = self.clock.time()
        params = {"node": self.node, "until": now + lease_seconds, "now": now, "limit": limit}
        rows = await self._run(self._write_rows, _CLAIM, params)
        return sorted((object_from_row(row) for row in rows), key=lambda o: o.seq)

    async def renew_lease(self, bucket: str, key: str, seq: int, lease_seconds: float) -> bool:
        sql = f"UPDATE objects SET lease_until = :until WHERE {_HELD}"
        until = self.clock.time() + lease_seconds
        params = {"until": until, "seq": seq, "bucket": bucket, "key": key, "node": self.node}
        return await self._run(self._write_count, sql, params) == 1

    async def complete_migration(self, bucket: str, key: str, seq: int) -> bool:
        done = await self._run(self._complete, bucket, key, seq, self.clock.time())
        if done:
            self._wake_streams()
        return done

    async def fail_migration(
        self, bucket: str, key: str, seq: int, error: str, retry_at: float
    ) -> bool:
        params = {
            "error": error,
            "retry_at": retry_at,
            "seq": seq,
            "bucket": bucket,
            "key": key,
            "node": self.node,
        }
        return await self._run(self._write_count, _FAIL, params) == 1

    async def staging_garbage(self, limit: int, grace_seconds: float) -> list[CatalogObject]:
        now = self.clock.time()
        sql = f"SELECT {OBJECT_COLUMNS} FROM objects WHERE {_RETIRED} ORDER BY retired_at LIMIT :n"
        params = {"cutoff": now - grace_seconds, "now": now, "n": limit}
        return [object_from_row(row) for row in await self._run(self._query, sql, params)]

    async def staging_deleted(self, seqs: Sequence[int]) -> None:
        sql = "UPDATE objects SET staging_deleted = 1 WHERE seq = ?"
        await self._run(self._write_many, sql, [(seq,) for seq in seqs])

    async def prune(self, *, versions_older_than: float, events_older_than: float) -> int:
        now = self.clock.time()
        return await self._run(self._prune, now, now - versions_older_than, now - events_older_than)

    async def requeue_migration(self, bucket: str, key: str, seq: int) -> bool:
        if not await self._run(self._requeue, bucket, key, seq, self.clock.time()):
            return False
        self._wake_streams()
        return True

    # -- staging copies and uploads -------------------------------------------------------

    async def sweep_orphans(self, names: Sequence[str]) -> list[str]:
        return await self._run(self._sweep, list(names), self.clock.time())

    async def record_upload(self, bucket: str, key: str, upload_id: str) -> None:
        sql = "INSERT OR REPLACE INTO uploads VALUES (?, ?, ?, ?, ?)"
        params = (upload_id, bucket, key, self.node, self.clock.time())
        await self._run(self._write_count, sql, params)

    async def get_upload(self, upload_id: str) -> UploadRecord | None:
        sql = f"{_UPLOAD_COLUMNS} WHERE upload_id = ?"
        rows = await self._run(self._query, sql, (upload_id,))
        return UploadRecord(**dict(zip(rows[0].keys(), rows[0], strict=True))) if rows else None

    async def forget_upload(self, upload_id: str) -> None:
        await self._run(self._write_count, "DELETE FROM uploads WHERE upload_id = ?", (upload_id,))

    async def list_uploads(
        self, bucket: str, prefix: str = "", after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UploadRecord]:
        end = prefix_end(prefix)
        sql = _UPLOADS.format(end="" if end is None else " AND key < ?")
        params = [bucket, after[0], after[0], after[1], prefix, *([end] if end else []), limit]
        rows = await self._run(self._query, sql, params)
        return [UploadRecord(**dict(zip(row.keys(), row, strict=True))) for row in rows]

    # -- documents ------------------------------------------------------------------------

    async def put_document(self, name: str, body: str) -> int:
        version = await self._run(self._put_document, name, body, self.clock.time())
        self._wake_streams()
        return version

    async def get_document(self, name: str) -> tuple[int, str] | None:
        sql = "SELECT version, body FROM documents WHERE name = ?"
        rows = await self._run(self._query, sql, (name,))
        return (int(rows[0]["version"]), str(rows[0]["body"])) if rows else None

    # -- named leases -------------------------------------------------------------------

    async def acquire_lease(self, name: str, seconds: float) -> bool:
        now = self.clock.time()
        params = {"name": name, "node": self.node, "until": now + seconds, "now": now}
        return bool(await self._run(self._write_rows, _ACQUIRE, params))

    async def release_lease(self, name: str) -> None:
        sql = "DELETE FROM leases WHERE name = ? AND node = ?"
        await self._run(self._write_count, sql, (name, self.node))

    async def lease_holder(self, name: str) -> tuple[str, float] | None:
        sql = "SELECT node, expires_at FROM leases WHERE name = ? AND expires_at >= ?"
        rows = await self._run(self._query, sql, (name, self.clock.time()))
        return (rows[0]["node"], rows[0]["expires_at"]) if rows else None

    # -- accesses and tiers -------------------------------------------------------------

    async def record_accesses(self, batch: Iterable[tuple[str, str, float]]) -> None:
        rows = merge_accesses(batch)
        for start in range(0, len(rows), _ACCESS_BATCH):
            await self._run(self._write_many, _RECORD_ACCESS, rows[start : start + _ACCESS_BATCH])

    async def last_access(self, bucket: str, key: str) -> float | None:
        sql = "SELECT last_access FROM object_usage WHERE bucket = ? AND key = ?"
        rows = await self._run(self._query, sql, (bucket, key))
        return rows[0]["last_access"] if rows else None

    async def list_accesses(
        self, bucket: str, prefix: str = "", after_key: str = "", limit: int = 1000
    ) -> list[AccessRecord]:
        where, params = _key_range(prefix, after_key)
        sql = (
            "SELECT bucket, key, last_access, tier, tier_at FROM object_usage"
            f" WHERE bucket = ?{where} ORDER BY key LIMIT ?"
        )
        rows = await self._run(self._query, sql, (bucket, *params, limit))
        return [AccessRecord(**dict(zip(row.keys(), row, strict=True))) for row in rows]

    async def set_tier(self, bucket: str, key: str, tier: str, at: float) -> None:
        await self._run(self._write_count, _SET_TIER, (bucket, key, tier, at))

    async def get_tier(self, bucket: str, key: str) -> tuple[str, float] | None:
        sql = "SELECT tier, tier_at FROM object_usage WHERE bucket = ? AND key = ?"
        rows = await self._run(self._query, sql, (bucket, key))
        if not rows or rows[0]["tier"] is None:
            return None
        return rows[0]["tier"], rows[0]["tier_at"]

    # -- events -------------------------------------------------------------------------

    async def publish(self, kind: str, bucket: str, key: str, seq: int = 0) -> int:
        event_id = await self._run(self._publish, kind, bucket, key, seq, self.clock.time())
        self._wake_streams()
        return event_id

    async def last_event_id(self) -> int:
        # sqlite_sequence remembers the last id even after pruning emptied the table.
        sql = "SELECT seq FROM sqlite_sequence WHERE name = 'events'"
        rows = await self._run(self._query, sql, ())
        return int(rows[0]["seq"]) if rows else 0

    async def events_after(self, after: int, limit: int) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > ? ORDER BY id LIMIT ?"
        return [_event(row) for row in await self._run(self._query, sql, (after, limit))]

    async def events_by_id(self, ids: Sequence[int]) -> list[Event]:
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events"
            " WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id"
        )
        return [_event(row) for row in await self._run(self._query, sql, (json.dumps(ids),))]

    async def _waker(self) -> Waker:
        return Waker()

    def _poll_interval(self) -> float:
        return self.settings.poll_interval

    async def _close(self) -> None:
        try:
            await run_in_thread(self._disconnect, executor=self._thread)
        finally:
            self._thread.shutdown(wait=True)

    # -- everything below runs on the catalog thread ------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise CatalogError(f"catalog {self.path} is not open")
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding the database's write lock from its start."""
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _open(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        timeout = self.settings.busy_timeout
        conn = self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = _switch_to_wal(conn, timeout)
        if mode != "wal":
            raise CatalogError(f"catalog {self.path}: SQLite cannot use WAL here ({mode})")
        conn.execute("PRAGMA synchronous = FULL")
        self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        with self._write():
            conn.execute(SQLITE_VERSION_TABLE)
            current = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
            version = int(current.fetchone()[0])
            if version > LATEST_VERSION:
                raise CatalogVersionError(
                    f"catalog {self.path} has schema version {version}; this LOTA knows up"
                    f" to {LATEST_VERSION}: upgrade LOTA"
                )
            for migration in to_apply(version):
                log.info("catalog %s: migrating to schema %d", self.path, migration.version)
                for statement in migration.sqlite:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version VALUES (?, ?, ?)",
                    (migration.version, migration.description, self.clock.time()),
                )

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _query(self, sql: str, params: Any) -> list[sqlite3.Row]:
        return self._db().execute(sql, params).fetchall()

    def _write_rows(self, sql: str, params: Any) -> list[sqlite3.Row]:
        with self._write() as conn:
            return conn.execute(sql, params).fetchall()

    def _write_count(self, sql: str, params: Any) -> int:
        with self._write() as conn:
            return conn.execute(sql, params).rowcount

    def _write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._write() as conn:
            conn.executemany(sql, rows)

    def _commit(self, obj: PendingObject, deleted: bool, now: float) -> int:
        with self._write() as conn:
            staged = obj.staging_key or obj.local_path
            if staged and conn.execute("SELECT 1 FROM swept WHERE name = ?", (staged,)).fetchall():
                raise StagingSwept(f"staging copy {staged} was swept as an orphan")
            conn.execute(_SUPERSEDE, (now, obj.bucket, obj.key))
            values = object_values(obj, deleted=deleted, node=self.node, now=now)
            seq = conn.execute(_INSERT_OBJECT, values).lastrowid
            assert seq is not None
            kind = EventKind.DELETE if deleted else EventKind.PUT
            self._insert_event(conn, kind, obj.bucket, obj.key, seq, now)
            return seq

    def _complete(self, bucket: str, key: str, seq: int, now: float) -> bool:
        params = {"now": now, "seq": seq, "bucket": bucket, "key": key, "node": self.node}
        with self._write() as conn:
            if conn.execute(_COMPLETE, params).rowcount != 1:
                return False
            self._insert_event(conn, EventKind.MIGRATED, bucket, key, seq, now)
            return True

    def _requeue(self, bucket: str, key: str, seq: int, now: float) -> bool:
        with self._write() as conn:
            if conn.execute(_REQUEUE, (seq, bucket, key)).rowcount != 1:
                return False
            self._insert_event(conn, EventKind.REQUEUED, bucket, key, seq, now)
            return True

    def _prune(self, now: float, versions_cutoff: float, events_cutoff: float) -> int:
        with self._write() as conn:
            pruned = conn.execute(_PRUNE_OBJECTS, {"cutoff": versions_cutoff, "now": now})
            events = conn.execute("DELETE FROM events WHERE at <= ?", (events_cutoff,))
            swept = conn.execute("DELETE FROM swept WHERE at <= ?", (versions_cutoff,))
            return pruned.rowcount + events.rowcount + swept.rowcount

    def _sweep(self, names: list[str], now: float) -> list[str]:
        swept = []
        with self._write() as conn:
            for name in sorted(set(names)):
                if not conn.execute(_NAMED, {"n": name}).fetchone()[0]:
                    conn.execute("INSERT OR IGNORE INTO swept VALUES (?, ?)", (name, now))
                    swept.append(name)
        return swept

    def _put_document(self, name: str, body: str, now: float) -> int:
        with self._write() as conn:
            row = conn.execute("SELECT version FROM documents WHERE name = ?", (name,)).fetchone()
            version = (int(row[0]) if row else 0) + 1
            conn.execute(
                "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?)",
                (name, version, body, self.node, now),
            )
            self._insert_event(conn, EventKind.DOCUMENT, "", name, version, now)
            return version

    def _publish(self, kind: str, bucket: str, key: str, seq: int, now: float) -> int:
        with self._write() as conn:
            return self._insert_event(conn, kind, bucket, key, seq, now)

    def _insert_event(
        self, conn: sqlite3.Connection, kind: str, bucket: str, key: str, seq: int, now: float
    ) -> int:
        sql = "INSERT INTO events (at, kind, bucket, key, seq, node) VALUES (?, ?, ?, ?, ?, ?)"
        event_id = conn.execute(sql, (now, kind, bucket, key, seq, self.node)).lastrowid
        assert event_id is not None
        return event_id


def _switch_to_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``, retried for up to `timeout` seconds: when processes
    open a new catalog at once, the switch can fail with "database is locked" straight
    away, without waiting on the busy timeout. Returns the mode now in force."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
