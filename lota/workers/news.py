"""What a worker tells its siblings as it learns it: :class:`News`.

Without it, every worker of a node reads each object the slow way once before it can
answer it as it arrives (:mod:`lota.node.at_once`): it asks the object's metadata home
for the metadata and the chunk's owner for its descriptor, through aiohttp's whole request
path. So a worker that learns something tells every sibling at once:

- an object's metadata the origin itself answered (asked, or checked again; not a copy
  another worker or node held), with the moment it was asked (``time.monotonic()``, one
  clock for the machine): a sibling that dropped or replaced any entry after that moment
  (a write), or that started after it, lets it pass, as it would its own answer asked
  before an invalidation; a sibling that checked the object more recently keeps its own;
- a chunk it published: the sibling remembers the chunk's file
  (:meth:`lota.workers.siblings.SiblingSource.remember`), if it is one of the node's
  cache files, and opens it when read;
- a request it remembered to answer from its bytes (:mod:`lota.node.at_once`): the
  sibling remembers it too, with the verdict as given (the sibling is this node's own
  process, reached only through the node's private socket directory), so that whichever
  worker the next read of a URL reaches answers it from its bytes;
- every :data:`READS_EVERY` seconds, how many times it read each of the sibling's chunks
  from its own descriptor of the chunk's file, by the file's name (:class:`SiblingSource`;
  a hand-over is not a read): the sibling's eviction and admission count them as its own hits
  (:meth:`lota.cache.store.CacheStore.told_reads`). Without them, the owner of a chunk
  would hear of only its own worker's share of the reads, and with several workers keep
  the wrong chunks (``python -m bench.admission`` measured what that costs).

News goes over the descriptor sockets (:mod:`lota.workers.fds`), one line per batch:
what is learnt while a batch is on its way goes in the next. It is a hint, never needed
for a right answer: a sibling that is restarting, or too slow to hear (more than
:data:`MAX_WAITING` bytes of news waiting for it), misses news and reads those objects
the slow way. Counted in ``lota_worker_news_total{result}``: sent, dropped (too much waiting, or
an item too large for a line), unsent (the sibling did not take the line in time); heard,
stale (metadata let pass), refused (malformed, or not a cache file).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from lota.cache.service import ChunkService
from lota.cache.store import ObjectMeta
from lota.metrics import Metrics
from lota.tasks import TaskGroup
from lota.workers.fds import MAX_REQUEST, FdClient
from lota.workers.siblings import SiblingSource

log = logging.getLogger("lota.workers")

# Bytes of items waiting for one sibling, at most: beyond, news is dropped.
MAX_WAITING = 4 * 1024 * 1024
# Bytes of items in one line, at most (the descriptor socket's bound on a request).
MAX_BATCH = MAX_REQUEST // 2
# Seconds between two news of the reads of a sibling's chunks served here.
READS_EVERY = 1.0
# Reads of one chunk told at once, at most (a sibling telling more is refused).
MAX_TIMES = 1 << 24
# Chunks whose reads are taken and encoded together (then halved until the item fits
# MAX_BATCH), the loop serving between two groups.
_READS_GROUP = 256
# Chunks whose told reads are counted together, the loop serving between two groups.
_HEARD_GROUP = 64


class News:
    """Tells the siblings what this worker's store learns (its :class:`Watcher
    <lota.cache.store.Watcher>`), and hears what they learn."""

    def __init__(
        self,
        me: int,
        cache: ChunkService,
        siblings: Mapping[int, SiblingSource],
        clients: Mapping[int, FdClient],
        metrics: Metrics,
        dirs: Sequence[str],
    ) -> None:
        """`dirs`: this worker's cache directories (``DIR/worker-K``: its siblings' are
        next to them)."""
        self._me = me
        self._roots = tuple(os.path.dirname(os.path.abspath(d)) + os.sep for d in dirs)
        self._cache = cache
        self._siblings = siblings
        self._outboxes = {k: _Outbox(k, client, self) for k, client in clients.items()}
        self._counts = {
            result: metrics.worker_news.labels(result)
            for result in ("sent", "dropped", "unsent", "heard", "stale", "refused")
        }
        self._reads = {
            result: metrics.worker_sibling_reads.labels(result)
            for result in ("told", "untold", "heard", "unknown")
        }
        self._tasks = TaskGroup("news")
        self._answers: Callable[[Mapping[str, Any]], bool] = lambda told: False
        if siblings:
            self._tasks.start(self._tell_reads_every(), "reads")

    # -- telling ----------------------------------------------------------------------

    def admitted(self, meta: ObjectMeta, since: float) -> None:
        self._post({"meta": asdict(meta), "since": since})

    def answered(self, told: dict[str, Any]) -> None:
        """A request remembered to be answered at once (JSON-able, as
        :meth:`lota.node.at_once.AtOnce.heard` takes it)."""
        self._post({"answer": told})

    def hear_answers(self, hearer: Callable[[Mapping[str, Any]], bool]) -> None:
        """Have `hearer` take the requests siblings remembered (False: malformed)."""
        self._answers = hearer

    def published(self, meta: ObjectMeta, index: int, path: str, length: int) -> None:
        chunk = [meta.bucket, meta.key, meta.etag, index]
        self._post({"chunk": chunk, "path": path, "length": length})

    async def tell_reads(self) -> None:
        """Tell each sibling how many times each of its chunks was read here since the
        last time (:meth:`SiblingSource.take_reads`), a group of chunks at a time with the
        loop serving in between (tens of thousands of chunks a second, taken at once, held it
        for milliseconds); chunks first read meanwhile wait for the next time."""
        for k, source in self._siblings.items():
            box = self._outboxes.get(k)
            self._reads["untold"].inc(source.take_untold())
            for _ in range(-(-source.reads_waiting // _READS_GROUP)):
                reads = source.take_reads(_READS_GROUP)
                if reads and box is not None:
                    entries = [[name, times] for name, times in reads.items()]
                    for item, times in _reads_items(entries):
                        if self._put(box, item):
                            self._reads["told"].inc(times)
                await asyncio.sleep(0)

    async def _tell_reads_every(self) -> None:
        while True:
            await asyncio.sleep(READS_EVERY)
            try:
                await self.tell_reads()
            except Exception:  # a hint: the next second's reads are told all the same
                log.exception("telling the siblings their chunks' reads failed")

    def _post(self, item: dict[str, Any]) -> None:
        encoded = json.dumps(item, separators=(",", ":")).encode()
        for box in self._outboxes.values():
            self._put(box, encoded)

    def _put(self, box: _Outbox, encoded: bytes) -> bool:
        """Whether `encoded` waits for the sibling now (else it is dropped, and counted)."""
        if len(encoded) > MAX_BATCH:  # metadata beyond any S3 object's: not worth a line
            self.count("dropped", 1)
            return False
        return box.put(encoded)

    def start(self, box: _Outbox) -> None:
        self._tasks.start(box.send(), f"to worker-{box.index}")

    def count(self, result: str, items: int) -> None:
        self._counts[result].inc(items)

    def line(self, items: list[bytes]) -> bytes:
        return b'{"from":%d,"news":[%b]}\n' % (self._me, b",".join(items))

    async def close(self) -> None:
        await self._tasks.close()

    # -- hearing ----------------------------------------------------------------------

    async def hear(self, told: dict[str, Any]) -> None:
        """A sibling's news (one line, parsed), taken in."""
        sibling = self._siblings.get(int(told["from"]))
        for item in told["news"]:
            try:
                if "meta" in item:
                    result = await self._admit(_meta(item["meta"]), float(item["since"]))
                elif "answer" in item:
                    result = "heard" if self._answers(item["answer"]) else "refused"
                elif "reads" in item:
                    result = await self._count_reads(item["reads"])
                else:
                    result = self._remember(sibling, item)
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                log.debug("news refused: %r (%r)", item, exc)
                result = "refused"
            self._counts[result].inc()

    async def _admit(self, meta: ObjectMeta, since: float) -> str:
        if since <= self._cache.changed_at:
            return "stale"  # it may predate a write this worker was told of, or missed
        current = self._cache.lookup(meta.bucket, meta.key)
        if current is not None and current.meta.validated_at >= meta.validated_at:
            return "heard"  # checked here as recently: this worker's own word stands
        await self._cache.admit(meta, since=since)
        return "heard"

    async def _count_reads(self, entries: list[list[Any]]) -> str:
        """Count a sibling's reads of this worker's chunks, a few at a time with the loop
        serving in between (a line of them held it for milliseconds)."""
        refused = False
        for n, (name, times) in enumerate(entries):
            if n and n % _HEARD_GROUP == 0:
                await asyncio.sleep(0)
            if not 0 < int(times) <= MAX_TIMES:
                refused = True
                continue
            try:
                known = self._cache.told_reads(str(name), int(times))
            except ValueError:  # not the name of a chunk file, or of one of its object's
                refused = True
                continue
            self._reads["heard" if known else "unknown"].inc(int(times))
        return "refused" if refused else "heard"

    def _remember(self, sibling: SiblingSource | None, item: dict[str, Any]) -> str:
        bucket, key, etag, index = item["chunk"]
        path = str(item["path"])
        if sibling is None or os.path.normpath(path) != path or not path.startswith(self._roots):
            return "refused"
        chunk = (str(bucket), str(key), str(etag), int(index))
        sibling.remember(chunk, path, int(item["length"]), written=True)
        return "heard"


class _Outbox:
    """The news waiting for one sibling, sent one line at a time."""

    def __init__(self, index: int, client: FdClient, news: News) -> None:
        self.index = index
        self._client = client
        self._news = news
        self._waiting: list[bytes] = []
        self._waiting_bytes = 0
        self._sending = False

    def put(self, item: bytes) -> bool:
        if self._waiting_bytes + len(item) > MAX_WAITING:
            self._news.count("dropped", 1)
            return False
        self._waiting.append(item)
        self._waiting_bytes += len(item)
        if not self._sending:
            self._sending = True
            self._news.start(self)
        return True

    async def send(self) -> None:
        try:
            while self._waiting:
                batch, size = [], 0
                for item in self._waiting:
                    if size + len(item) > MAX_BATCH:
                        break
                    batch.append(item)
                    size += len(item) + 1
                del self._waiting[: len(batch)]
                self._waiting_bytes -= sum(map(len, batch))
                try:
                    await self._client.tell(self._news.line(batch))
                except OSError as exc:  # restarting: what it missed, it reads the slow way
                    log.debug("worker-%d did not hear %d news: %r", self.index, len(batch), exc)
                    self._news.count("unsent", len(batch))
                    continue
                self._news.count("sent", len(batch))
        finally:
            self._sending = False


def _reads_items(entries: list[list[Any]]) -> Iterator[tuple[bytes, int]]:
    """``{"reads": entries}`` (``[name, times]`` each), encoded, in as many items as keep
    each within MAX_BATCH (one too large alone is left to be dropped), each with the reads
    it tells."""
    encoded = b'{"reads":%b}' % json.dumps(entries, separators=(",", ":")).encode()
    if len(encoded) <= MAX_BATCH or len(entries) == 1:
        yield encoded, sum(entry[-1] for entry in entries)
        return
    half = len(entries) // 2
    yield from _reads_items(entries[:half])
    yield from _reads_items(entries[half:])


def _meta(raw: dict[str, Any]) -> ObjectMeta:
    """An :class:`ObjectMeta` from its JSON form (``asdict``)."""
    return ObjectMeta(
        bucket=str(raw["bucket"]),
        key=str(raw["key"]),
        etag=str(raw["etag"]),
        size=int(raw["size"]),
        last_modified=str(raw["last_modified"]),
        headers=tuple((str(n), str(v)) for n, v in raw["headers"]),
        version_id=str(raw["version_id"]),
        validated_at=float(raw["validated_at"]),
        parts=tuple((int(a), int(b), int(c)) for a, b, c in raw["parts"]),
    )
