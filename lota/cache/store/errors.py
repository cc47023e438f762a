"""The chunk store's errors (under :class:`lota.s3.errors.LotaError`)::

CacheError              the store cannot serve or open; the request passes through
├── CacheDirInUse       another process holds a cache directory's lock
└── CacheWriteError     a chunk could not be written; its writer is already aborted
"""

from __future__ import annotations

from lota.s3.errors import LotaError


class CacheError(LotaError):
    """The cache store cannot do what was asked; the read path serves without it."""


class CacheDirInUse(CacheError):
    """Another process holds a cache directory's lock: two stores on one directory would
    evict each other's chunks and serve bytes that neither of them still has."""


class CacheWriteError(CacheError):
    """A chunk could not be written (disk error, wrong length). The writer is already
    aborted; the caller keeps serving the request from the origin without caching it."""
