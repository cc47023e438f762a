"""The cluster's view kept current: DNS members, readiness, ownership across absences."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from lota.cluster.cluster import Cluster
from lota.cluster.config import ClusterConfig
from lota.cluster.members import Membership
from lota.cluster.ownership import chunk_key
from lota.cluster.peers import PeerClient
from lota.metrics import Metrics

SECRET = "a-cluster-secret-of-the-right-length"
ME, B, C = "10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9000"


class Records:
    """A DNS name whose records a test changes; it fails while `answer` is None."""

    def __init__(self) -> None:
        self.answer: list[str] | None = None

    async def resolve(self, name: str) -> list[str]:
        assert name == "lota-peers.lota.svc:9000"
        if self.answer is None:
            raise OSError("Name or service not known")
        return self.answer


async def _cluster(
    records: Records, grace: float
) -> tuple[Cluster, Metrics, aiohttp.ClientSession]:
    config = ClusterConfig(self=ME, dns="lota-peers.lota.svc:9000", secret=SECRET, grace=grace)
    metrics = Metrics()
    session = aiohttp.ClientSession()
    peers = PeerClient(ME, SECRET.encode(), Membership(ME, grace), session, metrics)
    return Cluster(config, peers, metrics, resolver=records.resolve), metrics, session


def _value(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_node_is_ready_once_dns_names_its_members_and_follows_them() -> None:
    records = Records()
    cluster, metrics, session = await _cluster(records, grace=0.2)
    async with session:
        await cluster.refresh()
        # No members known yet: /_lota/readyz says 503, and why.
        assert cluster.waiting() == "waiting for the cluster's members to be listed"
        records.answer = [ME, B, C]
        await cluster.refresh()
        assert cluster.waiting() == "" and cluster.others() == [B, C]
        assert _value(metrics, "lota_cluster_owners") == 3
        assert _value(metrics, "lota_cluster_ownership_changes_total") == 0  # the first table
        key = chunk_key("b", "k", '"e"', 0)
        owners = {cluster._ownership.owner(chunk_key("b", f"k{i}", '"e"', 0)) for i in range(50)}
        assert owners == {ME, B, C}
        # C drops out of DNS (a pod restarting): it keeps its chunks for the grace period...
        records.answer = [ME, B]
        await cluster.refresh()
        assert _value(metrics, "lota_cluster_owners") == 3
        records.answer = None  # a DNS failure changes nothing
        await cluster.refresh()
        assert cluster.ready and _value(metrics, "lota_cluster_owners") == 3
        # ...and loses them after it.
        await asyncio.sleep(0.25)
        records.answer = [ME, B]
        await cluster.refresh()
        assert _value(metrics, "lota_cluster_owners") == 2
        assert _value(metrics, "lota_cluster_ownership_changes_total") == 1
        assert C not in cluster._ownership.owners(key, 3)


async def test_a_member_that_fails_is_suspected_skipped_and_probed_until_it_answers() -> None:
    records = Records()
    records.answer = [ME, "127.0.0.1:9"]  # nothing listens on the discard port
    cluster, metrics, session = await _cluster(records, grace=60.0)
    async with session:
        await cluster.refresh()
        cluster.membership.failed("127.0.0.1:9", time.monotonic() - 5)  # back-off over
        assert cluster.usable("127.0.0.1:9")
        await cluster.refresh()  # the probe fails: still suspected, back-off doubled
        suspected = {"state": "suspected"}
        assert _value(metrics, "lota_cluster_members", suspected) == 1
        assert not cluster.usable("127.0.0.1:9")
        assert _value(metrics, "lota_peer_requests_total", {"result": "unreachable"}) >= 1
