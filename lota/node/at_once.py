"""Small hits answered as their connection parses them: :class:`AtOnce`.

A 64 KiB hit handled the usual way (:meth:`lota.node.front.Front.handle`) costs more in
aiohttp's task, request and response objects than in the hit itself. The connection
(:mod:`lota.node.listener`) offers each GET without a body that arrives while it has nothing
else in hand to :meth:`AtOnce.answer`, which takes the front end's steps (target, SigV4
verdict, cacheable, :meth:`lota.cache.reads.ReadPath.plan_hit`, then
:meth:`~lota.cache.reads.ReadPath.hit`) and returns the response (its head, and its
body as bytes or as a span of the chunk's file that the page cache holds), counted and
logged as the front end counts and logs; or declines, with nothing
counted, and the front end answers the request as if it had never been offered. A hit
whose bytes are not at hand (its chunk's pages gone from the page cache, its file not yet
opened here, or held by another worker) waits while they are brought to hand, read on a
thread or handed over by that worker (:class:`Reading`, a
:class:`lota.node.listener.Later`), then is answered as any other: the front end's
request and response objects cost more than the read.

With a catalog, a GET may be of a key with a version on its way home, served from
staging: a request first waits (:class:`lota.node.listener.Later`) for the worker's mirror
of pending keys to hear every write committed before it came
(:class:`lota.regions.pending.PendingKeys`), and is declined if its key is among them. Its
read is recorded as the object's last access, as the front end records it.

A request answered once is remembered, by its exact request line and header section (by
the bytes it came in as, when the connection saw them whole): the same request again (a
loader reading the same presigned URL each epoch, on any connection) is answered from
what was decided the first time, while the verdict holds (the signature's validity
window), the cache entry is alive and fresh, and its bytes are at hand; the headers are
written once, but for Date. Offered as bytes (:meth:`AtOnce.again`), it is answered
before it is even parsed. A GET the front end answered (a miss, filled) is remembered
too (:meth:`AtOnce.learn`), with nothing counted or read, so that the second read of a
URL is already answered so. Each request remembered by its bytes is told to the node's
other workers (:meth:`AtOnce.heard`), which remember it too, planned by their own cache,
its verdict as given: the next read of the URL is answered from its bytes by whichever
worker it reaches. Bounded by what the remembered requests hold
(:data:`MAX_CHARS`), least recently used forgotten first. A request signed in an
Authorization header is not remembered: its client signs every request afresh.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from multidict import CIMultiDict, CIMultiDictProxy

from lota.aiohttp_internals import http_date
from lota.auth import Authenticator, Window, window
from lota.auth.sigv4 import RequestView
from lota.cache.reads import HitPlan
from lota.logs import AccessLog
from lota.lru import SizedLru
from lota.metrics import LaterCount, Metrics
from lota.node.features import CacheFeature, CatalogFeature
from lota.node.listener import Answers, Later, Reply, Response
from lota.node.node import Drain
from lota.node.requests import next_request_id
from lota.s3.addressing import Target, is_admin, parse_target
from lota.s3.operations import Op
from lota.tasks import TaskGroup
from lota.zerocopy import FileSpan

# What aiohttp refuses in a header (it could split the head): control characters but tab.
_FORBIDDEN_IN_HEADERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Characters of the requests remembered (request line, headers, response head), at most:
# some 30,000 presigned GETs of ~830 characters, which hold ~1.3 KB each in memory (the
# plan and the verdict's window besides): ~40 MB per worker at most.
MAX_CHARS = 24 * 1024 * 1024

# A request remembered: the bytes it came in as, or its path and headers as parsed.
RequestKey = bytes | tuple[str, tuple[tuple[bytes, bytes], ...]]


@dataclass(frozen=True, slots=True)
class Remembered:
    """A request answered at once, ready to be answered again."""

    valid: Window | None
    """When its verdict holds (:func:`lota.auth.window`)."""
    plan: HitPlan
    head: bytes
    """The response's status line and headers, all but Date and Server."""
    principal: str
    path: str
    """The request's target, as the access log names it."""
    size: int
    """The body's length."""
    counted: LaterCount
    """The count of requests answered with its status."""


@dataclass(frozen=True, slots=True)
class Reading(Later):
    """A hit whose bytes were not at hand, waiting while they are brought to hand: `ready`
    says whether they were, for `message` alone (what is queued behind it is offered again
    as any other request)."""

    message: RawRequestMessage
    known: Remembered


