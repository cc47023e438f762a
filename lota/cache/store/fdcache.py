"""Descriptors of recently read chunks, kept open so that a hit costs no ``open()``."""

from __future__ import annotations

import os
import resource
from collections import OrderedDict

from lota.cache.store.entries import Chunk

MIN_OPEN_CHUNKS = 512
MAX_OPEN_CHUNKS = 131_072


def open_chunk_limit() -> int:
    """Chunk descriptors kept open for hits: a quarter of this process's descriptor limit
    (raised to the hard one at start, :func:`lota.connections.raise_descriptor_limit`),
    between 512 and 131,072 (a hot set of 100,000 small objects under the limit of
    1,048,576 containers commonly get). A hot set of small objects larger than this
    reopens a file for every hit; kept descriptors pin nothing (an evicted chunk's is
    closed)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return MAX_OPEN_CHUNKS
    return max(MIN_OPEN_CHUNKS, min(MAX_OPEN_CHUNKS, soft // 4))


class FdCache:
    """At most `limit` chunk descriptors, least recently read closed first (unless read
    now). A chunk's descriptor is ``chunk.fd``, -1 when not kept open."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = open_chunk_limit() if limit is None else limit
        self._open: OrderedDict[Chunk, None] = OrderedDict()

    def keep(self, chunk: Chunk, fd: int) -> None:
        chunk.fd = fd
        self._open[chunk] = None
        while len(self._open) > self._limit:
            oldest = next(iter(self._open))
            if oldest.readers:
                self._open.move_to_end(oldest)
                break
            self.close(oldest)

    def used(self, chunk: Chunk) -> None:
        self._open.move_to_end(chunk)

    def close(self, chunk: Chunk) -> None:
        self._open.pop(chunk, None)
        if chunk.fd >= 0:
            fd, chunk.fd = chunk.fd, -1
            os.close(fd)

    def close_all(self) -> None:
        for chunk in list(self._open):
            self.close(chunk)
