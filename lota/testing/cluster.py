"""A cluster of real LOTA nodes on loopback, for tests, benchmarks and the simulator.

Each node is ``lota serve`` in its own process (:class:`~lota.testing.processes.LotaProcess`)
with its own cache directory, every node listed in ``[cluster] members``, and the public
test secret :data:`CLUSTER_SECRET`::

    with LocalCluster(tmp, origin_url, credentials, size=6) as cluster:
        urls = cluster.urls
        cluster.kill(2)        # SIGKILL, as a node that dies
        cluster.restart(2)     # same port, same cache directory

Extra settings go in per TOML section: ``settings={"cache": {"chunk_size": "1MiB"}}``;
one node's own (its rack, the addresses it dials) with :meth:`LocalCluster.configure`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from lota.testing.processes import HOST, LotaProcess

# Public: use it only for nodes a test or a benchmark started.
CLUSTER_SECRET = "lota-test-cluster-secret-0123456789"


def _toml(value: Any) -> str:
    """A TOML value: a mapping as an inline table (``cluster.dial``), the rest as JSON,
    which TOML reads the same for strings, numbers, booleans and lists."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


class LocalCluster:
    """`size` LOTA nodes in one cluster, in front of the origin at `origin`."""

    def __init__(
        self,
        root: Path,
        origin: str,
        credentials: Path,
        size: int,
        *,
        cache_size: str = "2GiB",
        settings: Mapping[str, Mapping[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        clustered: bool = True,
    ) -> None:
        """`clustered` off: the same nodes, each alone (no ``[cluster]``), to compare."""
        self.root = root
        self.clustered = clustered
        self._common = (origin, credentials, cache_size, settings or {})
        self.nodes = [
            LotaProcess([], log_path=root / f"node-{i}.log", env=env) for i in range(size)
        ]
        self.members = [f"{HOST}:{node.port}" for node in self.nodes]
        for i in range(size):
            self.configure(i, {})

    def configure(self, i: int, settings: Mapping[str, Mapping[str, Any]]) -> None:
        """Node `i`'s own settings, per TOML section, over the cluster's (a rack, the
        addresses it dials its peers at); they apply from its next start."""
        config = self.root / f"node-{i}.toml"
        config.write_text(self._config(i, *self._common, settings))
        self.nodes[i].args = ["--listen", self.members[i], "--config", str(config)]

    def _config(
        self,
        i: int,
        origin: str,
        credentials: Path,
        cache_size: str,
        settings: Mapping[str, Mapping[str, Any]],
        own: Mapping[str, Mapping[str, Any]],
    ) -> str:
        sections: dict[str, dict[str, Any]] = {
            "cache": {"dirs": [str(self.root / f"cache-{i}")], "size": cache_size},
            "auth": {"mode": "sigv4", "credentials": str(credentials)},
            "regions.us-east": {"endpoint": origin},
        }
        if self.clustered:
            sections["cluster"] = {
                "members": self.members,
                "secret": CLUSTER_SECRET,
                "refresh": "1s",
            }
        for layer in (settings, own):
            for section, values in layer.items():
                sections.setdefault(section, {}).update(values)
        return "".join(
            f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
            for name, values in sections.items()
        )

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> LocalCluster:
        """Start every node at once; return when all are ready."""
        try:
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                node.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL node `i`: no drain, fills cut, as a node that dies."""
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        """Start node `i` again, on its port, with its cache directory."""
        self.nodes[i].start()

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
