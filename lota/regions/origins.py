"""Which origin serves a bucket: the one place that answers it.

:class:`Origins` holds one :class:`~lota.regions.origin.OriginClient` per configured
region and maps a bucket to the client of its home region (``[buckets]``: a bucket's own
entry, else ``buckets.default_region``, see :meth:`lota.config.Config.home_region`).
Everything that sends a bucket's requests on — pass-through, the read path, write
acceleration, the migrator, the lifecycle engine — asks :meth:`Origins.for_bucket`; what
needs a region's origin by name (staging, a source region) indexes it as a mapping::

    origins = Origins(config, session, metrics)
    origins.for_bucket("checkpoints")   # the home region's client
    origins["us-east"]                  # a region's client by name
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import aiohttp

from lota.clock import Clock
from lota.config import Config
from lota.metrics import Metrics
from lota.regions.origin import OriginClient


class Origins(Mapping[str, OriginClient]):
    """The origin client of each region, by region name, and of each bucket's home."""

    def __init__(self, config: Config, session: aiohttp.ClientSession, metrics: Metrics) -> None:
        # Origin requests are signed against the real time, whatever LOTA_TIME_OFFSET says.
        self._clients = {
            name: OriginClient(region, session, metrics, Clock())
            for name, region in config.regions.items()
        }
        # Config.home_region's answer, resolved once: this lookup is on every request's path.
        self._homes = {bucket: config.home_region(bucket).name for bucket in config.bucket_regions}
        self._default = config.default_region

    def for_bucket(self, bucket: str) -> OriginClient:
        """The client of the origin that holds `bucket` (its home region's)."""
        return self._clients[self._homes.get(bucket, self._default)]

    def __getitem__(self, region: str) -> OriginClient:
        return self._clients[region]

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)
