"""The catalog interface both backends implement, its settings, and the URL that picks one."""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from lota.catalog.events import MAX_GAPS, EventCursor, EventStream, Waker
from lota.catalog.model import (
    AccessRecord,
    CatalogObject,
    Event,
    PendingObject,
    PendingSummary,
    UploadRecord,
)
from lota.clock import Clock
from lota.errors import CatalogError


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogSettings:
    """Tuning knobs; the defaults suit production."""

    # SQLite: how often event streams look for new events.
    poll_interval: float = 0.5
    # PostgreSQL: how often event streams look even when no NOTIFY arrived.
    listen_poll_interval: float = 5.0
    # How long a stream waits for an event id handed out but not committed yet.
    gap_timeout: float = 30.0
    # SQLite: how long a writer waits for another process's write lock.
    busy_timeout: float = 10.0
    # PostgreSQL: connections in the pool, and how long connecting and a statement may take.
    pool_size: int = 10
    connect_timeout: float = 10.0
    command_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("poll_interval", "listen_poll_interval", "gap_timeout", "busy_timeout"):
            if getattr(self, name) <= 0:
                raise CatalogError(f"catalog setting {name} must be positive")
        if self.pool_size < 2:
            raise CatalogError("catalog setting pool_size must be at least 2")


@dataclass(frozen=True, slots=True)
class CatalogURL:
    """A parsed catalog URL: ``sqlite:////abs/path.db``, ``sqlite:///rel.db`` or
    ``postgresql://user@host:port/db`` (``postgres://`` too)."""

    backend: Literal["sqlite", "postgresql"]
    target: str
    """The SQLite file path, or the DSN handed to asyncpg."""


def parse_url(url: str) -> CatalogURL:
    """Split a catalog URL into backend and target; :class:`CatalogError` if it is neither."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "sqlite":
        if not rest.startswith("/") or rest in ("/", "//"):
            raise CatalogError(
                f"catalog URL {url!r}: use sqlite:////absolute/path.db or sqlite:///relative.db"
            )
        return CatalogURL("sqlite", rest[1:])
    if sep and scheme in ("postgresql", "postgres"):
        return CatalogURL("postgresql", url)
    raise CatalogError(f"catalog URL {url!r} is neither sqlite:///... nor postgresql://...")


def redact(url: str) -> str:
    """`url` without its password, for logs and error messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.partition("@")
    if sep and at and ":" in userinfo:
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
    return url


