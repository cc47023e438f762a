"""The chunk store's errors, in the tree of :mod:`lota.errors`::

CacheError              the store cannot open: a dir or the index is unusable
├── CacheDirInUse       another process holds a cache directory's lock
└── CacheWriteError     a chunk could not be written; its writer is already aborted
"""

from __future__ import annotations

from lota.errors import LotaError


class CacheError(LotaError):
    """The store cannot open: the first dir (which holds the index) or the index itself is
    unusable. The node does not start without its cache (:mod:`lota.node.build`); once the
    store is open, reads and fills report trouble by returning None, not by raising."""


class CacheDirInUse(CacheError):
    """Another process holds a cache directory's lock: two stores on one directory would
    evict each other's chunks and serve bytes that neither of them still has."""


class CacheWriteError(CacheError):
    """A chunk could not be written (disk error, wrong length). The writer is already
    aborted; the caller keeps serving the request from the origin without caching it."""
