"""The node-local read cache.

- :mod:`lota.cache.store`: the chunk store (entries, chunks, budget, crash safety); the
  read path's only way to the disk. A package: its ``table``, ``budget``, ``reader``,
  ``writer``, ``maintenance`` modules and the ``CacheStore`` facade that composes them.
- :mod:`lota.cache.index`: its SQLite journal, on a thread of its own.
- :mod:`lota.cache.eviction`: S3-FIFO, the eviction policy (pure).
- :mod:`lota.cache.layout`: file names and disk accounting (pure).
- :mod:`lota.cache.files`: the blocking file operations, run on I/O threads.
- :mod:`lota.cache.reads`, :mod:`lota.cache.fill`, :mod:`lota.cache.deliver`,
  :mod:`lota.cache.warm`: the read path on top of the store.

Errors (under :class:`lota.errors.LotaError`, where the whole tree is drawn)::

    CacheError              the store cannot open: a dir or the index is unusable
    ├── CacheDirInUse       another process holds a cache directory's lock
    └── CacheWriteError     a chunk could not be written; its writer is already aborted
"""
