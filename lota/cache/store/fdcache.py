"""Descriptors of recently read chunks, kept open so that a hit costs no ``open()``."""

from __future__ import annotations

import os
import resource
from collections import OrderedDict

from lota.cache.store.entries import Chunk

MIN_OPEN_CHUNKS = 512
MAX_OPEN_CHUNKS = 131_072
# The share of a worker's descriptor limit kept open for chunk files (its own, and those
# its siblings handed over), at most. A node serves tens of thousands of objects to
# hundreds of connections: the rest is for client connections, origin, peer and sibling
# sockets and LOTA's own files (lota.connections.chunk_descriptors leaves them room).
CHUNK_SHARE = 0.95
# Of the descriptors opened again into a full cache (a hot set larger than the descriptors
# kept), one in KEEP_EVERY is kept as the most recently read and the others as the next
# to close. Read in a loop (an epoch), least-recently-used order closed each one before its
# next read; this keeps a stable part of the set open (~3/8 of the reads of a set twice as
# large as the cache find their descriptor open), and a chunk read often still gets in
# after a few reads.
KEEP_EVERY = 8


def open_chunk_limit(workers: int = 1, room: int | None = None) -> int:
    """Chunk descriptors a worker keeps open for hits on one worker's chunks (its own, or
    one sibling's): :data:`CHUNK_SHARE` of this process's descriptor limit (raised to the
    hard one at start, :func:`lota.connections.raise_descriptor_limit`), or the `room` left
    by everything else if less, shared equally by the node's `workers` (a hit is as likely
    on any worker's chunk); at least 512 in all, at most 131,072 a share (a hot set of
    100,000 small objects, with one worker under the limit of 1,048,576 containers commonly
    get).
    A hot set of small objects larger than this reopens a file for every hit; kept
    descriptors pin nothing (an evicted chunk's is closed)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 0:
        total = MAX_OPEN_CHUNKS * workers
    else:
        total = int(soft * CHUNK_SHARE)
    if room is not None:
        total = min(total, room)
    return min(MAX_OPEN_CHUNKS, max(MIN_OPEN_CHUNKS, total) // max(1, workers))


class FdCache:
    """At most `limit` chunk descriptors, least recently read closed first (unless read
    now), most opened again kept as the next to close (:data:`KEEP_EVERY`). A chunk's
    descriptor is ``chunk.fd``, -1 when not kept open."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = open_chunk_limit() if limit is None else limit
        self._open: OrderedDict[Chunk, None] = OrderedDict()
        self._opened_again = 0

    def keep(self, chunk: Chunk, fd: int, *, again: bool = False) -> None:
        """Keep `chunk`'s new descriptor `fd`, as its most recent read unless it is opened
        `again` into a full cache (see :data:`KEEP_EVERY`)."""
        chunk.fd = fd
        recent = True
        if again and len(self._open) >= self._limit:
            self._opened_again += 1
            recent = self._opened_again % KEEP_EVERY == 0
        for _ in range(len(self._open)):  # each held one is passed over once at most
            if len(self._open) < self._limit:
                break
            oldest = next(iter(self._open))
            if oldest.readers:
                self._open.move_to_end(oldest)
                continue
            self.close(oldest)
        self._open[chunk] = None
        if not recent:
            self._open.move_to_end(chunk, last=False)

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
