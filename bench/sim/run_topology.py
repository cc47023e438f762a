"""The simulated cluster's topology: two regions, racks of LOTA nodes, and emulated links.

- Two origins (moto, :class:`~lota.embedded.EmbeddedOrigin`): the near region's
  (``us-east``: the datasets, checkpoints and the staging bucket) and the far region's
  (``eu-west``: the bucket the checkpoints are saved to).
- Every path to an origin crosses a :class:`~lota.testing.wan.WanLink` of its own, so
  each one's bytes are counted apart: near nodes to the near origin and to the far one,
  the far region's node to its own origin and to the near one (where staged writes wait),
  and the GPUs' direct reads and writes, which cross links like their nodes' own.
- ``racks`` x ``nodes_per_rack`` LOTA nodes in one ``[cluster]`` (a
  :class:`~lota.testing.cluster.LocalCluster`), node i in rack ``i // nodes_per_rack``
  (``[cluster] rack``). Between every two racks, a link with its own latency and
  bandwidth: for each node of rack b, a WanLink to it that the nodes of rack a dial
  (``[cluster] dial``: the member keeps its name, so every node agrees on the owners).
  Within a rack, nodes reach each other directly.
- One LOTA node in the far region (``region = "eu-west"``, alone), sharing the catalog
  (SQLite, one file for every node: this is one machine), for the reads from there.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from bench.sim.run_gpus import Gpu
from bench.sim.workloads import DATA_BUCKET, FAR_BUCKET, FAR_STAGING_BUCKET, STAGING_BUCKET
from lota.embedded import EmbeddedOrigin
from lota.testing.cluster import LocalCluster
from lota.testing.credentials import write_credentials
from lota.testing.processes import HOST, LotaProcess
from lota.testing.wan import WanLink

NEAR, FAR = "us-east", "eu-west"
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", re.MULTILINE)
_COUNTER = ("_total", "_count", "_sum", "_bucket")


@dataclass(frozen=True, slots=True)
class Link:
    latency: float  # seconds, one way
    bandwidth: float | None  # bytes per second per connection; None: no cap

    def make(self, port: int) -> WanLink:
        return WanLink(HOST, port, latency=self.latency, bandwidth=self.bandwidth)


@dataclass(frozen=True, slots=True)
class Shape:
    racks: int
    nodes_per_rack: int
    gpus_per_node: int
    cache_size: int  # bytes per node
    chunk_size: str
    near: Link  # to an origin of one's own region
    far: Link  # between regions
    rack: Link  # between two racks

    @property
    def nodes(self) -> int:
        return self.racks * self.nodes_per_rack

    def rack_of(self, node: int) -> int:
        return node // self.nodes_per_rack


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: {'name{labels}': value}."""
    return {m[1] + (m[2] or ""): float(m[3]) for m in _SAMPLE.finditer(text)}


