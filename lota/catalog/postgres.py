"""The cluster catalog: PostgreSQL through an asyncpg pool; every node and region uses it.

Each operation is one statement, so one round trip to a database that may be a region
away: commits go through the ``lota_commit`` function (key lock, supersede, insert, event,
NOTIFY), claims are one ``UPDATE`` over a ``FOR UPDATE SKIP LOCKED`` pick, so two nodes
never claim the same version and never wait for each other. Keys are ``COLLATE "C"``:
UTF-8 byte order, S3's order, whatever the database's default collation.

Event streams LISTEN on a connection of their own; a NOTIFY carries only the event id and
just wakes them, the ``events`` table stays the source of truth. A lost listener
connection is noticed (termination callback, or a failed ping when a poll comes round),
reopened with backoff, and the stream reads what it missed from the table meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from lota.catalog.base import Catalog, CatalogSettings
from lota.catalog.events import Waker
from lota.catalog.model import (
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
from lota.catalog.schema import (
    LATEST_VERSION,
    POSTGRES_CHANNEL,
    POSTGRES_MIGRATION_LOCK,
    POSTGRES_VERSION_TABLE,
    to_apply,
)
from lota.clock import Clock
from lota.errors import CatalogError, CatalogUnavailable, CatalogVersionError, StagingSwept

log = logging.getLogger("lota.catalog")

# Seconds a closing catalog waits for its pool's connections to be released and reset.
CLOSE_TIMEOUT = 5.0

# SQLSTATE classes worth retrying: connection exception, insufficient resources, operator
# intervention (shutdown, cannot connect now), transaction rollback (serialization, deadlock).
_TRANSIENT_CLASSES = ("08", "53", "57", "40")

_COMMIT = f"SELECT lota_commit({', '.join(f'${i}' for i in range(1, 20))})"
_EVENT = "INSERT INTO events (at, kind, bucket, key, seq, node) VALUES ($1, $2, $3, $4, $5, $6)"
_NOTIFY = f"SELECT id, pg_notify('{POSTGRES_CHANNEL}', id::TEXT) FROM ev"
_CLAIM = f"""
WITH picked AS (
    SELECT o.seq FROM objects AS o
    WHERE o.state <> 'migrated' AND o.latest
      AND ((o.state = 'pending' AND o.retry_at <= $3)
           OR (o.state = 'migrating' AND o.lease_until < $3))
      AND NOT EXISTS (
          SELECT 1 FROM objects AS p
          WHERE p.bucket = o.bucket AND p.key = o.key AND p.seq < o.seq
            AND p.state = 'migrating' AND p.lease_until >= $3)
    ORDER BY o.seq LIMIT $4
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE objects AS t
SET state = 'migrating', lease_node = $1, lease_until = $2, attempts = t.attempts + 1
FROM picked WHERE t.seq = picked.seq
RETURNING {", ".join(f"t.{c}" for c in OBJECT_COLUMNS.split(", "))}
"""
_HELD = "seq = $1 AND bucket = $2 AND key = $3 AND state = 'migrating' AND lease_node = $4"


def _publishing(update: str, kind: str) -> str:
    """`update` of one version (returning its seq, bucket and key), with an event of
    `kind` about it in the same statement, and its NOTIFY ($4: the node, $5: now)."""
    return f"""
WITH done AS (
    {update}
    RETURNING seq, bucket, key
), ev AS (
    INSERT INTO events (at, kind, bucket, key, seq, node)
    SELECT $5, '{kind}', bucket, key, seq, $4 FROM done
    RETURNING id
)
{_NOTIFY}
"""


_COMPLETE = _publishing(
    f"""UPDATE objects SET state = 'migrated', migrated_at = $5,
        retired_at = coalesce(retired_at, $5), lease_until = 0, last_error = ''
    WHERE {_HELD}""",
    EventKind.MIGRATED,
)
_FAIL = f"""
UPDATE objects SET state = 'pending', last_error = $5, retry_at = $6, lease_until = 0
WHERE {_HELD}
"""
_GARBAGE = f"""
SELECT {OBJECT_COLUMNS} FROM objects
WHERE retired_at IS NOT NULL AND retired_at <= $1 AND NOT staging_deleted
  AND NOT (state = 'migrating' AND lease_until >= $2)
ORDER BY retired_at LIMIT $3
"""
_PRUNE_OBJECTS = """
DELETE FROM objects
WHERE retired_at IS NOT NULL AND retired_at <= $1 AND staging_deleted
  AND (NOT latest OR state = 'migrated')
  AND NOT (state = 'migrating' AND lease_until >= $2)
"""
_ACQUIRE = """
INSERT INTO leases (name, node, expires_at) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET node = excluded.node, expires_at = excluded.expires_at
WHERE leases.node = excluded.node OR leases.expires_at < $4
RETURNING node
"""
_RECORD_ACCESSES = """
INSERT INTO object_usage (bucket, key, last_access)
SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::FLOAT8[])
ON CONFLICT (bucket, key) DO UPDATE
SET last_access = greatest(object_usage.last_access, excluded.last_access)
"""
_SET_TIER = """
INSERT INTO object_usage (bucket, key, tier, tier_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (bucket, key) DO UPDATE SET tier = excluded.tier, tier_at = excluded.tier_at
"""
_LAST_EVENT = """
SELECT coalesce(
    (SELECT max(id) FROM events),
    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM events_id_seq))
