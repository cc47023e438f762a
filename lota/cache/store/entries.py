"""What the store knows of a cached object and its chunks, and how an object is stored as
an index row. Plain data: no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

from lota.cache.index import ObjectRow
from lota.cache.layout import chunk_count

_CHECKSUM = "x-amz-checksum-"


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What the store remembers about an object, besides its bytes."""

    bucket: str
    key: str
    etag: str
    size: int
    last_modified: str
    headers: tuple[tuple[str, str], ...]
    version_id: str = ""
    validated_at: float = 0.0
    parts: tuple[tuple[int, int, int], ...] = ()

    def same_object(self, other: ObjectMeta) -> bool:
        """Whether `other` describes the same bytes (so cached chunks stay valid)."""
        return (self.etag, self.version_id, self.size) == (other.etag, other.version_id, other.size)

    def updated_by(self, newer: ObjectMeta) -> ObjectMeta:
        """`newer` (of the same object), keeping what it could not know: the whole object's
        checksums (a ranged answer has none; a HEAD or a whole GET gave them) and the part
        bounds learnt so far."""
        has = {name for name, _ in newer.headers}
        kept = tuple(h for h in self.headers if h[0].startswith(_CHECKSUM) and h[0] not in has)
        if kept:
            newer = replace(newer, headers=(*newer.headers, *kept))
        if self.parts and not newer.parts:
            newer = replace(newer, parts=self.parts)
        return newer


class CachedObject:
    """The store's live entry for one object. `alive` turns False, for good, when the entry
    is replaced, invalidated or evicted; a new entry is then a new CachedObject."""

    __slots__ = ("alive", "chunks", "meta", "pinned", "stem", "writers")

    def __init__(self, meta: ObjectMeta, stem: str, pinned: bool) -> None:
        self.meta = meta
        self.stem = stem
        self.pinned = pinned
        self.alive = True
        self.chunks: dict[int, Chunk] = {}
        self.writers = 0

    def chunk_count(self, chunk_size: int) -> int:
        return chunk_count(self.meta.size, chunk_size)

    def __repr__(self) -> str:
        return f"<CachedObject {self.meta.bucket}/{self.meta.key} etag={self.meta.etag}>"


class Chunk:
    """One complete chunk file (hashed by identity; see :func:`fingerprint`)."""

    __slots__ = (
        "checked",
        "dead",
        "digest",
        "dir",
        "fd",
        "fingerprint",
        "index",
        "last_access",
        "length",
        "obj",
        "readers",
        "verified",
        "warm",
    )

    def __init__(self, obj: CachedObject, index: int, dir_no: int, length: int, digest: int):
        self.obj = obj
        self.index = index
        self.dir = dir_no
        self.length = length
        self.digest = digest
        self.readers = 0  # open readers, plus one while the file is being deleted
        self.fd = -1  # kept open while the chunk is hot (see fdcache.FdCache)
        self.dead = False
        self.verified = False  # digest checked (or written) by this process
        self.checked = False  # file seen with the right length by this process
        self.last_access = 0.0
        # Bytes [start, end) of the file last read whole from memory (through whichever
        # descriptor was open then: lota.cache.store.reader.read_or_span); None once they
        # were not.
        self.warm: tuple[int, int] | None = None
        # Its chunk_id, once asked (fingerprint()); None again once its object is renamed.
        self.fingerprint: int | None = None


def chunk_id(obj: CachedObject, index: int) -> int:
    """The name of chunk `index` of `obj`'s version, the same across admissions of the
    object (each gets a new stem): for the eviction ghost and the admission rule's read
    counts, which must recognise a chunk filled again after its eviction, or read again
    after its object's entry was dropped."""
    m = obj.meta
    return hash((m.bucket, m.key, m.etag, index))


def fingerprint(chunk: Chunk) -> int:
    """:func:`chunk_id` of `chunk`, worked out once: the admission rule asks it of every
    chunk it counts, long after the chunk's object was last looked at."""
    known = chunk.fingerprint
    if known is None:
        m = chunk.obj.meta
        known = chunk.fingerprint = hash((m.bucket, m.key, m.etag, chunk.index))
    return known


def object_row(obj: CachedObject) -> ObjectRow:
    m = obj.meta
    headers, parts = json.dumps(m.headers), json.dumps(m.parts)
    return (
        obj.stem,
        m.bucket,
        m.key,
        m.etag,
        m.version_id,
        m.size,
        m.last_modified,
        headers,
        m.validated_at,
        parts,
    )


def meta_from_row(row: ObjectRow, shared: dict[str, Any] | None = None) -> ObjectMeta:
    """An object row as ObjectMeta. `shared` maps strings already seen (bucket names,
    header and parts JSON) to the one object to use for all equal ones."""
    _, bucket, key, etag, version_id, size, last_modified, headers, validated_at, parts = row
    shared = {} if shared is None else shared
    if headers not in shared:
        shared[headers] = tuple((str(k), str(v)) for k, v in json.loads(headers))
    if parts not in shared:
        shared[parts] = tuple((int(n), int(a), int(b)) for n, a, b in json.loads(parts))
    return ObjectMeta(
        bucket=shared.setdefault(bucket, bucket),
        key=key,
        etag=etag,
        size=int(size),
        last_modified=shared.setdefault(last_modified, last_modified),
        headers=shared[headers],
        version_id=version_id,
        validated_at=float(validated_at),
        parts=shared[parts],
    )


class Watcher(Protocol):
    """Told what a store learns as it learns it (a worker tells its siblings:
    :class:`lota.workers.news.News`). Called on the event loop; must not block."""

    def admitted(self, meta: ObjectMeta, since: float) -> None:
        """`meta` was learnt from the origin, asked at `since` (``time.monotonic()``), and
        admitted as validated."""

    def published(self, meta: ObjectMeta, index: int, path: str, length: int) -> None:
        """Chunk `index` of `meta`'s object is cached, whole, in file `path`."""
