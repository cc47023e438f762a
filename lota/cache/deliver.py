"""Sending a byte range of a cached object to the client, chunk by chunk.

Each chunk comes from the first place that has it: the cache (sent zero-copy with
``sendfile`` for large pieces), a fill in progress (followed as it grows), a new fill
from the chunk's source when the :class:`~lota.cache.route.Placement` says to keep it
and the store's admission rule agrees, or else straight from that source (another node
of the cluster, or the origin when the cache cannot hold or does not keep it). A relayed
source that breaks off mid-chunk is resumed where it stopped from the next one. Whatever
happens, the client gets the right bytes or, once headers are out, a cut connection;
never wrong or missing bytes.

Each chunk a client reads that the cache did not send counts once for the admission rule,
once it is sent (after the fill that brought it, if any, asked the rule whether to keep
it); a hit is counted by the store, or, for a chunk another worker holds, by that worker
once told (:meth:`lota.cache.route.OpenedChunk.read`). Fills count nothing: the
look-ahead's are not reads; nor does bringing bytes to hand for a read counted later.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from aiohttp import web
from prometheus_client import Counter

from lota.aiohttp_internals import payload_writer
from lota.cache.fill import ChunkFill
from lota.cache.plan import body_start, pieces
from lota.cache.route import Placement
from lota.cache.service import ChunkService
from lota.cache.source import ByteSource, SourceBroke
from lota.cache.store import CachedObject, read_or_span, read_resident
from lota.errors import LotaError, OriginError
from lota.http import sent_beside
from lota.metrics import Metrics
from lota.threads import run_in_thread, submit
from lota.zerocopy import FileSpan

log = logging.getLogger("lota.cache")

PIECE = 1024 * 1024
# Read size when relaying a source's body to the client.
RELAY_PIECE = 256 * 1024
# A read this small costs less on the event loop than handed to a thread, when the page
# cache holds it (see read_resident); larger ones and cold ones go to the executor.
INLINE_READ = 256 * 1024
# Below this, one pread + write costs less than a hand-off to a sendfile thread.
SENDFILE_MIN = 1024 * 1024
MAX_ATTEMPTS = 3
# Sources a relay may resume from after one broke off mid-body (peers that died).
MAX_RESUMES = 4


Reads = list[Callable[[], None]]
"""Counts of reads to make once a whole answer is found (:meth:`Deliverer.read_now`)."""


class ChunkUnreadable(LotaError, OSError):
    """A cached chunk turned out short, or unreadable (EIO), while being sent."""


class Deliverer:
    """Streams object ranges to clients from the cache, fills and the source."""

    def __init__(
        self,
        cache: ChunkService,
        metrics: Metrics,
        sendfile_threads: int = 32,
        sent: Counter | None = None,
    ) -> None:
        """`sent`: where the bytes sent are counted, by source (default: the clients'
        ``lota_cache_bytes``; the peer endpoint's are counted apart)."""
        self.cache = cache
        self.chunk_size = cache.chunk_size
        self._metrics = metrics
        self._sent = sent if sent is not None else metrics.cache_bytes
        self._sent_hit = metrics.later(self._sent.labels("hit"))
        # Blocking sendfile() runs here, one thread per transfer, off the event loop.
        self._sendfile_pool = ThreadPoolExecutor(
            sendfile_threads, thread_name_prefix="lota-sendfile"
        )

    def close(self) -> None:
        self._sendfile_pool.shutdown(wait=False, cancel_futures=True)

    async def send(
        self,
        request: web.BaseRequest,
        response: web.StreamResponse,
        placement: Placement,
        obj: CachedObject,
        first: int,
        last: int,
    ) -> None:
        """Send bytes first..last (inclusive) of `obj` as the body of `response`, in order,
        while the ``fill_concurrency`` chunks after the one being sent are fetched."""
        last_chunk = last // self.chunk_size
        looked = first // self.chunk_size
        for index, lo, hi in pieces(first, last, self.chunk_size):
            looked = self._look_ahead(placement, obj, index, looked, last_chunk)
            if not await self._chunk(request, response, placement, obj, index, lo, hi, last_chunk):
                self.cache.count_read(obj, index)

    def _look_ahead(
        self, placement: Placement, obj: CachedObject, index: int, looked: int, last: int
    ) -> int:
        """Have the next chunks of the range fetched, each with its own request, while this
        one is sent: a cold read is as fast as several origin streams, not one. Each chunk
        is looked at once (those up to `looked` were): one the cache would not keep is
        asked about once, not each time the window moves. Returns the last one looked at."""
        cache = self.cache
        end = min(last, index + cache.fill_concurrency - 1)
        ahead = [
            i
            for i in range(max(index, looked) + 1, end + 1)
            if not cache.has_chunk(obj, i) and cache.filling(obj, i) is None
        ]
        if ahead:
            placement.prefetch(obj, ahead)
        return max(end, looked)

    async def read_cached(
        self, placement: Placement, obj: CachedObject, first: int, last: int
    ) -> bytes | bytearray | None:
        """Bytes first..last of `obj` (a small range) if this node holds all of them (this
        worker, or another), read on the loop from the page cache or else on a thread; None
        if any chunk is missing or fails its check (then :meth:`send`, which refetches,
        takes over)."""
        found = await self._gather(placement, obj, first, last, count=True)
        return None if found is None else self._hit(found, last - first + 1)

    async def bring_to_hand(
        self, placement: Placement, obj: CachedObject, first: int, last: int
    ) -> bool:
        """Read bytes first..last of `obj` as :meth:`read_cached` does, counting nothing:
        then :meth:`read_now` finds them (their pages in the page cache, each chunk's file
        open here or handed over by the worker that holds it), unless they are dropped
        again meanwhile. False if a chunk is missing or fails its check."""
        return await self._gather(placement, obj, first, last, count=False) is not None

    async def _gather(
        self, placement: Placement, obj: CachedObject, first: int, last: int, *, count: bool
    ) -> list[bytes | bytearray] | None:
        """The bytes, chunk by chunk; `count`: as reads, once every chunk is found (else the
        read comes later, or is served another way: counted there)."""
        found = []
        reads: Reads = []
        for index, lo, hi in pieces(first, last, self.chunk_size):
            data = self.cache.read_hot(obj, index, lo, hi - lo, False, False)  # counted below
            assert not isinstance(data, FileSpan)  # not asked for one
            if data is None:
                data = await self._read_cold(obj, index, lo, hi - lo)
            if data is not None:
                reads.append(partial(self.cache.count_hit, obj, index))
            else:
                data = await self._read_elsewhere(placement, obj, index, lo, hi - lo, reads)
            if data is None:
                return None
            found.append(data)
        if count:
            for read in reads:
                read()
        return found

    def read_now(
        self,
        placement: Placement,
        obj: CachedObject,
        first: int,
        last: int,
        span: bool = False,
    ) -> bytes | bytearray | FileSpan | None:
        """Like :meth:`read_cached`, without waiting: the bytes if every chunk is open here
        already (this worker's, checked; or a descriptor another worker handed over and
        that is kept here) and in the page cache; None otherwise (:meth:`read_cached` may
        still find them). `span`: within one chunk, as a span of its file, to be sent from
        the page cache at once (:func:`lota.cache.store.reader.read_or_span`)."""
        size = last - first + 1
        index, lo = divmod(first, self.chunk_size)
        if lo + size <= self.chunk_size:  # within one chunk: every small hit but a few
            got = self._read_now(placement, obj, index, lo, size, span)
            if got is not None:
                self._sent_hit.n += size
            return got
        found = []
        reads: Reads = []  # counted once every chunk is found (else the caller reads again)
        for index, lo, hi in pieces(first, last, self.chunk_size):
            got = self._read_now(placement, obj, index, lo, hi - lo, False, reads)
            if got is None:
                return None
            assert not isinstance(got, FileSpan)
            found.append(got)
        for read in reads:
            read()
        return self._hit(found, size)

    def _read_now(
        self,
        placement: Placement,
        obj: CachedObject,
        index: int,
        lo: int,
        count: int,
        span: bool,
        reads: Reads | None = None,
    ) -> bytes | bytearray | FileSpan | None:
        """`count` bytes at `lo` of chunk `index`, as :meth:`read_now` reads them; counted
        as a read, or, if `reads`, its count added to them."""
        got = self.cache.read_hot(obj, index, lo, count, span, reads is None)
        if got is not None:
            if reads is not None:
                reads.append(partial(self.cache.count_hit, obj, index))
            return got
        opened = placement.kept_elsewhere(obj, index)
        if opened is None:
            return None
        try:  # a span of it only while its descriptor stays open here
            spans = span and opened.kept
            got = read_or_span(opened.fd, lo, count, opened, span=spans, short=opened.drop)
        finally:
            opened.close()
        if got is not None:
            if reads is None:
                opened.read()
            else:
                reads.append(opened.read)
        return got

    def _hit(self, found: list[bytes | bytearray], size: int) -> bytes | bytearray:
        self._sent_hit.n += size
        return found[0] if len(found) == 1 else b"".join(found)

    async def _read_elsewhere(
        self,
        placement: Placement,
        obj: CachedObject,
        index: int,
        lo: int,
        count: int,
        reads: Reads,
    ) -> bytes | bytearray | None:
        """The bytes of a chunk another worker of this node holds, if it does; its count
        (told to that worker) added to `reads`."""
        opened = await placement.open_elsewhere(obj, index)
        if opened is None:
            return None
        try:
            data = await _pread(opened.fd, count, lo)
        except OSError:
            return None
        finally:
            opened.close()
        if len(data) != count:
            return None
        reads.append(opened.read)
        return data

    async def _read_cold(
        self, obj: CachedObject, index: int, lo: int, count: int
    ) -> bytes | bytearray | None:
        """Like :meth:`ChunkService.read_hot` for a chunk not read since start-up (opened,
        and verified if the policy says so, first) or not in the page cache; None if it is
        missing or unreadable. Not counted as a read: the caller counts it."""
        if not self.cache.has_chunk(obj, index):
            return None
        reader = await self.cache.open_chunk(obj, index, read=False)
        if reader is None:
            return None
        try:
            data = await _pread(reader.fd, count, lo)
        except OSError:
            data = b""
        finally:
            reader.close()
        if len(data) != count:
            self.cache.drop_unreadable(obj, index)
            return None
        return data

    async def _chunk(
        self,
        request: web.BaseRequest,
        response: web.StreamResponse,
        placement: Placement,
        obj: CachedObject,
        index: int,
        lo: int,
        hi: int,
        last_chunk: int,
    ) -> bool:
        """Send bytes lo..hi of chunk `index`: True if this node's cache held them."""
        route = None
        for _ in range(MAX_ATTEMPTS):
            if not obj.alive:
                break  # replaced or dropped meanwhile: this version's bytes come from the source
            if self.cache.has_chunk(obj, index):
                reader = await self.cache.open_chunk(obj, index)
                if reader is not None:
                    try:
                        await self._send_file(request, response, reader.fd, lo, hi - lo)
                    except ChunkUnreadable:
                        self.cache.drop_unreadable(obj, index)
                        raise
                    finally:
                        reader.close()
                    self._sent.labels("hit").inc(hi - lo)
                    return True
            fill = self.cache.filling(obj, index)
            if fill is None:
                opened = await placement.open_elsewhere(obj, index)
                if opened is not None:  # another worker of this node holds it
                    opened.read()
                    try:
                        await self._send_file(request, response, opened.fd, lo, hi - lo)
                    finally:
                        opened.close()
                    self._sent.labels("hit").inc(hi - lo)
                    return True
                route = placement.route(obj, index, last_chunk)
                if route.keep:  # filled if the admission rule keeps it
                    m = obj.meta
                    self.cache.fill(route.source, m.bucket, m.key, index, route.last, obj)
                    fill = self.cache.filling(obj, index)
                if fill is None:
                    if self.cache.has_chunk(obj, index):
                        continue  # another fill committed it meanwhile
                    break  # another node's chunk, or one the admission rule does not keep
            elif not self.cache.coming_soon(fill):
                break  # its job is far behind: read these bytes from the source now
            else:
                self._metrics.cache_coalesced.inc()
            lo = await self._follow(response, fill, lo, hi)
            if lo >= hi:
                return False
            if fill.failed:
                break  # the cache cannot take it (or the source failed it): go direct
        route = route or placement.route(obj, index, last_chunk)
        base = index * self.chunk_size
        await self._relay(response, route.source, obj, base + lo, base + hi - 1)
        return False

    async def _follow(self, response: web.StreamResponse, fill: ChunkFill, lo: int, hi: int) -> int:
        """Stream what `fill` writes from `lo` on; return how far it got before it ended."""
        fd: int | None = None
        try:
            while lo < hi:
                if fill.written > lo and fill.path is not None:
                    if fd is None:
                        try:
                            fd = os.open(fill.path, os.O_RDONLY)
                        except FileNotFoundError:
                            # Being committed (renamed) right now: the store has it once
                            # the fill says it is done.
                            while not fill.finished:
                                await fill.wait()
                            return lo
                    count = min(fill.written, hi, lo + PIECE) - lo
                    data = await _pread(fd, count, lo)
                    if not data:
                        return lo
                    await response.write(data)
                    self._sent.labels("fill").inc(len(data))
                    lo += len(data)
                elif fill.finished:
                    return lo
                else:
                    await fill.wait()
        finally:
            if fd is not None:
                os.close(fd)
        return lo

    async def _relay(
        self,
        response: web.StreamResponse,
        source: ByteSource,
        obj: CachedObject,
        first: int,
        last: int,
    ) -> None:
        """Relay bytes first..last of `obj` from `source`, same ETag only; where the
        source breaks off (a peer died), the rest comes from it again: a source that
        stands for several (the owners, then the origin) asks the next one then."""
        for _ in range(MAX_RESUMES):
            try:
                first = await self._relay_once(response, source, obj, first, last)
                return
            except SourceBroke as exc:
                first = exc.resume_at
                log.info("relay of %r broke off at byte %d: %s", obj, first, exc)
        raise OriginError(f"every source broke off relaying {obj!r}")

    async def _relay_once(
        self,
        response: web.StreamResponse,
        source: ByteSource,
        obj: CachedObject,
        first: int,
        last: int,
    ) -> int:
        m = obj.meta
        wanted = f"bytes={first}-{last}"
        async with source.get(m.bucket, m.key, byte_range=wanted, if_match=m.etag) as reply:
            if reply.status not in (200, 206):
                if reply.status == 412 and obj.alive:
                    # The version cached here is gone: the client's retry reads the new one.
                    await self.cache.invalidate(m.bucket, m.key)
                raise OriginError(
                    f"{source.name} answered {reply.status} for a range of a cached object"
                )
            skip = first - body_start(reply.status, reply.headers.get("content-range", ""))
            bytes_sent = self._sent.labels(reply.kind)
            try:
                while first <= last:
                    piece = await reply.read(min(RELAY_PIECE, last - first + 1 + max(skip, 0)))
                    if not piece:
                        raise OriginError(f"{source.name}'s body ended early")
                    if skip > 0:
                        dropped = min(skip, len(piece))
                        piece, skip = piece[dropped:], skip - dropped
                    if piece:
                        await response.write(piece)
                        bytes_sent.inc(len(piece))
                        first += len(piece)
            except SourceBroke as exc:
                exc.resume_at = first
                raise
        return first

    async def _send_file(
        self,
        request: web.BaseRequest,
        response: web.StreamResponse,
        fd: int,
        offset: int,
        count: int,
    ) -> None:
        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if (
            count < SENDFILE_MIN
            or sock is None
            or transport is None
            or transport.get_extra_info("sslcontext")
        ):
            while count > 0:
                size = min(count, PIECE)
                try:
                    data = await _pread(fd, size, offset)
                except OSError as exc:
                    raise ChunkUnreadable(f"cannot read chunk file: {exc}") from exc
                if not data:
                    raise ChunkUnreadable("chunk file shorter than its index entry")
                await response.write(data)
                offset += len(data)
                count -= len(data)
            return
        writer = payload_writer(response)
        assert writer is not None
        writer.send_headers()
        await writer.drain()
        while transport.get_write_buffer_size():  # noqa: ASYNC110 - no event says "flushed"
            await asyncio.sleep(0.001)
        # A duplicate descriptor: if the client goes away and the loop closes the socket,
        # its number cannot be reused under our feet while the thread is still sending.
        out = os.dup(sock.fileno())
        sending = submit(_sendfile, out, fd, offset, count, executor=self._sendfile_pool)
        try:
            await asyncio.shield(sending)
        finally:
            if not sending.done():
                # Cancelled (drain timeout): stop the thread before the descriptors it
                # uses are closed and their numbers reused.
                _shutdown(out)
                await asyncio.wait({sending})
            os.close(out)
        sent_beside(writer, count)


async def _pread(fd: int, count: int, offset: int) -> bytes | bytearray:
    """Like ``os.pread``: on the event loop if small and in the page cache, else on a
    thread, so a cold or failing drive never stalls the loop (a cancelled caller waits for
    the read before it closes `fd`)."""
    if count <= INLINE_READ and (data := read_resident(fd, count, offset)) is not None:
        return data
    return await run_in_thread(os.pread, fd, count, offset)


def _sendfile(out: int, fd: int, offset: int, count: int) -> None:
    """Blocking zero-copy send of a file range to a non-blocking socket."""
    poller = select.poll()
    poller.register(out, select.POLLOUT)
    while count > 0:
        try:
            sent = os.sendfile(out, fd, offset, count)
        except OSError as exc:
            if exc.errno == errno.EIO:  # the drive, not the client (EPIPE, ECONNRESET)
                raise ChunkUnreadable(f"cannot read chunk file: {exc}") from exc
            if not isinstance(exc, BlockingIOError):
                raise
            if not poller.poll(30_000):
                raise TimeoutError("client stopped reading") from None
            continue
        if sent == 0:  # end of the file: a gone client is an error (EPIPE), not 0
            raise ChunkUnreadable("chunk file shorter than its index entry")
        offset += sent
        count -= sent


def _shutdown(fd: int) -> None:
    """Shut a socket down in both directions, by descriptor (which stays open)."""
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()