"""
_REQUEUE = _publishing(
    """UPDATE objects SET state = 'pending', retry_at = 0, retired_at = NULL, migrated_at = NULL,
        lease_until = 0, last_error = ''
    WHERE seq = $1 AND bucket = $2 AND key = $3 AND latest AND state = 'migrated'
      AND NOT staging_deleted""",
    EventKind.REQUEUED,
)
_UPLOAD_COLUMNS = "SELECT bucket, key, upload_id, node, created_at FROM uploads"
_UPLOADS = f"""
{_UPLOAD_COLUMNS}
WHERE bucket = $1 AND (key > $2 OR (key = $2 AND upload_id > $3)) AND key >= $4{{end}}
ORDER BY key, upload_id LIMIT $5
"""
_PUT_DOCUMENT = f"""
WITH doc AS (
    INSERT INTO documents (name, version, body, node, updated_at) VALUES ($1, 1, $2, $3, $4)
    ON CONFLICT (name) DO UPDATE SET version = documents.version + 1, body = excluded.body,
        node = excluded.node, updated_at = excluded.updated_at
    RETURNING name, version
), ev AS (
    INSERT INTO events (at, kind, bucket, key, seq, node)
    SELECT $4, '{EventKind.DOCUMENT}', '', name, version, $3 FROM doc
    RETURNING id
)
SELECT (SELECT version FROM doc), (SELECT pg_notify('{POSTGRES_CHANNEL}', id::TEXT) FROM ev)
"""
_EVENT_COLUMNS = "id, kind, bucket, key, seq, node, at"
_ACCESS_BATCH = 50_000


def _translate(exc: Exception, url: str) -> CatalogError:
    state = getattr(exc, "sqlstate", None) or ""
    transient = (
        isinstance(exc, OSError | TimeoutError | asyncpg.ConnectionDoesNotExistError)
        or state[:2] in _TRANSIENT_CLASSES
    )
    return (CatalogUnavailable if transient else CatalogError)(f"catalog {url}: {exc}")


def _key_range(prefix: str, after: str, first: int) -> tuple[str, list[Any]]:
    """SQL conditions for keys under `prefix` after `after`; parameters from ``$first``."""
    sql, params = f" AND key > ${first} AND key >= ${first + 1}", [after, prefix]
    if (end := prefix_end(prefix)) is not None:
        sql += f" AND key < ${first + 2}"
        params.append(end)
    return sql, params


def _event(row: Any) -> Event:
    return Event(**dict(row.items()))


class PostgresCatalog(Catalog):
    """The catalog in PostgreSQL. Open it with :func:`lota.catalog.open_catalog`."""

    def __init__(
        self, dsn: str, *, url: str, clock: Clock, node: str, settings: CatalogSettings
    ) -> None:
        super().__init__(url=url, clock=clock, node=node, settings=settings)
        self._dsn = dsn
        self._pool: Any = None

    @classmethod
    async def open(
        cls, dsn: str, *, url: str, clock: Clock, node: str, settings: CatalogSettings
    ) -> PostgresCatalog:
        catalog = cls(dsn, url=url, clock=clock, node=node, settings=settings)
        try:
            async with catalog._errors():
                catalog._pool = await asyncpg.create_pool(
                    dsn,
                    min_size=1,
                    max_size=settings.pool_size,
                    timeout=settings.connect_timeout,
                    command_timeout=settings.command_timeout,
                )
            await catalog._migrate()
        except BaseException:
            await catalog.close()
            raise
        return catalog

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        """Translate asyncpg's and the network's errors into CatalogError, once, here."""
        try:
            yield
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise _translate(exc, self.url) from exc

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        self._check_open()
        async with self._errors():
            return list(await self._pool.fetch(sql, *args))

    async def _fetchval(self, sql: str, *args: Any) -> Any:
        self._check_open()
        async with self._errors():
            return await self._pool.fetchval(sql, *args)

    async def _execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the number of rows it changed."""
        self._check_open()
        async with self._errors():
            status = await self._pool.execute(sql, *args)
        return int(status.rsplit(" ", 1)[-1]) if status[-1:].isdigit() else 0

    async def _migrate(self) -> None:
        async with self._errors(), self._pool.acquire() as conn, conn.transaction():
            # Concurrent openers queue here; the second finds the work done.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", POSTGRES_MIGRATION_LOCK)
            await conn.execute(POSTGRES_VERSION_TABLE)
            version = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
            if version > LATEST_VERSION:
                raise CatalogVersionError(
                    f"catalog {self.url} has schema version {version}; this LOTA knows up"
                    f" to {LATEST_VERSION}: upgrade LOTA"
                )
            for migration in to_apply(version):
                log.info("catalog %s: migrating to schema %d", self.url, migration.version)
                for statement in migration.postgres:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_version VALUES ($1, $2, $3)",
                    migration.version,
                    migration.description,
                    self.clock.time(),
                )

    # -- objects ------------------------------------------------------------------------

    async def commit_object(self, obj: PendingObject) -> int:
        return await self._commit(obj, deleted=False)

    async def commit_delete(self, bucket: str, key: str) -> int:
        return await self._commit(PendingObject(bucket=bucket, key=key), deleted=True)

    async def _commit(self, obj: PendingObject, *, deleted: bool) -> int:
        values = object_values(obj, deleted=deleted, node=self.node, now=self.clock.time())
        seq = await self._fetchval(_COMMIT, *values)
        if seq is None:
            staged = obj.staging_key or obj.local_path
            raise StagingSwept(f"staging copy {staged} was swept as an orphan")
        self._wake_streams()
        return int(seq)

    async def get_object(self, bucket: str, key: str) -> CatalogObject | None:
        sql = f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = $1 AND key = $2 AND latest"
        rows = await self._fetch(sql, bucket, key)
        return object_from_row(rows[0]) if rows else None

    async def list_objects(
        self, bucket: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[CatalogObject]:
        where, params = _key_range(prefix, start_after, 2)
        sql = (
            f"SELECT {OBJECT_COLUMNS} FROM objects WHERE latest AND bucket = $1{where}"
            f" ORDER BY key LIMIT ${len(params) + 2}"
        )
        rows = await self._fetch(sql, bucket, *params, limit)
        return [object_from_row(row) for row in rows]

    async def pending_keys(self, limit: int) -> list[tuple[str, str, int]]:
        sql = "SELECT bucket, key, seq FROM objects WHERE state <> 'migrated' AND latest LIMIT $1"
        return [(r[0], r[1], int(r[2])) for r in await self._fetch(sql, limit)]

    async def pending_summary(self) -> PendingSummary:
        sql = (
            "SELECT count(*), coalesce(sum(size), 0), min(created_at),"
            " count(*) FILTER (WHERE last_error <> '')"
            " FROM objects WHERE state <> 'migrated' AND latest"
        )
        count, size, oldest, failures = (await self._fetch(sql))[0]
        age = max(0.0, self.clock.time() - oldest) if oldest is not None else 0.0
        return PendingSummary(count, int(size), age, failures)

    # -- migration work ----------------------------------------------------------------

    async def claim_migrations(self, limit: int, lease_seconds: float) -> list[CatalogObject]:
        now = self.clock.time()
        rows = await self._fetch(_CLAIM, self.node, now + lease_seconds, now, limit)
        return sorted((object_from_row(row) for row in rows), key=lambda o: o.seq)

    async def renew_lease(self, bucket: str, key: str, seq: int, lease_seconds: float) -> bool:
        sql = f"UPDATE objects SET lease_until = $5 WHERE {_HELD}"
        until = self.clock.time() + lease_seconds
        return await self._execute(sql, seq, bucket, key, self.node, until) == 1

    async def complete_migration(self, bucket: str, key: str, seq: int) -> bool:
        rows = await self._fetch(_COMPLETE, seq, bucket, key, self.node, self.clock.time())
        if rows:
            self._wake_streams()
        return bool(rows)

    async def fail_migration(
        self, bucket: str, key: str, seq: int, error: str, retry_at: float
    ) -> bool:
        return await self._execute(_FAIL, seq, bucket, key, self.node, error, retry_at) == 1

    async def staging_garbage(self, limit: int, grace_seconds: float) -> list[CatalogObject]:
        now = self.clock.time()
        rows = await self._fetch(_GARBAGE, now - grace_seconds, now, limit)
        return [object_from_row(row) for row in rows]

    async def staging_deleted(self, seqs: Sequence[int]) -> None:
        sql = "UPDATE objects SET staging_deleted = true WHERE seq = ANY($1::BIGINT[])"
        await self._execute(sql, list(seqs))

    async def prune(self, *, versions_older_than: float, events_older_than: float) -> int:
        now = self.clock.time()
        objects = await self._execute(_PRUNE_OBJECTS, now - versions_older_than, now)
        events = await self._execute("DELETE FROM events WHERE at <= $1", now - events_older_than)
        swept = await self._execute("DELETE FROM swept WHERE at <= $1", now - versions_older_than)
        return objects + events + swept

    async def requeue_migration(self, bucket: str, key: str, seq: int) -> bool:
        rows = await self._fetch(_REQUEUE, seq, bucket, key, self.node, self.clock.time())
        if rows:
            self._wake_streams()
        return bool(rows)

    # -- staging copies and uploads -------------------------------------------------------

    async def sweep_orphans(self, names: Sequence[str]) -> list[str]:
        if not names:
            return []
        sql = "SELECT lota_sweep($1::TEXT[], $2)"
        return [row[0] for row in await self._fetch(sql, list(names), self.clock.time())]

    async def record_upload(self, bucket: str, key: str, upload_id: str) -> None:
        sql = "INSERT INTO uploads VALUES ($1, $2, $3, $4, $5) ON CONFLICT (upload_id) DO NOTHING"
        await self._execute(sql, upload_id, bucket, key, self.node, self.clock.time())

    async def get_upload(self, upload_id: str) -> UploadRecord | None:
        rows = await self._fetch(f"{_UPLOAD_COLUMNS} WHERE upload_id = $1", upload_id)
        return UploadRecord(**dict(rows[0].items())) if rows else None

    async def forget_upload(self, upload_id: str) -> None:
        await self._execute("DELETE FROM uploads WHERE upload_id = $1", upload_id)

    async def list_uploads(
        self, bucket: str, prefix: str = "", after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UploadRecord]:
        end = prefix_end(prefix)
        sql = _UPLOADS.format(end="" if end is None else " AND key < $6")
        args = [bucket, after[0], after[1], prefix, limit, *([end] if end else [])]
        return [UploadRecord(**dict(row.items())) for row in await self._fetch(sql, *args)]

    # -- documents ------------------------------------------------------------------------

    async def put_document(self, name: str, body: str) -> int:
        rows = await self._fetch(_PUT_DOCUMENT, name, body, self.node, self.clock.time())
        self._wake_streams()
        return int(rows[0][0])

    async def get_document(self, name: str) -> tuple[int, str] | None:
        sql = "SELECT version, body FROM documents WHERE name = $1"
        rows = await self._fetch(sql, name)
        return (int(rows[0]["version"]), str(rows[0]["body"])) if rows else None

    # -- named leases -------------------------------------------------------------------

    async def acquire_lease(self, name: str, seconds: float) -> bool:
        now = self.clock.time()
        return bool(await self._fetch(_ACQUIRE, name, self.node, now + seconds, now))

    async def release_lease(self, name: str) -> None:
        await self._execute("DELETE FROM leases WHERE name = $1 AND node = $2", name, self.node)

    async def lease_holder(self, name: str) -> tuple[str, float] | None:
        sql = "SELECT node, expires_at FROM leases WHERE name = $1 AND expires_at >= $2"
        rows = await self._fetch(sql, name, self.clock.time())
        return (rows[0]["node"], rows[0]["expires_at"]) if rows else None

    # -- accesses and tiers -------------------------------------------------------------

    async def record_accesses(self, batch: Iterable[tuple[str, str, float]]) -> None:
        rows = merge_accesses(batch)
        for start in range(0, len(rows), _ACCESS_BATCH):
            buckets, keys, times = zip(*rows[start : start + _ACCESS_BATCH], strict=True)
            await self._execute(_RECORD_ACCESSES, list(buckets), list(keys), list(times))

    async def last_access(self, bucket: str, key: str) -> float | None:
        sql = "SELECT last_access FROM object_usage WHERE bucket = $1 AND key = $2"
        value: float | None = await self._fetchval(sql, bucket, key)
        return value

    async def list_accesses(
        self, bucket: str, prefix: str = "", after_key: str = "", limit: int = 1000
    ) -> list[AccessRecord]:
        where, params = _key_range(prefix, after_key, 2)
        sql = (
            "SELECT bucket, key, last_access, tier, tier_at FROM object_usage"
            f" WHERE bucket = $1{where} ORDER BY key LIMIT ${len(params) + 2}"
        )
        rows = await self._fetch(sql, bucket, *params, limit)
        return [AccessRecord(**dict(row.items())) for row in rows]

    async def set_tier(self, bucket: str, key: str, tier: str, at: float) -> None:
        await self._execute(_SET_TIER, bucket, key, tier, at)

    async def get_tier(self, bucket: str, key: str) -> tuple[str, float] | None:
        sql = "SELECT tier, tier_at FROM object_usage WHERE bucket = $1 AND key = $2"
        rows = await self._fetch(sql, bucket, key)
        if not rows or rows[0]["tier"] is None:
            return None
        return rows[0]["tier"], rows[0]["tier_at"]

    # -- events -------------------------------------------------------------------------

    async def publish(self, kind: str, bucket: str, key: str, seq: int = 0) -> int:
        sql = f"WITH ev AS ({_EVENT} RETURNING id) {_NOTIFY}"
        rows = await self._fetch(sql, self.clock.time(), kind, bucket, key, seq, self.node)
        self._wake_streams()
        return int(rows[0]["id"])

    async def last_event_id(self) -> int:
        return int(await self._fetchval(_LAST_EVENT))

    async def events_after(self, after: int, limit: int) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id > $1 ORDER BY id LIMIT $2"
        return [_event(row) for row in await self._fetch(sql, after, limit)]

    async def events_by_id(self, ids: Sequence[int]) -> list[Event]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = ANY($1::BIGINT[]) ORDER BY id"
        return [_event(row) for row in await self._fetch(sql, list(ids))]

    async def _waker(self) -> Waker:
        self._check_open()
        waker = _NotifyWaker(self)
        await waker.listen()
        return waker

    def _poll_interval(self) -> float:
        return self.settings.listen_poll_interval

    async def _listener(self) -> Any:
        """A connection of its own, listening on the catalog's channel."""
        async with self._errors():
            return await asyncpg.connect(self._dsn, timeout=self.settings.connect_timeout)

    async def _close(self) -> None:
        """Close the pool gracefully (each connection released and reset) for at most
        :data:`CLOSE_TIMEOUT`, then cut what is left: a node stops within its drain time
        and a few seconds, not the minute a command may take (an orchestrator kills it
        sooner). By now its requests are drained and its tasks have stopped (their last
        writes flushed): a connection still held is stuck."""
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(
                    pool.close(), min(CLOSE_TIMEOUT, self.settings.command_timeout)
                )
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
                log.warning("catalog %s: closing: %s", self.url, str(exc) or "timed out")
                pool.terminate()


class _NotifyWaker(Waker):
    """Wakes a stream on NOTIFY; keeps its listening connection alive, reopening it."""

    def __init__(self, catalog: PostgresCatalog) -> None:
        super().__init__()
        self._catalog = catalog
        self._conn: Any = None
        self._retry_at = 0.0
        self._backoff = 0.5
        self._reopening = False

    async def listen(self) -> None:
        """Open the listening connection; on failure, log it and try again later."""
        try:
            conn = await self._catalog._listener()
            try:
                async with self._catalog._errors():
                    await conn.add_listener(POSTGRES_CHANNEL, self._notified)
            except BaseException:
                conn.terminate()
                raise
        except CatalogError as exc:
            log.warning("catalog events: cannot listen: %s", exc)
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 30.0)
            self._reopening = True
            return
        if self.closed:  # closed while connecting
            conn.terminate()
            return
        conn.add_termination_listener(self._lost)
        if self._reopening:
            log.info("catalog events: listening again")
        self._conn, self._backoff, self._reopening = conn, 0.5, False
        self.wake()  # read what was committed while nobody listened

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.wake()

    def _lost(self, conn: Any) -> None:
        if conn is self._conn and not self.closed:
            log.warning("catalog events: listening connection lost")
            self._conn, self._reopening = None, True
            self.wake()

    async def wait(self, seconds: float) -> bool:
        if self._conn is None and not self.closed and time.monotonic() >= self._retry_at:
            await self.listen()
        if self._conn is None:
            seconds = min(seconds, self._backoff)
        woken = await super().wait(seconds)
        if not woken and self._conn is not None and not self.closed:
            await self._ping(self._conn)
        return woken

    async def _ping(self, conn: Any) -> None:
        """A connection that silently died delivers no NOTIFY: check it when a poll is due."""
        try:
            await conn.execute("SELECT 1", timeout=self._catalog.settings.connect_timeout)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            if conn is self._conn and not self.closed:
                log.warning("catalog events: listening connection broken: %s", exc)
                self._conn, self._reopening = None, True
            conn.terminate()

    async def close(self) -> None:
        await super().close()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=5)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                conn.terminate()
