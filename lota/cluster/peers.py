"""Asking the other nodes: :class:`PeerClient`, each peer as a :class:`PeerSource`, and the
owners of a chunk, then its origin, as one source (:class:`OwnersSource`).

Every request is signed with the cluster secret (:mod:`lota.cluster.signing`) and goes
one hop: the node asked answers from its own cache or its own origin, never from another
node. What the peer endpoint answers is described in :mod:`lota.cluster.endpoint`.

A peer that cannot be reached, or does not answer within ``[cluster] timeout`` (plus
``origin_timeout``, which its own origin may take), is a :class:`PeerError`, and
:class:`~lota.cluster.members.Membership` is told: the peer is skipped for its back-off.
A body that breaks off raises :class:`~lota.cache.source.SourceBroke`, so the relay
resumes from the next owner or the origin.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
from yarl import URL

from lota.aiohttp_internals import extend_read_timeout
from lota.cache.route import Warmed
from lota.cache.source import ByteSource, SourceBroke, SourceKind, SourceReply
from lota.cluster.members import Membership
from lota.cluster.signing import sign
from lota.errors import LotaError
from lota.http import encode_query
from lota.metrics import Metrics
from lota.regions.origin import BODY_READ_TIMEOUT

log = logging.getLogger("lota.cluster")

OBJECT = "/_lota/peer/object"
FILL = "/_lota/peer/fill"
INVALIDATE = "/_lota/peer/invalidate"
PING = "/_lota/peer/ping"
# Connections to all peers at once, and to one.
POOL_SIZE = 1024
POOL_PER_PEER = 64


class PeerError(LotaError):
    """A peer could not be reached, or did not answer in time."""


def peer_session(timeout: float, origin_timeout: float) -> aiohttp.ClientSession:
    """The node's one HTTP session to its peers: `timeout` to connect; the head of an
    answer may take what the peer's own origin may, plus `timeout` (an owner answers
    with its head at once); its body may pause as an origin's may."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL_SIZE, limit_per_host=POOL_PER_PEER),
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=timeout, sock_read=origin_timeout + timeout
        ),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class PeerClient:
    """Signed requests from this node (`me`) to the others."""

    def __init__(
        self,
        me: str,
        secret: bytes,
        membership: Membership,
        session: aiohttp.ClientSession | None,
        metrics: Metrics,
        *,
        scheme: str = "http",
        sessions: Mapping[str, aiohttp.ClientSession] | None = None,
        dial: Mapping[str, str] | None = None,
    ) -> None:
        """`sessions`: members reached through a session of their own (the workers of this
        node, each on its Unix socket, counted as workers' calls); the others through
        `session` (other nodes, counted as peers'), at their `dial` address if they have one."""
        self.me = me
        self.membership = membership
        self.metrics = metrics
        workers = sessions is not None
        self.requests = metrics.worker_requests if workers else metrics.peer_requests
        self.bytes_in = metrics.worker_bytes_in if workers else metrics.peer_bytes_in
        self._secret = secret
        self._session = session
        self._scheme = scheme
        self._sessions = sessions or {}
        self._dial = dial or {}
        self._sources: dict[str, PeerSource] = {}

    def source(self, member: str) -> PeerSource:
        """`member` as a source of chunks."""
        found = self._sources.get(member)
        if found is None:
            found = self._sources[member] = PeerSource(self, member)
        return found

    @asynccontextmanager
    async def request(
        self,
        member: str,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]],
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one signed request; yield the response, its body unread. :class:`PeerError`
        when `member` cannot be reached or does not answer in time."""
        qs = encode_query(query)
        target = f"{path}?{qs}" if qs else path
        signed = sign(self._secret, method, target, self.me, time.time(), headers or {})
        session = self._sessions.get(member)
        base = "http://localhost"  # a Unix socket's
        if session is None:
            session, base = self._session, f"{self._scheme}://{self._dial.get(member, member)}"
        if session is None:
            raise PeerError(f"no way to reach {member}")
        try:
            response = await session.request(
                method,
                URL(f"{base}{target}", encoded=True),
                headers=signed,
                allow_redirects=False,
                skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.membership.failed(member, time.monotonic())
            result = "timeout" if isinstance(exc, TimeoutError) else "unreachable"
            self.requests.labels(result).inc()
            log.info("peer %s: %s %s failed: %r", member, method, path, exc)
            raise PeerError(f"peer {member} {result}: {exc!r}") from exc
        self.membership.answered(member)
        # The head came in time: the body may pause as long as an origin's may (the
        # owner relays what its origin sends), without the peer being taken for dead.
        extend_read_timeout(response, BODY_READ_TIMEOUT)
        try:
            yield response
        finally:
            response.release()

    async def ping(self, member: str) -> bool:
        """Whether `member` answers (the refresh probes members that failed)."""
        try:
            async with self.request(member, "GET", PING, []) as response:
                return response.status == 200
        except PeerError:
            return False

    async def fill(
        self, member: str, bucket: str, key: str, etag: str, chunks: Sequence[int]
    ) -> Warmed:
        """Have `member` fill these chunks of version `etag` into its cache; wait for it."""
        query = [("bucket", bucket), ("key", key), ("chunks", ",".join(map(str, chunks)))]
        try:
            async with self.request(member, "POST", FILL, query, {"if-match": etag}) as response:
                if response.status != 200:
                    return Warmed(failed=len(chunks))
                done = json.loads(await response.read())
        except (PeerError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("peer %s could not fill %s/%s: %r", member, bucket, key, exc)
            return Warmed(failed=len(chunks))
        return Warmed(
            filled=int(done.get("filled", 0)),
            cached=int(done.get("cached", 0)),
            failed=int(done.get("failed", 0)),
            fetched=True,
        )

    async def invalidate(self, member: str, bucket: str, key: str) -> bool:
        """Have `member` drop its cached copy of (bucket, key); whether it did."""
        query = [("bucket", bucket), ("key", key)]
        try:
            async with self.request(member, "POST", INVALIDATE, query) as response:
                return response.status == 200
        except PeerError:
            return False


class PeerSource:
    """One peer as a :class:`~lota.cache.source.ByteSource`: the chunks it owns."""

    kind: SourceKind = "peer"

    def __init__(self, client: PeerClient, member: str) -> None:
        self._client = client
        self.name = member

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[PeerReply]:
        headers = {"range": byte_range, "if-match": if_match}
        query = [("bucket", bucket), ("key", key)]
        client = self._client
        async with client.request(self.name, "GET", OBJECT, query, headers) as response:
            if response.status in (200, 206):
                result = response.headers.get("x-lota-cache", "").lower() or "hit"
            else:
                result = "stale" if response.status == 412 else "error"
            client.requests.labels(result).inc()
            yield PeerReply(response, self.name, client)

    @asynccontextmanager
    async def head(self, bucket: str, key: str) -> AsyncIterator[PeerReply]:
        """The object's metadata as the peer knows it, fresh (it asks its origin when it
        does not): 200 with the object's headers and ``x-lota-validated-at``, or what its
        origin refused with."""
        query = [("bucket", bucket), ("key", key)]
        client = self._client
        async with client.request(self.name, "HEAD", OBJECT, query) as response:
            client.requests.labels("meta" if response.status < 500 else "error").inc()
            yield PeerReply(response, self.name, client)


class PeerReply:
    """A peer's answer as a :class:`~lota.cache.source.SourceReply`."""

    __slots__ = ("_client", "_content", "_member", "headers", "status")
    kind: SourceKind = "peer"

    def __init__(self, response: aiohttp.ClientResponse, member: str, client: PeerClient):
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self._content = response.content
        self._member = member
        self._client = client

    async def read(self, count: int) -> bytes:
        try:
            piece = await self._content.read(count)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            client = self._client
            client.membership.failed(self._member, time.monotonic())
            client.requests.labels("broken").inc()
            raise SourceBroke(f"peer {self._member} broke off: {exc!r}") from exc
        self._client.bytes_in.inc(len(piece))
        return piece

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        while piece := await self.read(size):
            yield piece