class Topology:
    """Everything the GPUs read through, started by :meth:`start`, stopped by :meth:`close`."""

    def __init__(self, root: Path, shape: Shape) -> None:
        self.root = root
        self.shape = shape
        self.near = EmbeddedOrigin()
        self.far = EmbeddedOrigin()
        self.links: dict[str, WanLink] = {}
        self.rack_links: dict[tuple[int, int], list[WanLink]] = {}
        self.credentials = write_credentials(root / "credentials.toml")
        self.cluster: LocalCluster | None = None
        self.far_node: LotaProcess | None = None
        self._banked: dict[int, dict[str, float]] = defaultdict(dict)

    async def start(self) -> None:
        await asyncio.gather(self.near.start(), self.far.start())
        s = self.shape
        routes = {
            "near nodes -> near origin": (self.near, s.near),
            "near nodes -> far origin": (self.far, s.far),
            "far node -> far origin": (self.far, s.near),
            "far node -> near origin": (self.near, s.far),
            "GPUs direct -> near origin": (self.near, s.near),
            "GPUs direct -> far origin": (self.far, s.far),
        }
        for name, (origin, link) in routes.items():
            self.links[name] = link.make(origin.port)
            await self.links[name].start()
        await asyncio.to_thread(self._buckets)
        self.cluster = LocalCluster(
            self.root,
            self.links["near nodes -> near origin"].endpoint,
            self.credentials,
            s.nodes,
            cache_size=str(s.cache_size),
            settings=self._near_settings(),
        )
        for i, node in enumerate(self.cluster.nodes):  # leases are taken by node name
            node.env["LOTA_NODE"] = f"node-{i}"
        await self._racks(self.cluster)
        config = ["--config", str(self._far_config())]
        self.far_node = LotaProcess(config, self.root / "far.log", env={"LOTA_NODE": "far-0"})
        await asyncio.to_thread(self.cluster.start)
        await asyncio.to_thread(self.far_node.start)

    def _buckets(self) -> None:
        for origin, buckets in (
            (self.near, (DATA_BUCKET, STAGING_BUCKET)),
            (self.far, (FAR_BUCKET, FAR_STAGING_BUCKET)),
        ):
            s3 = origin_client(origin.direct_endpoint)
            for bucket in buckets:
                s3.create_bucket(Bucket=bucket)

    def _near_settings(self) -> dict[str, dict[str, Any]]:
        return {
            "cache": {"revalidate_after": "1h", "chunk_size": self.shape.chunk_size},
            f"regions.{NEAR}": {"staging_bucket": STAGING_BUCKET},
            f"regions.{FAR}": {"endpoint": self.links["near nodes -> far origin"].endpoint},
            "catalog": {"url": f"sqlite:///{self.root}/catalog.db"},
            "buckets": {FAR_BUCKET: FAR},
            "lifecycle": {"interval": "0"},
        }

    async def _racks(self, cluster: LocalCluster) -> None:
        """A link from every rack to each node of every other; each node dials those."""
        s = self.shape
        for a in range(s.racks):
            for b in range(s.racks):
                if a != b:
                    others = [n for n in range(s.nodes) if s.rack_of(n) == b]
                    links = [s.rack.make(cluster.nodes[n].port) for n in others]
                    await asyncio.gather(*(link.start() for link in links))
                    self.rack_links[a, b] = links
        for n in range(s.nodes):
            a = s.rack_of(n)
            dial = {
                cluster.members[m]: f"{HOST}:{link.port}"
                for (src, b), links in self.rack_links.items()
                if src == a
                for m, link in zip(
                    [m for m in range(s.nodes) if s.rack_of(m) == b], links, strict=True
                )
            }
            cluster.configure(n, {"cluster": {"rack": f"rack-{a}", "dial": dial}})

    def _far_config(self) -> Path:
        cache = self.root / "cache-far"
        lines = [
            f'region = "{FAR}"',
            "[cache]",
            f'dirs = ["{cache}"]',
            f'size = "{self.shape.cache_size}"',
            f'chunk_size = "{self.shape.chunk_size}"',
            'revalidate_after = "1h"',
            "[auth]",
            'mode = "sigv4"',
            f'credentials = "{self.credentials}"',
            f"[regions.{NEAR}]",
            f'endpoint = "{self.links["far node -> near origin"].endpoint}"',
            f'staging_bucket = "{STAGING_BUCKET}"',
            f"[regions.{FAR}]",
            f'endpoint = "{self.links["far node -> far origin"].endpoint}"',
            f'staging_bucket = "{FAR_STAGING_BUCKET}"',
            "[catalog]",
            f'url = "sqlite:///{self.root}/catalog.db"',
            "[buckets]",
            f'default_region = "{NEAR}"',
            f'"{FAR_BUCKET}" = "{FAR}"',
            "[lifecycle]",
            'interval = "0"',
        ]
        path = self.root / "far.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    @property
    def nodes(self) -> list[LotaProcess]:
        """The near region's nodes, then the far region's."""
        assert self.cluster is not None and self.far_node is not None
        return [*self.cluster.nodes, self.far_node]

    def gpus(self, far_readers: int) -> list[Gpu]:
        """G GPUs on every near node, then `far_readers` on the far region's node."""
        s = self.shape
        gpus = [
            Gpu(f"r{s.rack_of(n)}n{n}g{g}", n, s.rack_of(n), NEAR, self.nodes[n].url)
            for n in range(s.nodes)
            for g in range(s.gpus_per_node)
        ]
        far = self.nodes[-1].url
        return gpus + [Gpu(f"far-g{g}", -1, -1, FAR, far) for g in range(far_readers)]

    def direct(self) -> tuple[tuple[str, str], ...]:
        """Where a GPU reaches each bucket's origin itself."""
        return (
            (DATA_BUCKET, self.links["GPUs direct -> near origin"].endpoint),
            (FAR_BUCKET, self.links["GPUs direct -> far origin"].endpoint),
        )

    def counters(self) -> list[dict[str, float]]:
        """Every node's metrics now, a restarted node's counters added to what it had
        counted before its restart (see :meth:`bank`)."""
        out = []
        for i, node in enumerate(self.nodes):
            now = parse_metrics(_get(node.url + "/_lota/metrics"))
            for key, value in self._banked[i].items():
                now[key] = now.get(key, 0.0) + value
            out.append(now)
        return out

    def bank(self, i: int) -> None:
        """Keep node `i`'s counters before it is killed: its next life counts from zero."""
        now = parse_metrics(_get(self.nodes[i].url + "/_lota/metrics"))
        for key, value in now.items():
            if key.split("{")[0].endswith(_COUNTER):
                self._banked[i][key] = self._banked[i].get(key, 0.0) + value

    def link_bytes(self) -> dict[str, int]:
        """Bytes that crossed each link so far, answers (``down``: from the origin, from the
        owner node) and requests (``up``) apart; the rack links per ordered rack pair."""
        links = {**self.links}
        for (a, b), pair in self.rack_links.items():
            links.update({f"rack {a} -> rack {b} #{i}": link for i, link in enumerate(pair)})
        out: Counter[str] = Counter()
        for named, link in links.items():
            name = named.partition(" #")[0]
            out[f"{name} (down)"] += link.bytes_down
            out[f"{name} (up)"] += link.bytes_up
        return dict(out)

    async def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.far_node is not None:
            self.far_node.kill()
        links = [*self.links.values(), *(x for xs in self.rack_links.values() for x in xs)]
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        await asyncio.gather(self.near.close(), self.far.close(), return_exceptions=True)


def origin_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=EmbeddedOrigin.access_key_id,
        aws_secret_access_key=EmbeddedOrigin.secret_access_key,
        region_name="us-east-1",
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())
