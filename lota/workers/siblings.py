"""The other workers of this node, as sources of the chunks they own.

A :class:`SiblingSource` is one sibling worker: chunks it holds are opened through its
descriptor socket (:mod:`lota.workers.fds`) and sent from here zero-copy; chunks it does
not hold are read from its peer endpoint over its HTTP Unix socket, where it fills them
once for everyone (:class:`lota.cluster.peers.PeerSource`). Descriptors are kept, the most
recently used ones, so a hot chunk is asked for at most once per worker: as many of each
sibling's as the store keeps of its own (:func:`lota.connections.chunk_descriptors`), so
that a hot set a worker reads from its own descriptors is read from its siblings' alike.
Each kept descriptor pins its file's blocks (an evicted chunk's space returns once it is
closed), so they are bounded in bytes too. Beyond them, the paths of
chunks handed over before, or that the sibling said it published
(:mod:`lota.workers.news`), are remembered (:data:`PATHS_PER_DESCRIPTOR` times as many):
such a chunk is opened here, on the loop, as the store reopens its own (a file that is
gone, or of another length, is asked for). The files of a node's workers are on the same
drives, a chunk's path names its version, and chunks are published whole under it.

The sibling does not see these reads, so the reader counts each one it serves
(:meth:`OpenChunk.read`), and they are told to the sibling about once a second, per
chunk file (its name, ``STEM.INDEX``, is the sibling's name for that chunk of that
version: :mod:`lota.workers.news`): its eviction and admission rule count them as its own
hits. Opening a chunk is not a read, here or there: a descriptor may be opened only to
find out whether the sibling holds the chunk (for ``x-lota-cache``), or to bring its
bytes to hand for a read counted later.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import NamedTuple

from lota.cache.source import SourceKind, SourceReply
from lota.cache.store import ObjectMeta
from lota.cache.store.fdcache import KEEP_EVERY
from lota.cache.store.reader import WARM_FOR
from lota.cluster.peers import PeerSource
from lota.workers.fds import FdClient

log = logging.getLogger("lota.workers")

# The bytes of the chunks the descriptors kept of one sibling pin, at most: 16,384 small
# chunks (64 KiB), more than a worker keeps of one sibling's under a limit of 20,000.
KEPT_BYTES = 1024 * 1024 * 1024
# Paths of a sibling's chunks remembered, per descriptor kept.
PATHS_PER_DESCRIPTOR = 4
# Opened chunks of one sibling read between two news of them, at most (the reads of more
# go untold): a third of what may wait for the sibling (news.MAX_WAITING), at ~41 bytes
# each, and far more than a worker serves in a second.
MAX_TOLD = 32_768

ChunkId = tuple[str, str, str, int]
# Bytes [start, end) of a file last read whole from memory (lota.cache.store.reader.Warm).
Warmth = tuple[int, int] | None


class Known(NamedTuple):
    """Where a sibling keeps a chunk, and what is known of its file here."""

    path: str
    length: int
    warm: Warmth
    """See lota.cache.store.reader.Warm."""
    at: float
    """When `warm` was last true (``time.monotonic()``): it is trusted for ``WARM_FOR``."""

    def warmth(self) -> Warmth:
        return self.warm if 0 <= time.monotonic() - self.at <= WARM_FOR else None


class Told(list["OpenChunk"]):
    """The chunks of one sibling read here since it was last told of their reads, in the
    order first read; and how many reads went untold, the list being full."""

    __slots__ = ("untold",)

    def __init__(self) -> None:
        super().__init__()
        self.untold = 0


class OpenChunk:
    """A sibling's chunk file, open here: read it with ``os.pread``/``os.sendfile`` on `fd`,
    say so with :meth:`read` when it is for a client, then :meth:`close` (the descriptor is
    closed once nobody uses it and it is not kept)."""

    __slots__ = (
        "fd",
        "kept",
        "length",
        "name",
        "path",
        "reads",
        "told",
        "used_at",
        "users",
        "warm",
    )

    def __init__(
        self,
        fd: int,
        length: int,
        path: str,
        warm: Warmth,
        told: Told,
    ) -> None:
        """`told`: where it goes once read, for its reads to be told to the sibling
        (:meth:`SiblingSource.take_reads`)."""
        self.fd = fd
        self.length = length
        self.path = path
        self.name = os.path.basename(path)  # the sibling's name for it (take_reads)
        self.users = 0
        self.kept = True
        self.warm = warm  # see lota.cache.store.reader.Warm
        self.used_at = time.monotonic()
        self.told = told
        self.reads = 0
        """Reads of it served here since its sibling was last told of them."""

    def use(self) -> OpenChunk:
        self.users += 1
        return self

    def read(self) -> None:
        """Bytes of it were read for a client (the sibling hears of it: its own hit)."""
        if self.reads == 0:
            if len(self.told) >= MAX_TOLD:
                self.told.untold += 1
                return
            self.told.append(self)
        self.reads += 1

    def close(self) -> None:
        self.users -= 1
        if not self.kept and self.users == 0 and self.fd >= 0:  # _maybe_close, written out
            os.close(self.fd)
            self.fd = -1

    def drop(self) -> None:
        """No longer kept: closed when its last user is done."""
        self.kept = False
        self._maybe_close()

    def _maybe_close(self) -> None:
        if not self.kept and self.users == 0 and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SiblingSource:
    """One sibling worker: its chunks, zero-copy when it holds them."""

    kind: SourceKind = "sibling"

    def __init__(self, index: int, peer: PeerSource, fds: FdClient, kept: int = 512) -> None:
        """`kept`: how many of its descriptors are kept here, at most."""
        self.index = index
        self._max_kept = kept
        self.name = peer.name
        self._peer = peer
        self._fds = fds
        self._kept: OrderedDict[ChunkId, OpenChunk] = OrderedDict()
        self._kept_bytes = 0
        # Where the sibling keeps each chunk, and what is known of its file here, which
        # outlives the descriptor it was learnt through (see Known).
        self._paths: OrderedDict[ChunkId, Known] = OrderedDict()
        self._opened_again = 0
        # The chunks read here since the sibling was last told of their reads (take_reads):
        # its eviction and admission count them as its own hits.
        self._told = Told()

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[SourceReply]:
        async with self._peer.get(bucket, key, byte_range=byte_range, if_match=if_match) as reply:
            yield _FromSibling(reply)

    def head(self, bucket: str, key: str) -> AbstractAsyncContextManager[SourceReply]:
        """The object's metadata as the sibling knows it, fresh (see
        :meth:`lota.cluster.peers.PeerSource.head`)."""
        return self._peer.head(bucket, key)

    def kept(self, meta: ObjectMeta, index: int) -> OpenChunk | None:
        """The chunk if its descriptor is kept here (the sibling handed it over before)."""
        chunk: ChunkId = (meta.bucket, meta.key, meta.etag, index)
        kept = self._kept.get(chunk)
        if kept is not None:
            if kept.kept:
                self._kept.move_to_end(chunk)
                now = time.monotonic()
                if not 0 <= now - kept.used_at <= WARM_FOR:
                    kept.warm = None  # idle since: its pages may have gone (WARM_FOR)
                kept.used_at = now
                kept.users += 1  # use(), written out: this runs for every hit on it
                return kept
            self._forget(chunk)  # dropped: its file turned out short
        known = self._paths.get(chunk)
        if known is None:
            return None
        try:
            fd = os.open(known.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            del self._paths[chunk]
            return None
        if os.fstat(fd).st_size != known.length:
            os.close(fd)
            del self._paths[chunk]
            return None
        opened = OpenChunk(fd, known.length, known.path, known.warmth(), self._told)
        self._keep(chunk, opened.use(), again=True)
        return opened

    async def open(self, meta: ObjectMeta, index: int) -> OpenChunk | None:
        """The chunk, if the sibling holds it (a kept descriptor, or a new one); None if not,
        or if the sibling cannot be asked right now."""
        kept = self.kept(meta, index)
        if kept is not None:
            return kept
        chunk: ChunkId = (meta.bucket, meta.key, meta.etag, index)
        try:
            found = await self._fds.open(*chunk)
        except OSError as exc:
            log.debug("sibling %s did not hand over %r: %r", self.name, chunk, exc)
            return None
        if found is None:
            return None
        kept = self._kept.get(chunk)
        if kept is not None and not kept.kept:
            self._forget(chunk)
        elif kept is not None:  # another reader had it handed over meanwhile: share that one
            os.close(found[0])
            self._kept.move_to_end(chunk)
            return kept.use()
        fd, length, path = found
        known = self._paths.get(chunk)
        warm = None
        if known is not None and (known.path, known.length) == (path, length):
            warm = known.warmth()
        opened = OpenChunk(fd, length, path, warm, self._told)
        self._keep(chunk, opened.use())  # in use before kept: never closed
        self.remember(chunk, path, length)
        return opened

    def take_reads(self, most: int = MAX_TOLD) -> dict[str, int]:
        """The reads of the sibling's chunks served here since they were last taken, by the
        name of the chunk's file (for :mod:`lota.workers.news` to tell the sibling): of the
        first `most` chunks read since; the others wait for the next call
        (:attr:`reads_waiting`)."""
        told = self._told[:most]
        del self._told[:most]  # the same list: every chunk open here goes to it when read again
        reads: dict[str, int] = {}
        for opened in told:
            reads[opened.name] = reads.get(opened.name, 0) + opened.reads
            opened.reads = 0
        return reads

    def take_untold(self) -> int:
        """Reads served here since the last call that go untold: more of the sibling's
        chunks were read between two news than :data:`MAX_TOLD`."""
        untold, self._told.untold = self._told.untold, 0
        return untold

    @property
    def reads_waiting(self) -> int:
        """Chunks read here whose reads :meth:`take_reads` has not taken yet."""
        return len(self._told)

    def remember(self, chunk: ChunkId, path: str, length: int, *, written: bool = False) -> None:
        """The sibling holds `chunk` in file `path`, `length` bytes long (it handed the
        chunk over, or said so: :mod:`lota.workers.news`): opened here when read.
        `written`: the sibling has just written it (so its pages are in memory, as
        :class:`lota.cache.store.reader.Warm` asks), unless this worker knew better."""
        if not path.startswith("/"):
            return
        known = self._paths.get(chunk)
        if known is None or (known.path, known.length) != (path, length):
            known = Known(path, length, (0, length) if written else None, time.monotonic())
        self._paths[chunk] = known
        self._paths.move_to_end(chunk)
        while len(self._paths) > self._max_kept * PATHS_PER_DESCRIPTOR:
            self._paths.popitem(last=False)

    def _forget(self, chunk: ChunkId) -> None:
        """No longer keep `chunk`'s descriptor (dropped already: closed once unused)."""
        opened = self._kept.pop(chunk)
        self._kept_bytes -= opened.length

    def _keep(self, chunk: ChunkId, opened: OpenChunk, *, again: bool = False) -> None:
        """Keep `opened`, as the most recently read unless it is opened `again` from its
        path while as many as may be are kept (as lota.cache.store.fdcache.FdCache does)."""
        if opened.length > KEPT_BYTES:  # more than all kept may pin: read, then closed
            opened.drop()
            return
        recent = True
        if again and len(self._kept) >= self._max_kept:
            self._opened_again += 1
            recent = self._opened_again % KEEP_EVERY == 0
        while self._kept and (
            len(self._kept) >= self._max_kept or self._kept_bytes + opened.length > KEPT_BYTES
        ):
            key, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.length
            old.drop()
            known = self._paths.get(key)
            if known is not None and (known.path, known.length) == (old.path, old.length):
                self._paths[key] = Known(old.path, old.length, old.warm, old.used_at)
        self._kept[chunk] = opened
        self._kept_bytes += opened.length
        if not recent:
            self._kept.move_to_end(chunk, last=False)

    def close(self) -> None:
        for opened in self._kept.values():
            opened.drop()
        self._kept.clear()
        self._kept_bytes = 0
        self._paths.clear()
        self._fds.close()


class _FromSibling:
    """A sibling's answer, counted as the sibling's (``lota_cache_bytes{source="sibling"}``)."""

    kind: SourceKind = "sibling"

    def __init__(self, reply: SourceReply) -> None:
        self._reply = reply
        self.status = reply.status
        self.headers = reply.headers

    async def read(self, count: int) -> bytes:
        return await self._reply.read(count)

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        while piece := await self.read(size):
            yield piece
