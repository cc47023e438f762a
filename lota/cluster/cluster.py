"""This node's part in the cluster: :class:`Cluster` keeps the members and the ownership
table current and answers "who owns this chunk, and whom may I ask".

Every ``refresh`` seconds it reads the members (the static list, or the A/AAAA records of
``dns``), probes members whose calls failed once their back-off is over, and, when the
set of owners changed (a member joined, or stayed away longer than ``grace``), builds a
new ownership table on a thread and swaps it in. Nothing is moved when ownership changes:
a chunk whose owner changed is found at its new owner the next time someone misses it
(or, read once more from the origin, filled there).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

from lota.cache.store import ObjectMeta
from lota.cluster.config import ClusterConfig
from lota.cluster.members import Membership
from lota.cluster.ownership import Ownership, chunk_key
from lota.cluster.peers import PeerClient
from lota.metrics import Metrics
from lota.threads import run_in_thread

log = logging.getLogger("lota.cluster")

# The owner, and the next owners to try when it cannot answer.
OWNERS_ASKED = 3
# Invalidations sent to other nodes at once (writes without a catalog).
BROADCAST_CONCURRENCY = 64
Resolver = Callable[[str], Awaitable[list[str]]]


async def resolve(name: str) -> list[str]:
    """``NAME:PORT`` -> every A/AAAA record of NAME as ``HOST:PORT`` (IPv6 bracketed)."""
    host, _, port = name.rpartition(":")
    loop = asyncio.get_running_loop()
    found = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    members = set()
    for family, _, _, _, address in found:
        ip = str(address[0])
        members.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(members)


class Cluster:
    """The members, who owns what, and the client to reach them."""

    def __init__(
        self,
        config: ClusterConfig,
        peers: PeerClient,
        metrics: Metrics,
        *,
        resolver: Resolver = resolve,
    ) -> None:
        self.me = config.self
        self.peers = peers
        self.membership: Membership = peers.membership
        self._config = config
        self._metrics = metrics
        self._resolver = resolver
        self._ownership = Ownership([self.me])
        self._built = False  # the first table (from the members listed) is no change
        self.ready = False
        """True once the members are known (the first resolution of `dns` worked)."""

    def owners(self, meta: ObjectMeta, index: int) -> list[str]:
        """The owner of chunk `index` of `meta`'s version, then the next owners to try."""
        return self._ownership.owners(
            chunk_key(meta.bucket, meta.key, meta.etag, index), OWNERS_ASKED
        )

    def waiting(self) -> str:
        """What the cluster waits for before this node can serve ("" once it can)."""
        return "" if self.ready else "waiting for the cluster's members to be listed"

    def usable(self, member: str) -> bool:
        """Whether `member` may be asked now."""
        return self.membership.usable(member, time.monotonic())

    def others(self) -> list[str]:
        """Every other member this node knows of."""
        return sorted(self.membership.listed - {self.me})

    async def run(self) -> None:
        """Refresh every ``refresh`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self._config.refresh)
            try:
                await self.refresh()
            except Exception:  # a bug: log it, keep the last view, try again next time
                log.exception("cluster refresh failed")

    async def refresh(self) -> None:
        """Read the members, probe failed ones, rebuild ownership if it changed."""
        listed = await self._members()
        if listed is not None:
            self.membership.update(listed, time.monotonic())
            self.ready = True
        await self._probe(self.membership.to_probe(time.monotonic()))
        owners = self.membership.owners(time.monotonic())
        if owners != set(self._ownership.members):
            self._ownership = await run_in_thread(Ownership, owners)
            if self._built:
                self._metrics.cluster_ownership_changes.inc()
            self._built = True
            log.info("%d members own chunks: %s", len(owners), ", ".join(sorted(owners)))
        self._gauges()

    async def _members(self) -> Sequence[str] | None:
        """The members listed now; None when `dns` cannot be resolved (the last list stays)."""
        if not self._config.dns:
            return self._config.members
        try:
            return await self._resolver(self._config.dns)
        except OSError as exc:
            log.warning("cannot resolve cluster.dns %s: %s", self._config.dns, exc)
            return None

    async def _probe(self, members: Sequence[str]) -> None:
        if members:
            answers = await asyncio.gather(*(self.peers.ping(m) for m in members))
            back = [m for m, up in zip(members, answers, strict=True) if up]
            if back:
                log.info("peers answering again: %s", ", ".join(back))

    def _gauges(self) -> None:
        suspected = self.membership.suspected()
        known = len(self.membership.listed | {self.me})
        self._metrics.cluster_members.labels("live").set(known - suspected)
        self._metrics.cluster_members.labels("suspected").set(suspected)
        self._metrics.cluster_owners.set(len(self._ownership.members))

    async def invalidate(self, bucket: str, keys: Sequence[str]) -> None:
        """Tell every other member to drop its cached copies of `keys` (writes through this
        node, when no catalog carries the news); members that do not answer are skipped."""
        slots = asyncio.Semaphore(BROADCAST_CONCURRENCY)

        async def tell(member: str, key: str) -> None:
            async with slots:
                await self.peers.invalidate(member, bucket, key)

        others = [m for m in self.others() if self.usable(m)]
        await asyncio.gather(*(tell(m, k) for m in others for k in keys))