class OwnersSource:
    """A chunk's owners in order, then its origin, as one source: each is asked in turn
    until one answers with the bytes (or says the version is gone: 412). Owners in their
    back-off are skipped without asking."""

    kind: SourceKind = "peer"

    def __init__(
        self,
        owners: Sequence[ByteSource],
        origin: ByteSource,
        usable: Callable[[str], bool],
        metrics: Metrics,
    ) -> None:
        self._owners = owners
        self._origin = origin
        self._usable = usable
        self._metrics = metrics
        self.name = owners[0].name if owners else origin.name

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[SourceReply]:
        failed = False
        for peer in self._owners:
            if not self._usable(peer.name):
                failed = True
                continue
            if failed:
                self._metrics.peer_fallbacks.labels("peer").inc()
            async with AsyncExitStack() as stack:
                try:
                    answer = await stack.enter_async_context(
                        peer.get(bucket, key, byte_range=byte_range, if_match=if_match)
                    )
                except PeerError:
                    failed = True
                    continue
                if answer.status in (200, 206, 412):
                    yield answer
                    return
                failed = True  # refused, or its origin failed it: try the next one
        if failed:
            self._metrics.peer_fallbacks.labels("origin").inc()
        async with self._origin.get(bucket, key, byte_range=byte_range, if_match=if_match) as reply:
            yield reply
