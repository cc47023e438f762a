"""The node-local read cache.

- :mod:`lota.cache.store`: the chunk store (entries, chunks, budget, crash safety); the
  read path's only way to the disk.
- :mod:`lota.cache.index`: its SQLite journal, on a thread of its own.
- :mod:`lota.cache.eviction`: S3-FIFO, the eviction policy (pure).
- :mod:`lota.cache.layout`: file names and disk accounting (pure).
- :mod:`lota.cache.files`: the blocking file operations, run on I/O threads.
- :mod:`lota.cache.reads`, :mod:`lota.cache.fill`, :mod:`lota.cache.deliver`,
  :mod:`lota.cache.warm`: the read path on top of the store.

Errors (under :class:`lota.errors.LotaError`, where the whole tree is drawn)::

    CacheError              the store cannot serve or open; the request passes through
    └── CacheWriteError     a chunk could not be written; its writer is already aborted
"""