class AtOnce(Answers):
    """Answers the small hits a node can answer without waiting (see the module)."""

    def __init__(
        self,
        *,
        domain: str,
        auth: Authenticator,
        metrics: Metrics,
        access_log: AccessLog,
        drain: Drain,
        cache: CacheFeature,
        catalog: CatalogFeature,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self._domain = domain
        self._auth = auth
        self._access_log = access_log
        self._drain = drain
        self._cacheable: Callable[[Target, Mapping[str, str]], bool] = cache.cacheable
        self._plan_hit = cache.plan_hit
        self._plan_holds = cache.holds
        self._hit = cache.hit
        self._bring_to_hand = cache.bring_to_hand
        self._bringing = TaskGroup("hits brought to hand")  # Reading's
        # The other workers of the node hear of each request remembered by its bytes, and
        # remember it too (without verifying it again): a URL read once per epoch is
        # answered from its bytes by whichever worker its next read reaches.
        self._tell = cache.tell_answered
        cache.hear_answered(self.heard)
        # With a catalog, a read may be of a version still on its way home: it waits for
        # the mirror of pending keys to hear of the writes before it (Later), then asks it.
        self._pending = catalog.pending if catalog.on else None
        self._access = catalog.access if catalog.on else None
        self._off = not cache.on or (catalog.on and catalog.pending is None)
        # Nothing is answered from its bytes alone with a catalog: each read asks it first.
        self._off_again = self._off or self._pending is not None
        self._remembered: SizedLru[RequestKey, Remembered] = SizedLru(max_chars)
        self._second = -1
        self._tail = b""
        # The metrics every hit answered here counts, labelled once, counted as plain
        # numbers until they are read.
        get = Op.GET_OBJECT
        self._bytes_out = metrics.later(metrics.bytes_out)
        self._counts = {
            status: metrics.later(metrics.requests.labels(get, str(status)))
            for status in (200, 206)
        }
        self._cached = metrics.later(metrics.cache_requests.labels("HIT"))
        self._seconds = metrics.later_histogram(
            metrics.request_seconds.labels(get), metrics.cache_request_seconds.labels("HIT")
        )

    async def close(self) -> None:
        """Stop bringing bytes to hand for requests still waiting (their connections are
        gone by now: the drain is over)."""
        await self._bringing.close()

    def answer(
        self,
        message: RawRequestMessage,
        remote: str | None,
        waited: Later | None = None,
        raw: bytes | None = None,
        span: bool = False,
    ) -> Reply:
        """The response to `message` (head and body) to write, counted and logged; None to
        leave it to the front end; with a catalog, first a :class:`Later` (`waited` when
        it is offered again). `raw`: the bytes it came in as, when they were exactly this
        request (it is remembered by them). `span`: the body may be a span of a chunk's
        file (the connection sends it from the page cache). Never raises."""
        if self._off or message.method != "GET" or message.version != HttpVersion11:
            return None
        if isinstance(waited, Reading):
            if waited.message is message:  # counted in flight, as below
                return self._brought(waited, remote, span)
            waited = None  # queued behind it: offered as any other
        if waited is not None:  # counted in flight: answered even if a drain began since
            done = waited.ready
            if done.cancelled() or done.exception() is not None or done.result() is not None:
                return None  # the mirror is failing: the front end meets it and answers
            started = waited.started
        elif self._drain.draining:
            return None
        elif self._pending is not None:
            host = message.headers.get("host")
            if host is None or is_admin(host, message.path, self._domain):
                return None  # never kept waiting for the catalog: probes, metrics
            ready = self._pending.later()
            if ready is None:
                return None
            self._drain.inflight += 1
            return Later(ready, self._drain.finished, time.perf_counter())
        else:
            started = time.perf_counter()
        key: RequestKey = raw if raw is not None else (message.path, message.raw_headers)
        try:
            known = self._recall(key)
            if known is None:
                known = self._first(message, key)
            elif self._held(known.plan.obj.meta.bucket, known.plan.obj.meta.key):
                return None
            body = None if known is None else self._hit(known.plan, span)
        except Exception:  # whatever it is, the front end meets it again and answers it
            return None
        if known is None:
            return None
        if body is None:
            return self._bring(message, known, started)
        return self._send(body, known, remote, started)

    def _bring(self, message: RawRequestMessage, known: Remembered, started: float) -> Reply:
        """`message`'s bytes are not at hand: it waits while they are brought to hand (read
        on a thread, or handed over by the worker that holds them), then :meth:`_brought`;
        declined where that would not help (the cache's `bring_to_hand`)."""
        if self._bring_to_hand is None:
            return None
        bringing = self._bringing.start(self._bring_to_hand(known.plan), known.path)
        self._drain.inflight += 1
        return Reading(bringing, partial(self._over, bringing), started, message, known)

    def _over(self, bringing: asyncio.Task[bool]) -> None:
        """The request that waited for `bringing` is offered again, or was declined at once
        (the front end answers it): a read not begun yet is not wanted."""
        bringing.cancel()
        self._drain.finished()

    def _brought(self, waited: Reading, remote: str | None, span: bool) -> Reply:
        """The response to the request `waited` was made for, its bytes now at hand, counted
        as any hit; None if they could not be brought, or are gone again (the front end
        answers: a missing chunk is fetched)."""
        done = waited.ready
        if done.cancelled() or done.exception() is not None or not done.result():
            return None
        known = waited.known
        try:
            body = self._hit(known.plan, span)
        except Exception:  # as in answer()
            return None
        return None if body is None else self._send(body, known, remote, waited.started)

    def learn(self, message: RawRequestMessage, raw: bytes | None) -> None:
        """Remember `message`, a GET the front end has just answered (a miss, filled), as
        :meth:`answer` would have, so that it is answered at once when it comes again;
        nothing counted, nothing read. `raw`: as for :meth:`answer`. Never raises."""
        if self._off or message.method != "GET" or message.version != HttpVersion11:
            return
        if "authorization" in message.headers or self._drain.draining:
            return  # not to be remembered (see the module); or about to stop
        key: RequestKey = raw if raw is not None else (message.path, message.raw_headers)
        try:
            if self._recall(key) is None:
                self._first(message, key)
        except Exception:  # nothing remembered: it is answered the usual way
            return

    def again(self, raw: bytes, remote: str | None, span: bool = False) -> Response | None:
        """The response to the request that came in as the bytes `raw`, if it was answered
        here before and still holds (see the module): the response to write, counted and
        logged; None to parse it and answer it the usual way. `span` as for
        :meth:`answer`. Never raises."""
        if self._off_again or self._drain.draining:
            return None
        started = time.perf_counter()
        # As _recall, with the plan's freshness checked by the hit itself (this runs for
        # every request answered again); a plan that no longer holds is forgotten then.
        known = self._remembered.get(raw)
        if known is None or not self._auth.holds(known.valid):
            return None
        try:
            body = self._hit(known.plan, span)
            if body is None:
                if not self._plan_holds(known.plan):
                    self._remembered.pop(raw)
                return None
        except Exception:  # answered the usual way, which meets it again
            return None
        return self._send(body, known, remote, started)

    def _recall(self, key: RequestKey) -> Remembered | None:
        """The request remembered as `key`, while its verdict and its plan hold (once
        either does not, it is forgotten; not while its bytes are merely not at hand)."""
        known = self._remembered.get(key)
        if known is None:
            return None
        if self._auth.holds(known.valid) and self._plan_holds(known.plan):
            return known
        self._remembered.pop(key)
        return None

    def heard(self, told: Mapping[str, Any]) -> bool:
        """A request another worker of the node remembered by its bytes (as
        :meth:`_first` tells it), remembered here too, as planned here, its verdict taken as given;
        False if `told` is malformed. Never raises otherwise."""
        try:
            raw = str(told["raw"]).encode("latin-1")
            path = str(told["path"])
            headers = CIMultiDictProxy(CIMultiDict((str(n), str(v)) for n, v in told["headers"]))
            principal = str(told["principal"])
            valid = told["valid"]
            window = None if valid is None else (float(valid[0]), float(valid[1]))
        except (KeyError, TypeError, ValueError, UnicodeError):
            return False
        if self._off or self._recall(raw) is not None:
            return True
        try:
            target = self._target(path, headers)
            if target is not None:
                self._plan(raw, path, headers, target, window, principal)
        except Exception:  # nothing remembered: it is answered the usual way
            pass
        return True

    def _first(self, message: RawRequestMessage, key: RequestKey) -> Remembered | None:
        """The front end's steps for a GET, up to how the cache answers it, remembered as
        `key` unless it is signed in an Authorization header (and, when `key` is its bytes,
        told to the other workers); None when it is not answered at once."""
        headers = message.headers
        target = self._target(message.path, headers)
        if target is None:
            return None
        view = RequestView("GET", target.raw_path, target.query, headers)
        authorized = self._auth.authenticate(view, target.bucket, target.key)
        if authorized.operation.name != Op.GET_OBJECT:
            return None
        principal = authorized.principal.name if authorized.principal is not None else "-"
        valid = window(authorized)
        if "authorization" in headers:
            return self._plan(None, message.path, headers, target, valid, principal)
        known = self._plan(key, message.path, headers, target, valid, principal)
        if known is not None and isinstance(key, bytes):
            told = {
                "raw": key.decode("latin-1"),
                "path": message.path,
                "headers": list(headers.items()),
                "principal": principal,
                "valid": valid,
            }
            self._tell(told)
        return known

    def _target(self, path: str, headers: Mapping[str, str]) -> Target | None:
        """What a GET of `path` reads; None for the node's own endpoints."""
        host = headers.get("host")
        if host is None or is_admin(host, path, self._domain):
            return None
        return parse_target(host, path, self._domain)

    def _plan(
        self,
        key: RequestKey | None,
        path: str,
        headers: Mapping[str, str],
        target: Target,
        valid: Window | None,
        principal: str,
    ) -> Remembered | None:
        """How the cache answers an authorized GET of `target` at once, remembered as `key`
        (not if None); None when it is not answered at once."""
        if not self._cacheable(target, headers) or self._held(target.bucket, target.key):
            return None
        plan = self._plan_hit(headers, target)
        if plan is None:
            return None
        head = _response_head(plan)
        if head is None:
            return None
        size = plan.last - plan.first + 1
        known = Remembered(valid, plan, head, principal, path, size, self._counts[plan.status])
        if isinstance(key, bytes):
            self._remembered.put(key, known, len(key) + len(head) + len(path))
        elif key is not None:
            size = len(path) + len(head) + sum(len(n) + len(v) for n, v in key[1])
            self._remembered.put(key, known, size)
        return known

    def _held(self, bucket: str, key: str) -> bool:
        """Whether the key may have a version on its way home (then the front end reads)."""
        return self._pending is not None and self._pending.holds(bucket, key)

    def _send(
        self,
        body: bytes | bytearray | FileSpan,
        known: Remembered,
        remote: str | None,
        started: float,
    ) -> Response:
        """Count and log the answer to `known` as the front end would, and give it."""
        second = int(time.time())
        if second != self._second:  # the Date header changes once a second at most
            self._second = second
            self._tail = f"Date: {http_date()}\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode()
        size = known.size
        elapsed = time.perf_counter() - started
        self._bytes_out.n += size
        known.counted.n += 1
        self._cached.n += 1
        self._seconds.observe(elapsed)
        if self._access is not None:  # a read served (200 or 206), for tiering
            meta = known.plan.obj.meta
            self._access.record(meta.bucket, meta.key)
        if self._access_log.enabled():
            self._access_log.write(
                remote,
                "GET",
                known.path,
                known.plan.status,
                Op.GET_OBJECT,
                elapsed,
                next_request_id(),
                cache="HIT",
                sent=size,
                principal=known.principal,
            )
        return known.head + self._tail, body


def _response_head(plan: HitPlan) -> bytes | None:
    """The status line and headers of `plan`'s answer as aiohttp writes them for it
    (Content-Length and a default Content-Type added), but for the Date and Server that end
    it; None if a header holds a control character aiohttp refuses (a ``response-*``
    override could: then the front end answers)."""
    fields = [f"{name}: {value}" for name, value in plan.headers]
    if _FORBIDDEN_IN_HEADERS.search("".join(fields)):
        return None
    lines = [f"HTTP/1.1 {plan.status} {HTTPStatus(plan.status).phrase}", *fields]
    lines.append(f"Content-Length: {plan.last - plan.first + 1}")
    if not any(name.lower() == "content-type" for name, _ in plan.headers):
        lines.append("Content-Type: application/octet-stream")
    return ("\r\n".join(lines) + "\r\n").encode()
