"""The control plane's calls to the origins, through aiobotocore.

The calls LOTA makes on its own behalf, not a client's — the migrator's HEADs, multipart
uploads and deletes at the home origin, the lifecycle engine's listings, copies in place
and tag reads, the orphan sweep's listings of staging — go through one aiobotocore S3
client per region: its retries (standard mode, with back-off), paginators and error
parsing replace code LOTA would otherwise carry. The data path (GET, PUT and UploadPart
bodies streamed between clients, the cache and the origins) keeps the lean signed aiohttp
client (:mod:`lota.regions.origin`): it streams request bodies from async iterators
without buffering them, which botocore's body handling does not.

Errors are translated once, here: an S3 error answer is raised as
:class:`~lota.s3.errors.S3Error` (its code and HTTP status), a failure to reach the
origin as :class:`~lota.errors.OriginError`. Every call is counted in
``lota_origin_requests_total`` like the data path's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import UNSIGNED
from botocore.exceptions import BotoCoreError, ClientError

from lota.config import Config, RegionConfig
from lota.errors import OriginError
from lota.metrics import Metrics
from lota.s3.errors import S3Error

# Origins LOTA talks to are S3 or S3-compatible stores behind any endpoint: path style,
# and no checksum beyond what the call needs (some stores refuse the newer ones).
_CONFIG = {
    "s3": {"addressing_style": "path"},
    "retries": {"mode": "standard", "max_attempts": 3},
    "connect_timeout": 10,
    "read_timeout": 120,
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
}
_ANONYMOUS = {"signature_version": UNSIGNED}


class ControlPlane:
    """One aiobotocore client per region, made on first use; :meth:`close` closes them."""

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self._regions: Mapping[str, RegionConfig] = config.regions
        self._homes = {bucket: config.home_region(bucket).name for bucket in config.bucket_regions}
        self._default = config.default_region
        self._metrics = metrics
        self._session = get_session()
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()

    async def region(self, name: str) -> Any:
        """The S3 client of region `name`'s origin."""
        if (client := self._clients.get(name)) is not None:
            return client
        async with self._lock:
            if name not in self._clients:
                self._clients[name] = await self._open(self._regions[name])
        return self._clients[name]

    async def for_bucket(self, bucket: str) -> Any:
        """The S3 client of `bucket`'s home origin."""
        return await self.region(self._homes.get(bucket, self._default))

    async def _open(self, region: RegionConfig) -> Any:
        client = await self._stack.enter_async_context(
            self._session.create_client(
                "s3",
                endpoint_url=region.endpoint,
                region_name=region.signing_region,
                # The data path's credentials, never botocore's own chain (which the data
                # path cannot follow); none configured: anonymous requests.
                aws_access_key_id=region.access_key_id or None,
                aws_secret_access_key=region.secret_access_key or None,
                config=AioConfig(**_CONFIG, **({} if region.access_key_id else _ANONYMOUS)),
            )
        )
        requests = self._metrics.origin_requests

        def count(http_response: Any, model: Any, **_: Any) -> None:
            method = str(model.http.get("method", "-"))
            requests.labels(region.name, method, str(http_response.status_code)).inc()

        client.meta.events.register("after-call.s3", count)
        return client

    async def close(self) -> None:
        await self._stack.aclose()
        self._clients.clear()


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """botocore's errors as LOTA's: an S3 error answer as S3Error, anything else that kept
    the call from an answer as OriginError."""
    try:
        yield
    except ClientError as exc:
        raise as_s3_error(exc) from exc
    except (BotoCoreError, OSError, TimeoutError) as exc:
        raise OriginError(f"{what}: {exc}") from exc


# What an answer without an error document (a HEAD's) means, by its status.
_BARE = {403: "AccessDenied", 404: "NoSuchKey", 409: "Conflict", 412: "PreconditionFailed"}


def as_s3_error(exc: ClientError) -> S3Error:
    """The origin's error answer as an S3Error (a 5xx: ServiceUnavailable, retry later)."""
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500))
    code = str(error.get("Code") or "")
    if status >= 500:
        return S3Error("ServiceUnavailable", f"origin answered {status} {code}".strip())
    if not code[:1].isalpha():
        code = _BARE.get(status, "InvalidRequest")
    return S3Error(code, str(error.get("Message", "")), status=status)
