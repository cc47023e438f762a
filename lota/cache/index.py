"""The chunk store's persistent index: SQLite in WAL mode, on one dedicated thread.

The store keeps the whole index in memory and is its only reader; SQLite is the journal
that lets the cache survive a restart. So the index is written, never queried, while the
store runs: changes are queued on the event loop and committed by a background task in
batches (every ``batch_delay`` seconds, or at once past ``batch_ops`` changes), one
transaction each, on the index thread.

Crash safety rests on one ordering rule kept by the store: a chunk row is queued only
after its file has been renamed to its final name. A crash can lose the last batch; that
leaves files without rows (orphans, swept after the restart), never rows without complete
files. ``synchronous=NORMAL`` keeps that true after a power loss too: WAL mode may then
lose the last commits, but not consistency.

Tables: ``objects`` (one row per cached object: identity, size, headers to replay, parts
layout), ``chunks`` (object stem, index, directory number, length, xxh3-64 digest; rowid
order is fill order, which the store replays into its eviction queues) and ``meta``
(schema version, chunk size, directory list, and the catalog event position: committed
after the changes its events made, and no longer once a commit's changes were lost, so a
restart replays from it whatever this cache may not have applied). Whether a chunk is
pinned is not stored: it follows from the configured pinned prefixes, so changing them
takes effect at restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby
from typing import Any, TypeVar

from lota.threads import outlast, submit

log = logging.getLogger("lota.cache")

T = TypeVar("T")

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS objects (
    stem TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    etag TEXT NOT NULL,
    version_id TEXT NOT NULL,
    size INTEGER NOT NULL,
    last_modified TEXT NOT NULL,
    headers TEXT NOT NULL,
    validated_at REAL NOT NULL,
    parts TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    stem TEXT NOT NULL,
    idx INTEGER NOT NULL,
    dir INTEGER NOT NULL,
    length INTEGER NOT NULL,
    digest INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_object ON chunks (stem, idx);
"""
_PUT_OBJECT = "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_DELETE_OBJECT = "DELETE FROM objects WHERE stem = ?"
_DELETE_OBJECT_CHUNKS = "DELETE FROM chunks WHERE stem = ?"
_PUT_CHUNK = "INSERT OR REPLACE INTO chunks (stem, idx, dir, length, digest) VALUES (?, ?, ?, ?, ?)"
_DELETE_CHUNK = "DELETE FROM chunks WHERE stem = ? AND idx = ?"
_DELETES = frozenset({_DELETE_OBJECT, _DELETE_OBJECT_CHUNKS, _DELETE_CHUNK})
_PUT_META = "INSERT OR REPLACE INTO meta VALUES (?, ?)"
EVENT_POSITION = "event_position"

ObjectRow = tuple[str, str, str, str, str, int, str, str, float, str]
ChunkRow = tuple[str, int, int, int, int]
_Op = tuple[str, tuple[Any, ...]]


