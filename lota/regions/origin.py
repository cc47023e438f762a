"""The origin client: LOTA's own signed requests to one region's S3 endpoint.

Every request is path-style (``endpoint/bucket/key``), signed with the region's service
credentials (SigV4, ``UNSIGNED-PAYLOAD`` unless told otherwise) and streamed both ways:
the request body is an async iterator, the response is handed back unread. Failures to
reach the origin are translated here, once, into :class:`OriginError`.

Two read timeouts: the session's ``sock_read`` is the wait for the response head, which
aiohttp counts from the request's last byte sent (``origin_timeout``: an origin that
accepts and never answers fails fast, and a revalidation can serve STALE); once the head
is in, the body may go ``body_read_timeout`` between bytes (a long streaming download).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from lota.aiohttp_internals import extend_read_timeout
from lota.auth.sigv4 import sign_headers
from lota.clock import Clock
from lota.config import RegionConfig
from lota.errors import LotaError, OriginError
from lota.http import encode_query, uri_encode
from lota.metrics import Metrics

log = logging.getLogger("lota.origin")

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Seconds a response body may go without a byte once its head has arrived.
BODY_READ_TIMEOUT = 120.0
# Connections to all origins at once (the node's one session); each holds a descriptor.
POOL_SIZE = 512
Body = bytes | AsyncIterable[bytes] | None


class BodyFailed(LotaError):
    """Raised inside aiohttp when the request body source failed; carries the real cause."""


class OriginClient:
    """Sends signed requests to the origin of one region."""

    def __init__(
        self,
        region: RegionConfig,
        session: aiohttp.ClientSession,
        metrics: Metrics,
        clock: Clock,
        body_read_timeout: float | None = BODY_READ_TIMEOUT,
    ) -> None:
        self.region = region
        self._body_read_timeout = body_read_timeout
        self._session = session
        self._metrics = metrics
        metrics.origin_errors.labels(region.name)  # a first failure is a rise from 0
        self._clock = clock
        self._endpoint = region.endpoint.rstrip("/")
        self._host = urlsplit(self._endpoint).netloc

    def url(self, bucket: str, key: str, query: Sequence[tuple[str, str]]) -> str:
        path = "/" + uri_encode(bucket, keep_slash=False) if bucket else "/"
        if key:
            path += "/" + uri_encode(key, keep_slash=True)
        qs = encode_query(query)
        return f"{self._endpoint}{path}{'?' + qs if qs else ''}"

    @asynccontextmanager
    async def request(
        self,
        method: str,
        bucket: str,
        key: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        body: Body = None,
        payload_hash: str = UNSIGNED_PAYLOAD,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request; yield the response with its body unread.

        Raises :class:`OriginError` when the origin cannot be reached, and re-raises the
        body source's own exception (an :class:`S3Error`, say) when that is what failed.
        """
        url = self.url(bucket, key, query)
        out = {k.lower(): v for k, v in (headers or {}).items()}
        out["host"] = self._host
        out.update(
            sign_headers(
                method,
                url,
                out,
                access_key_id=self.region.access_key_id,
                secret_access_key=self.region.secret_access_key,
                region=self.region.signing_region,
                payload_hash=payload_hash,
                now=self._clock.now(),
            )
        )
        data = _guarded(body) if body is not None and not isinstance(body, bytes) else body
        started = time.perf_counter()
        try:
            response = await self._session.request(
                method,
                URL(url, encoded=True),
                headers=out,
                data=data,
                allow_redirects=False,
                skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
            )
        except asyncio.CancelledError:
            raise
        except BodyFailed as exc:
            raise exc.__cause__ or exc from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            cause = _body_failure(exc)
            if cause is not None:
                raise cause from None
            self._metrics.origin_errors.labels(self.region.name).inc()
            log.warning("origin %s unreachable: %s %s: %r", self.region.name, method, url, exc)
            raise OriginError(f"origin {self.region.name} unreachable: {exc!r}") from exc
        extend_read_timeout(response, self._body_read_timeout)
        self._metrics.origin_seconds.labels(self.region.name).observe(time.perf_counter() - started)
        self._metrics.origin_requests.labels(self.region.name, method, str(response.status)).inc()
        try:
            yield response
        finally:
            response.release()


async def _guarded(body: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Mark failures of the body source so they are not mistaken for origin failures (a
    staging copy read as the body of a migration fails with an OriginError of its own)."""
    try:
        async for piece in body:
            yield piece
    except (LotaError, aiohttp.ClientError, OSError, EOFError) as exc:
        raise BodyFailed() from exc


def _body_failure(exc: BaseException) -> BaseException | None:
    """Find a :class:`BodyFailed` in an aiohttp exception chain and return its cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, BodyFailed):
            return current.__cause__ or current
        current = current.__cause__ or current.__context__
    return None
