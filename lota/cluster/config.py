"""``[cluster]``: the nodes whose caches form one cache (see :mod:`lota.cluster`).

Loaded with the rest of the configuration by :func:`lota.config.load`; every setting has
its ``LOTA_CLUSTER_*`` variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lota.errors import ConfigError
from lota.settings import Duration


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """The nodes whose caches form one cache: each chunk has an owner node, and a node that
    misses asks the owner before the origin. Without ``members`` or ``dns`` a node works
    alone."""

    # How the other nodes reach this one (HOST:PORT); default: the listen address.
    self: str = ""
    # Every member, this node included (HOST:PORT each)...
    members: tuple[str, ...] = ()
    # ...or NAME:PORT whose A/AAAA records are the members (a Kubernetes headless Service).
    dns: str = ""
    # Seconds between re-resolving `dns` and re-checking members that failed.
    refresh: Duration = 5.0
    # The key peer requests are signed with (HMAC-SHA256), the same on every node; or a
    # file holding it. At least 16 characters.
    secret: str = field(default="", repr=False)
    secret_file: str = ""
    # Seconds a member may be unreachable (or gone from `dns`) and still own its chunks;
    # meanwhile they are read from the next owner. A rolling restart fits in it.
    grace: Duration = 60.0
    # Seconds to connect to a peer, and to wait for its answer beyond what its own origin
    # may take (origin_timeout); past them the next owner, then the origin, is asked.
    timeout: Duration = 2.0
    # A chunk this node read from its owner `hot_reads` times within `hot_window` seconds is
    # kept here too, in at most `hot_share` of the cache budget.
    hot_reads: int = 2
    hot_window: Duration = 300.0
    hot_share: float = 0.125
    # This node's rack (or any failure domain), reported in lota_node_info.
    rack: str = ""
    # Members reached through another address (HOST:PORT each): a proxy, a NAT, an
    # emulated link between racks. A member keeps its name (ownership, signatures).
    dial: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(self.members))
        object.__setattr__(self, "dial", tuple(self.dial))
        for member, address in self.dial:
            _host_port(member, "cluster.dial")
            _host_port(address, "cluster.dial")
        if self.members and self.dns:
            raise ConfigError("cluster.members and cluster.dns go one at a time: pick one")
        for member in (*self.members, *([self.dns] if self.dns else []), self.self):
            if member:
                _host_port(member, "cluster members, dns and self")
        for name in ("refresh", "grace", "timeout", "hot_window"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"cluster.{name} must be more than 0 seconds")
        if self.hot_reads < 1:
            raise ConfigError("cluster.hot_reads must be at least 1")
        if not 0 <= self.hot_share < 1:
            raise ConfigError("cluster.hot_share must be at least 0 and below 1")
        if self.on and len(self.secret) < 16:
            raise ConfigError(
                "a cluster needs cluster.secret (or cluster.secret_file, LOTA_CLUSTER_SECRET) "
                "of at least 16 characters, the same on every node"
            )

    @property
    def on(self) -> bool:
        """Whether this node is one of a cluster (else it works alone)."""
        return bool(self.members or self.dns)


def _host_port(value: str, where: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{where} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)
