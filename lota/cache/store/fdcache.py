"""Descriptors of recently read chunks, kept open so that a hit costs no ``open()``."""

from __future__ import annotations

import os
from collections import OrderedDict

from lota.cache.store.entries import Chunk

MAX_OPEN_CHUNKS = 512
"""Chunk descriptors kept open for hits (well under the usual 1024..1M fd limits)."""


class FdCache:
    """At most `limit` chunk descriptors, least recently read closed first (unless read
    now). A chunk's descriptor is ``chunk.fd``, -1 when not kept open."""

    def __init__(self, limit: int = MAX_OPEN_CHUNKS) -> None:
        self._limit = limit
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