class Index:
    """Owns the SQLite connection, its thread, and the queue of changes not yet committed."""

    def __init__(
        self,
        path: str,
        *,
        chunk_size: int,
        dirs: Sequence[str],
        wal_limit: int = 8 * 1024**2,
        batch_delay: float = 0.05,
        batch_ops: int = 1000,
        retry_delay: float = 1.0,
    ) -> None:
        self.path = path
        self._chunk_size = chunk_size
        self._dirs = [os.path.realpath(d) for d in dirs]
        self._wal_limit = wal_limit
        self._batch_delay = batch_delay
        self._batch_ops = batch_ops
        self._keep_limit = 20 * batch_ops
        self._retry_delay = retry_delay
        self._flushing = asyncio.Lock()
        self._refused = False
        self._position: int | None = None  # to save with the next commit
        self._changes_lost = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lota-cache-index")
        self._conn: sqlite3.Connection | None = None
        self._ops: list[_Op] = []
        self._queued = asyncio.Event()
        self._full = asyncio.Event()
        self.bytes = 0
        """Bytes of the index, its WAL and shared-memory file, as of the last commit."""
        self.event_position: int | None = None
        """The catalog event position saved with the cache at open (None: none saved):
        every event up to it had been applied to what the index held."""
        self.errors = 0

    @property
    def pending(self) -> int:
        return len(self._ops)

    async def open(self) -> None:
        """Open (or create, or recreate if unreadable) the index; measure it."""
        self.bytes = await outlast(self._call(self._open))

    def object_rows(self, batch: int = 20_000) -> AsyncIterator[list[ObjectRow]]:
        """The object rows, a batch at a time. Start-up only, before anything is queued."""
        return self._rows("SELECT * FROM objects", batch)

    def chunk_rows(self, batch: int = 50_000) -> AsyncIterator[list[ChunkRow]]:
        """The chunk rows in fill order, digests as stored (signed), a batch at a time.
        Start-up only, before anything is queued."""
        sql = "SELECT stem, idx, dir, length, digest FROM chunks ORDER BY rowid"
        return self._rows(sql, batch)

    async def _rows(self, sql: str, batch: int) -> AsyncIterator[list[Any]]:
        """Rows of `sql` in batches; the next batch is read while the caller works on this
        one, and a large index never sits in memory twice."""
        cursor = await outlast(self._call(self._connection().execute, sql))
        pending = self._call(cursor.fetchmany, batch)
        try:
            while rows := await outlast(pending):
                pending = self._call(cursor.fetchmany, batch)
                yield rows
        finally:
            await asyncio.gather(pending, return_exceptions=True)
            await outlast(self._call(cursor.close))

    def put_object(self, row: ObjectRow) -> None:
        self._queue(_PUT_OBJECT, row)

    def delete_object(self, stem: str) -> None:
        self._queue(_DELETE_OBJECT_CHUNKS, (stem,))
        self._queue(_DELETE_OBJECT, (stem,))

    def put_chunk(self, stem: str, index: int, dir_no: int, length: int, digest: int) -> None:
        signed = digest - (1 << 64) if digest >= 1 << 63 else digest
        self._queue(_PUT_CHUNK, (stem, index, dir_no, length, signed))

    def delete_chunk(self, stem: str, index: int) -> None:
        self._queue(_DELETE_CHUNK, (stem, index))

    def save_event_position(self, position: int) -> None:
        """Save the catalog event position with the next commit, after the changes queued
        so far (those its events made): a restart resumes the events from there, so writes
        made elsewhere while it was down still drop their cached copies here. Once changes
        were lost, no later position is saved: the last one saved is older than they are,
        and replaying from it makes up for them."""
        if not self._changes_lost:
            self._position = position
            self._queued.set()

    def _lost(self) -> None:
        """Changes were lost (a deletion among them would bring a row back at the next
        start): keep the position saved before them."""
        if not self._changes_lost:
            log.warning("cache index: changes lost; its event position stays where it was")
        self._changes_lost = True
        self._position = None
        self._ops = [op for op in self._ops if op[0] != _PUT_META]

    async def run(self) -> None:
        """Commit queued changes in batches until cancelled (the store's task owns this)."""
        while True:
            await self._queued.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._batch_delay)
            try:
                committed = await self.flush()
            except Exception:  # keep committing later batches whatever happened to this one
                self.errors += 1
                log.exception("cache index commit failed")
                committed = False
            if not committed:
                await asyncio.sleep(self._retry_delay)

    async def flush(self) -> bool:
        """Commit everything queued so far, after any commit in progress; False if that
        failed. Changes the disk would not take (full, or failing to write) go back to the
        front of the queue, to be tried again once eviction has made room; past the
        queue's bound, the new rows among them are dropped (their files become orphans
        to sweep) and the deletions kept (a lost one would bring a row back at the next
        start). Other failures lose the changes, counted in :attr:`errors`. Cancelling
        the caller does not cancel the commit (the changes are off the queue): the caller
        waits for it to end."""
        async with self._flushing:  # one commit at a time: changes kept stay in order
            if self._position is not None:
                self._ops.append((_PUT_META, (EVENT_POSITION, str(self._position))))
                self._position = None
            ops, self._ops = self._ops, []
            self._queued.clear()
            self._full.clear()
            commit = self._call(self._commit, ops)
            try:
                size, error = await outlast(
                    commit,
                    on_orphan=lambda outcome: self._committed(ops, *outcome),
                    on_orphan_error=self._orphan_failed,
                )
            except asyncio.CancelledError:
                raise
            except BaseException:
                self._lost()
                raise
            return self._committed(ops, size, error)

    def _committed(self, ops: list[_Op], size: int, error: sqlite3.Error | None) -> bool:
        """After a commit of `ops`: count, log, and keep what the disk would not take."""
        self.bytes = size
        if error is None:
            if self._refused:
                log.info("cache index: committing again")
                self._refused = False
            return True
        code = getattr(error, "sqlite_errorcode", 0)
        if code != sqlite3.SQLITE_FULL and code & 0xFF != sqlite3.SQLITE_IOERR:
            self.errors += 1
            log.error("cache index commit of %d changes failed: %s", len(ops), error)
            self._lost()
            return False
        if not self._refused:
            log.warning("cache index commit of %d changes: %s; trying again", len(ops), error)
            self._refused = True
        if len(ops) + len(self._ops) > self._keep_limit:
            deletions = [op for op in ops if op[0] in _DELETES]
            if len(deletions) + len(self._ops) > 4 * self._keep_limit:
                deletions = []
                self._lost()
            self.errors += 1
            log.error(
                "cache index: dropped %d changes the disk would not take, kept %d deletions",
                len(ops) - len(deletions),
                len(deletions),
            )
            ops = deletions
        self._ops[:0] = ops
        if ops:
            self._queued.set()
        return False

    def _orphan_failed(self, exc: BaseException) -> None:
        """A commit whose caller was cancelled: nobody else would hear that it failed."""
        self.errors += 1
        log.error("cache index commit failed", exc_info=exc)
        self._lost()

    async def backpressure(self) -> None:
        """Wait for a commit when far more changes are queued than one batch holds."""
        if len(self._ops) > self._keep_limit:
            await self.flush()

    async def close(self) -> None:
        """Commit what is queued, checkpoint the WAL into the index, close, stop the thread."""
        try:
            if not await self.flush() and self._ops:
                self.errors += 1
                log.error("cache index: %d changes lost at close", len(self._ops))
            await outlast(self._call(self._close))
        finally:
            self._thread.shutdown(wait=True)

    def _queue(self, sql: str, params: tuple[Any, ...]) -> None:
        self._ops.append((sql, params))
        self._queued.set()
        if len(self._ops) >= self._batch_ops:
            self._full.set()

    def _call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Start `fn` on the index thread; await it with :func:`lota.threads.outlast`."""
        return submit(fn, *args, executor=self._thread)

    # Everything below runs on the index thread.

    def _open(self) -> int:
        try:
            return self._load()
        except sqlite3.DatabaseError as exc:
            log.error("cache index %s is unreadable, starting empty: %s", self.path, exc)
            self._discard_files()
            return self._load()

    def _load(self) -> int:
        conn = self._conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA journal_size_limit={self._wal_limit}")
        conn.execute(f"PRAGMA wal_autocheckpoint={max(16, self._wal_limit // 4096)}")
        conn.executescript(_SCHEMA)
        self._reconcile_meta(conn)
        return self._measure()

    def _reconcile_meta(self, conn: sqlite3.Connection) -> None:
        """Drop what a changed chunk size invalidates; renumber chunks if the dirs changed."""
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        conn.execute("BEGIN")
        if meta.get("version", SCHEMA_VERSION) != SCHEMA_VERSION or meta.get(
            "chunk_size", str(self._chunk_size)
        ) != str(self._chunk_size):
            log.warning("cache layout changed: dropping the whole index %s", self.path)
            conn.execute("DELETE FROM chunks")
            conn.execute("DELETE FROM objects")
            meta.pop(EVENT_POSITION, None)
            conn.execute("DELETE FROM meta WHERE name = ?", (EVENT_POSITION,))
        position = meta.get(EVENT_POSITION)
        self.event_position = int(position) if position is not None else None
        old_dirs = json.loads(meta.get("dirs", "null")) or self._dirs
        if old_dirs != self._dirs:
            self._renumber(conn, old_dirs)
        values = {"version": SCHEMA_VERSION, "chunk_size": str(self._chunk_size)}
        values["dirs"] = json.dumps(self._dirs)
        conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
        conn.execute("COMMIT")

    def _renumber(self, conn: sqlite3.Connection, old_dirs: list[str]) -> None:
        log.warning("cache dirs changed from %s to %s: renumbering chunks", old_dirs, self._dirs)
        mapping = {i: self._dirs.index(d) for i, d in enumerate(old_dirs) if d in self._dirs}
        conn.execute("CREATE TEMP TABLE dirmap (old INTEGER PRIMARY KEY, new INTEGER)")
        conn.executemany("INSERT INTO dirmap VALUES (?, ?)", mapping.items())
        conn.execute("DELETE FROM chunks WHERE dir NOT IN (SELECT old FROM dirmap)")
        conn.execute("UPDATE chunks SET dir = (SELECT new FROM dirmap WHERE old = chunks.dir)")
        conn.execute("DROP TABLE dirmap")

    def _commit(self, ops: list[_Op]) -> tuple[int, sqlite3.Error | None]:
        """Commit `ops` in one transaction; the index's size, and the error if it failed
        (the loop side counts and logs it: only it touches the queue and the counts)."""
        error = None
        if ops:
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                for sql, group in groupby(ops, key=lambda op: op[0]):
                    conn.executemany(sql, [params for _, params in group])
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                error = exc
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
        return self._checkpoint_if_big(), error

    def _checkpoint_if_big(self) -> int:
        size = self._measure()
        if _file_size(self.path + "-wal") > self._wal_limit:
            try:
                self._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("cache index checkpoint failed: %s", exc)
            size = self._measure()
        return size

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("cache index is not open")
        return self._conn

    def _measure(self) -> int:
        return sum(_file_size(self.path + suffix) for suffix in ("", "-wal", "-shm"))

    def _discard_files(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path + suffix)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
