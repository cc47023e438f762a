"""The placement of a node's chunks over its worker processes: :class:`Local`.

Each chunk has an owner worker (:func:`lota.cluster.ownership.worker_of`). For a chunk
this worker does not hold:

- its own: filled here from the origin, and kept;
- a sibling's: opened from the sibling if it holds it (sent from here with sendfile), else
  relayed from the sibling, which fills it once for every worker asking; if the sibling
  cannot answer (it is restarting), relayed from the origin, not kept.

Prefetches and warms ask each chunk's owner worker to fill it.

An object's metadata lives with one worker too (:class:`MetadataHome`, by its bucket and
key): a worker that does not know an object asks that sibling, which asks the origin once
for the node (and answers from its entry after that), instead of every worker sending the
origin a HEAD of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp

from lota.cache.layout import chunk_count
from lota.cache.route import Route, Warmed, known_or_learnt, warm_here
from lota.cache.service import ChunkService
from lota.cache.source import ChunkSource, SourceKind, SourceReply
from lota.cache.store import CachedObject
from lota.cluster.ownership import chunk_key, object_key, worker_of
from lota.cluster.peers import OwnersSource, PeerError
from lota.cluster.placement import RemoteFills
from lota.metrics import Metrics
from lota.workers.siblings import OpenChunk, SiblingSource

log = logging.getLogger("lota.workers")


class MetadataHome:
    """The origin, but for an object's metadata (a plain HEAD): the sibling it lives with,
    when that is not this worker; the origin when the sibling cannot answer (restarting,
    in its back-off) or fails. Revalidations and part HEADs go to the origin."""

    def __init__(
        self,
        origin: ChunkSource,
        me: int,
        siblings: Mapping[int, SiblingSource],
        usable: Callable[[str], bool],
    ) -> None:
        self._origin = origin
        self._me = me
        self._siblings = siblings
        self._count = len(siblings) + 1
        self._usable = usable
        self.kind: SourceKind = origin.kind
        self.name = origin.name

    def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> contextlib.AbstractAsyncContextManager[SourceReply]:
        return self._origin.get(bucket, key, byte_range=byte_range, if_match=if_match)

    @asynccontextmanager
    async def head(
        self, bucket: str, key: str, *, part: int | None = None, if_none_match: str = ""
    ) -> AsyncIterator[SourceReply]:
        home = worker_of(object_key(bucket, key), self._count)
        sibling = self._siblings.get(home)
        if part is None and not if_none_match and sibling and self._usable(sibling.name):
            async with AsyncExitStack() as stack:
                try:
                    reply = await stack.enter_async_context(sibling.head(bucket, key))
                except (PeerError, aiohttp.ClientError, OSError) as exc:
                    log.debug("sibling %s did not say what %s/%s is: %r", home, bucket, key, exc)
                else:
                    if reply.status < 500:
                        yield reply
                        return
        async with self._origin.head(bucket, key, part=part, if_none_match=if_none_match) as reply:
            yield reply


class Local:
    """Where one bucket's chunks come from and are kept on a node of several workers."""

    spread = True

    def __init__(
        self,
        cache: ChunkService,
        origin: ChunkSource,
        me: int,
        siblings: Mapping[int, SiblingSource],
        fills: RemoteFills,
        usable: Callable[[str], bool],
        metrics: Metrics,
    ) -> None:
        self.cache = cache
        self.origin = origin
        self.metadata: ChunkSource = MetadataHome(origin, me, siblings, usable)
        self._me = me
        self._siblings = siblings
        self._count = len(siblings) + 1
        self._fills = fills
        self._usable = usable
        self._metrics = metrics

    def _owner(self, obj: CachedObject, index: int) -> int:
        m = obj.meta
        return worker_of(chunk_key(m.bucket, m.key, m.etag, index), self._count)

    def remote(self, obj: CachedObject, index: int) -> bool:
        return False

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        owner = self._owner(obj, index)
        if owner == self._me:
            return Route(self.origin, keep=True, last=index)
        source = OwnersSource([self._siblings[owner]], self.origin, self._usable, self._metrics)
        return Route(source, keep=False, last=index)

    async def open_elsewhere(self, obj: CachedObject, index: int) -> OpenChunk | None:
        owner = self._owner(obj, index)
        if owner == self._me:
            return None
        return await self._siblings[owner].open(obj.meta, index)

    def kept_elsewhere(self, obj: CachedObject, index: int) -> OpenChunk | None:
        owner = self._owner(obj, index)
        if owner == self._me:
            return None
        return self._siblings[owner].kept(obj.meta, index)

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        mine, theirs = self._split(obj, indexes)
        if mine:
            self.cache.fill_each(self.origin, obj, mine)
        for owner, chunks in theirs.items():
            self._fills.ask(self._siblings[owner].name, obj, chunks)

    async def warm(
        self, bucket: str, key: str, known: CachedObject | None, size: int = -1
    ) -> Warmed:
        obj = await known_or_learnt(self.cache, self.metadata, bucket, key, known)
        if obj is None:
            return Warmed(failed=1)
        done = await self.warm_chunks(obj, range(chunk_count(obj.meta.size, self.cache.chunk_size)))
        done.fetched = done.fetched or known is None
        return done

    async def warm_chunks(self, obj: CachedObject, indexes: Sequence[int]) -> Warmed:
        mine, theirs = self._split(obj, indexes)
        m = obj.meta
        parts = [warm_here(self.cache, self.origin, m.bucket, m.key, obj, mine)] if mine else []
        parts += [
            self._fills.fill(self._siblings[owner].name, obj, chunks)
            for owner, chunks in theirs.items()
        ]
        done = Warmed()
        for part in await asyncio.gather(*parts):
            done.add(part)
        return done

    def _split(
        self, obj: CachedObject, indexes: Sequence[int]
    ) -> tuple[list[int], dict[int, list[int]]]:
        """`indexes` as this worker's chunks and, per sibling, the chunks it owns."""
        mine: list[int] = []
        theirs: dict[int, list[int]] = {}
        for index in indexes:
            owner = self._owner(obj, index)
            if owner == self._me:
                mine.append(index)
            else:
                theirs.setdefault(owner, []).append(index)
        return mine, theirs