class Catalog(abc.ABC):
    """The shared metadata store of a LOTA cluster. Open one with
    :func:`lota.catalog.open_catalog`; one instance per process (it is this node).

    Every method is a coroutine that never blocks the event loop, and raises
    :class:`CatalogError` (or :class:`CatalogUnavailable`, transient) on failure. Times are
    seconds since the epoch from the catalog's clock; nodes' clocks must agree to well
    within a lease.
    """

    def __init__(self, *, url: str, clock: Clock, node: str, settings: CatalogSettings) -> None:
        if not node:
            raise CatalogError("a catalog needs the name of the node that opens it")
        self.url = redact(url)
        self.clock = clock
        self.node = node
        self.settings = settings
        self._streams: set[EventStream] = set()
        self._closed = False

    # -- objects written through write acceleration --------------------------------------

    @abc.abstractmethod
    async def commit_object(self, obj: PendingObject) -> int:
        """Make `obj` the latest version of its key (pending migration); returns its seq.
        The previous version, if any, is superseded: it will not migrate (unless a node is
        migrating it right now) and its staging copy becomes garbage. Publishes ``put``.
        :class:`StagingSwept` if the orphan sweep took its staging copy."""

    @abc.abstractmethod
    async def commit_delete(self, bucket: str, key: str) -> int:
        """Make a tombstone the latest version of bucket/key; returns its seq. The tombstone
        migrates too (the delete reaches the home region). Publishes ``delete``."""

    @abc.abstractmethod
    async def get_object(self, bucket: str, key: str) -> CatalogObject | None:
        """The latest version of bucket/key, tombstones included (answer 404 for those)."""

    @abc.abstractmethod
    async def list_objects(
        self, bucket: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[CatalogObject]:
        """Latest versions of keys under `prefix` after `start_after`, in S3 key order
        (UTF-8 bytes), tombstones included (a listing merge must hide those keys)."""

    @abc.abstractmethod
    async def pending_keys(self, limit: int) -> list[tuple[str, str, int]]:
        """Bucket, key and seq of up to `limit` latest versions not migrated yet."""

    @abc.abstractmethod
    async def pending_summary(self) -> PendingSummary:
        """Count, bytes, age of the oldest and failures of the latest versions not migrated."""

    # -- migration work, with leases ----------------------------------------------------

    @abc.abstractmethod
    async def claim_migrations(self, limit: int, lease_seconds: float) -> list[CatalogObject]:
        """Lease up to `limit` versions to migrate to this node, oldest first: latest
        versions pending (and due for retry) or whose lease expired. A version is not handed
        out while an older version of its key is still under a live lease elsewhere, so the
        home region sees versions in commit order. Each claim counts an attempt."""

    @abc.abstractmethod
    async def renew_lease(self, bucket: str, key: str, seq: int, lease_seconds: float) -> bool:
        """Extend this node's lease on a version; False if another node has taken it."""

    @abc.abstractmethod
    async def complete_migration(self, bucket: str, key: str, seq: int) -> bool:
        """Mark the version `seq` migrated, if this node still holds its lease (an expired
        lease nobody took over still counts). Only that version changes: a newer one
        committed meanwhile stays pending. False if the lease was lost: the caller must not
        clean up. Publishes ``migrated``."""

    @abc.abstractmethod
    async def fail_migration(
        self, bucket: str, key: str, seq: int, error: str, retry_at: float
    ) -> bool:
        """Give the lease back after a failed attempt: pending again, not claimed before
        `retry_at` (see :func:`lota.catalog.retry_delay`). False if the lease was lost."""

    @abc.abstractmethod
    async def staging_garbage(self, limit: int, grace_seconds: float) -> list[CatalogObject]:
        """Versions whose staging copy is no longer needed (superseded, or migrated) for at
        least `grace_seconds` (readers mid-GET may still be using it) and not deleted yet,
        nor under a live migration lease. Delete the copy, then :meth:`staging_deleted`."""

    @abc.abstractmethod
    async def staging_deleted(self, seqs: Sequence[int]) -> None:
        """Record that the staging copies of these versions are gone."""

    @abc.abstractmethod
    async def prune(self, *, versions_older_than: float, events_older_than: float) -> int:
        """Forget finished history: superseded and migrated versions whose staging copy is
        gone, retired more than `versions_older_than` seconds ago (readers then go to the
        origin), and events older than `events_older_than` seconds. Returns rows deleted.
        Safe to run on every node."""

    @abc.abstractmethod
    async def requeue_migration(self, bucket: str, key: str, seq: int) -> bool:
        """Make the migrated latest version `seq` pending again (a late copy of an older
        version may have undone it at an origin that ignores conditional writes); False if
        it is not the migrated latest version, or its staging copy is gone already.
        Publishes ``requeued``."""

    # -- staging copies and uploads --------------------------------------------------------

    @abc.abstractmethod
    async def sweep_orphans(self, names: Sequence[str]) -> list[str]:
        """Of these staging copies (by ``staging_key`` or ``local_path``), those no version
        names, recorded as swept: a commit that names one fails from now on
        (:class:`StagingSwept`), so the caller may delete them. Atomic with commits."""

    @abc.abstractmethod
    async def record_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """An accelerated multipart upload started (ListMultipartUploads shows it)."""

    @abc.abstractmethod
    async def get_upload(self, upload_id: str) -> UploadRecord | None:
        """The upload `upload_id` if it is in progress (started here, not yet completed or
        aborted)."""

    @abc.abstractmethod
    async def forget_upload(self, upload_id: str) -> None:
        """The upload was completed or aborted."""

    @abc.abstractmethod
    async def list_uploads(
        self, bucket: str, prefix: str = "", after: tuple[str, str] = ("", ""), limit: int = 1000
    ) -> list[UploadRecord]:
        """Uploads in progress under `prefix`, in (key, upload id) order after `after`."""

    # -- documents every node follows -------------------------------------------------------

    @abc.abstractmethod
    async def put_document(self, name: str, body: str) -> int:
        """Store a new version of document `name`; returns its version (1, 2, ...).
        Publishes ``document`` (key `name`, seq the version)."""

    @abc.abstractmethod
    async def get_document(self, name: str) -> tuple[int, str] | None:
        """The latest version of document `name` and its body; None if never stored."""

    # -- named leases for singleton engines -----------------------------------------------

    @abc.abstractmethod
    async def acquire_lease(self, name: str, seconds: float) -> bool:
        """Take or renew the lease `name` for this node until now + `seconds`; False if
        another node holds it unexpired."""

    @abc.abstractmethod
    async def release_lease(self, name: str) -> None:
        """Give up the lease `name`, if this node holds it."""

    @abc.abstractmethod
    async def lease_holder(self, name: str) -> tuple[str, float] | None:
        """The node holding lease `name` and when it expires; None if unheld or expired."""

    # -- last access times and tiers --------------------------------------------------------

    @abc.abstractmethod
    async def record_accesses(self, batch: Iterable[tuple[str, str, float]]) -> None:
        """Record (bucket, key, time) accesses; each object keeps the latest time."""

    @abc.abstractmethod
    async def last_access(self, bucket: str, key: str) -> float | None:
        """When bucket/key was last read or written through LOTA (None: never seen)."""

    @abc.abstractmethod
    async def list_accesses(
        self, bucket: str, prefix: str = "", after_key: str = "", limit: int = 1000
    ) -> list[AccessRecord]:
        """One page of access and tier records under `prefix` after `after_key`, key order."""

    async def iter_accesses(
        self, bucket: str, prefix: str = "", after_key: str = "", page: int = 5000
    ) -> AsyncIterator[AccessRecord]:
        """Every access and tier record under `prefix` after `after_key`, a page at a time."""
        while records := await self.list_accesses(bucket, prefix, after_key, page):
            for record in records:
                yield record
            after_key = records[-1].key

    @abc.abstractmethod
    async def set_tier(self, bucket: str, key: str, tier: str, at: float) -> None:
        """Record that bucket/key moved to `tier` at time `at`."""

    @abc.abstractmethod
    async def get_tier(self, bucket: str, key: str) -> tuple[str, float] | None:
        """The tier bucket/key was last moved to, and when (None: never moved)."""

    # -- events for other nodes ----------------------------------------------------------

    @abc.abstractmethod
    async def publish(self, kind: str, bucket: str, key: str, seq: int = 0) -> int:
        """Tell every node about bucket/key (e.g. ``invalidate``); returns the event id."""

    @abc.abstractmethod
    async def last_event_id(self) -> int:
        """The id of the newest event (0 when there is none)."""

    @abc.abstractmethod
    async def events_after(self, after: int, limit: int) -> list[Event]:
        """Up to `limit` committed events with ids above `after`, in id order."""

    @abc.abstractmethod
    async def events_by_id(self, ids: Sequence[int]) -> list[Event]:
        """The committed events among `ids` (a stream's holes)."""

    async def events(self, after: int | None = None) -> EventStream:
        """The events after id `after` (None: from now on), endless until closed. The
        stream listens before it is returned: every event that commits after the call
        returns is delivered, one whose id was handed out before the call too."""
        self._check_open()
        waker = await self._waker()
        try:
            cursor = await self._cursor(after)
        except BaseException:
            await waker.close()
            raise
        stream = EventStream(self, waker, cursor, poll_interval=self._poll_interval())
        self._streams.add(stream)
        return stream

    async def _cursor(self, after: int | None) -> EventCursor:
        if after is not None:
            return EventCursor(after, gap_timeout=self.settings.gap_timeout)
        cursor = EventCursor(await self.last_event_id(), gap_timeout=self.settings.gap_timeout)
        recent = await self.events_after(max(0, cursor.top - MAX_GAPS), MAX_GAPS)
        cursor.await_uncommitted((event.id for event in recent), time.monotonic())
        return cursor

    @abc.abstractmethod
    async def _waker(self) -> Waker:
        """Something that wakes a stream when events may have arrived."""

    @abc.abstractmethod
    def _poll_interval(self) -> float: ...

    def _wake_streams(self) -> None:
        """Let this process's streams see an event it just committed without waiting."""
        for stream in list(self._streams):
            if stream.closed:
                self._streams.discard(stream)
            else:
                stream.wake()

    # -- lifetime -------------------------------------------------------------------------

    async def close(self) -> None:
        """Close event streams, then the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        await self._close()

    @abc.abstractmethod
    async def _close(self) -> None: ...

    def _check_open(self) -> None:
        if self._closed:
            raise CatalogError(f"catalog {self.url} is closed")

    async def __aenter__(self) -> Catalog:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} node={self.node}>"
