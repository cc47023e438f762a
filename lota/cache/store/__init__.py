"""The node-local chunk store: object chunks on NVMe under one byte budget.

Use it as lookup -> admit -> open_chunk (hit) or begin_chunk/write/commit (fill)::

    obj = store.lookup(bucket, key) or await store.admit(meta)
    reader = await store.open_chunk(obj, i)          # None: not cached (or damaged)
    if store.keeps(obj, i):                          # False: not kept -> pass through
        writer = await store.begin_chunk(obj, i)     # None: no room, no disk -> pass through
    store.count_read(obj, i)                         # a client's miss (a hit counts itself)

What it guarantees, and how:

- Identity. Entries are keyed by (bucket, key) and carry the ETag and version id. Admitting
  a different ETag/version drops the old chunks; an old object's fill that commits later
  is discarded. Each admission gets fresh file names (see :mod:`lota.cache.layout`).
- Crash safety. A chunk is written to a temp file next to its final name, fsynced
  (optional), renamed, and only then queued for the index (:mod:`lota.cache.index`). After
  a restart the index is the truth: a chunk whose file is missing or of the wrong length
  is dropped (when first opened, or by the start-up sweep, whichever comes first); temp
  files and files without a row are deleted by that sweep, in the background.
- Integrity. Every chunk has an xxh3-64 digest computed as it is written. ``verify``
  decides when a read checks it: ``always``, ``after-restart`` (the first read of a chunk
  this process did not write itself; the default) or ``never``. A background scrub checks
  idle chunks at a bounded rate. A damaged chunk is deleted and reported as absent.
- Budget. ``usage`` counts chunk files (in 4 KiB blocks), the chunk directories, the
  SQLite files and the full size of every fill in progress (reserved at begin_chunk).
  Reaching the high watermark evicts (S3-FIFO, :mod:`lota.cache.eviction`) down to the low
  one; the budget itself is never exceeded: without room, begin_chunk returns None. At
  the high watermark, a fill is kept only if the admission rule says so (a chunk read
  more than the one it would evict, or an evictee gone stale: :mod:`lota.cache.admission`),
  so a dataset larger than the cache read epoch after epoch keeps a stable share cached.
- Drives smaller than the budget. A fill that hits ENOSPC is aborted (its temp file and
  reservation released at once) and sets that dir's own budget to what LOTA holds there,
  less a margin; the budget in force is then the smaller of ``size`` and the sum of the
  dirs' budgets, so eviction makes room and fills go on, and a fill goes to the first dir
  (in rendezvous order) with room for it. Every second the store looks at each dir's free
  space (``statvfs``), and a lowered budget grows back as the file system frees space.
- Readers. A chunk being read is never chosen for eviction. Invalidation deletes at once:
  POSIX keeps the bytes of an unlinked file readable through open descriptors, so readers
  finish with the bytes they started with, and the space stays counted until they close.
- Failing disks. Another OSError while filling aborts the fill (``CacheWriteError``) and
  rests the directory for ``dir_cooldown`` seconds; other directories keep working.
- One process per directory. Each dir's ``lota.lock`` is held (``flock``) while the store
  is open; a second store on it is refused (``CacheDirInUse``), naming the holder.
- Threads. SQLite runs on one thread of its own; file I/O on a small pool; the event loop
  only does bookkeeping. No chunk is ever held in memory whole.

The directory is not fsynced after a rename: after a power loss a chunk's row may then
outlive its file, which the rules above already handle (the chunk is dropped). With
``fsync=False`` a power loss can also leave a chunk of the right length with wrong bytes;
the ``after-restart`` verification catches those, ``verify="never"`` would not.
"""

from lota.cache.store.entries import CachedObject, ObjectMeta, Watcher
from lota.cache.store.errors import CacheDirInUse, CacheError, CacheWriteError
from lota.cache.store.facade import COUNTERS, CacheStore
from lota.cache.store.fdcache import open_chunk_limit
from lota.cache.store.reader import (
    VERIFY_POLICIES,
    ChunkReader,
    VerifyPolicy,
    read_or_span,
    read_resident,
)
from lota.cache.store.writer import ChunkWriter

__all__ = [
    "COUNTERS",
    "VERIFY_POLICIES",
    "CacheDirInUse",
    "CacheError",
    "CacheStore",
    "CacheWriteError",
    "CachedObject",
    "ChunkReader",
    "ChunkWriter",
    "ObjectMeta",
    "VerifyPolicy",
    "Watcher",
    "open_chunk_limit",
    "read_or_span",
    "read_resident",
]
