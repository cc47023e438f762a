"""The connection timing rules and the connection cap, without sockets."""

from __future__ import annotations

import random
import resource

import pytest

from lota.cluster.config import ClusterConfig
from lota.cluster.peers import POOL_SIZE as PEER_POOL_SIZE
from lota.config import CacheConfig, Config
from lota.connections import (
    ConnectionLimits,
    GuardedServer,
    HeadClock,
    chunk_descriptors,
    connection_cap,
    connection_limits,
    own_descriptors,
)
from lota.metrics import Metrics
from lota.regions.origin import POOL_SIZE as ORIGIN_POOL_SIZE


def test_a_new_connection_has_header_timeout_from_when_it_opened() -> None:
    clock = HeadClock(header_timeout=10, keepalive_timeout=75)
    clock.opened(100.0)
    assert clock.expired(109.9) is None
    assert clock.expired(110.0) == "header_timeout"


def test_trickled_bytes_never_extend_the_header_deadline() -> None:
    clock = HeadClock(header_timeout=10, keepalive_timeout=75)
    clock.opened(100.0)
    for now in (101.0, 105.0, 109.0):
        assert clock.head_bytes(now) is False
    assert clock.partial
    assert clock.expired(110.0) == "header_timeout"


def test_an_idle_kept_alive_connection_has_keepalive_timeout_after_its_response() -> None:
    clock = HeadClock(header_timeout=10, keepalive_timeout=75)
    clock.opened(0.0)
    clock.head_complete()
    assert not clock.waiting and clock.expired(1e9) is None  # never closed mid-request
    clock.response_done(200.0)
    assert clock.expired(274.9) is None
    assert clock.expired(275.0) == "idle_timeout"
    assert not clock.partial


def test_the_first_byte_after_an_idle_spell_starts_the_header_clock() -> None:
    clock = HeadClock(header_timeout=10, keepalive_timeout=75)
    clock.response_done(200.0)
    assert clock.head_bytes(270.0) is True
    assert clock.expired(275.0) is None  # past the idle deadline: the head has its time
    assert clock.expired(280.0) == "header_timeout"
    assert clock.head_bytes(271.0) is False


class Waiter:
    """A connection as GuardedServer sees it: waiting for a head since `since`, or handling
    a request (None)."""

    def __init__(self, name: str, since: float | None) -> None:
        self.name, self.since, self.gave_way = name, since, False

    def waiting_since(self) -> float | None:
        return self.since

    def give_way(self) -> None:
        self.gave_way = True


def _server(max_connections: int = 3) -> GuardedServer:
    limits = ConnectionLimits(
        header_timeout=10, keepalive_timeout=75, max_connections=max_connections
    )
    return GuardedServer(None, limits=limits, metrics=Metrics(), request_id=lambda: "id")


async def test_the_connection_that_gives_way_is_the_one_waiting_longest() -> None:
    """Past the cap, the connection that has waited longest for a head gives way, counting
    from its last answer: a connection answered from its bytes stays listed as when it
    began to wait, but waits only since that answer; one handling a request never does."""
    server = _server()
    a, b, c = Waiter("a", 1.0), Waiter("b", 2.0), Waiter("c", 3.0)
    for conn in (a, b):
        assert server.admit(conn)  # type: ignore[arg-type]
        server.waiting(conn)  # type: ignore[arg-type]
    a.since, b.since = 5.0, 2.5  # both answered from their bytes, `b` last listed
    assert server.admit(c)  # type: ignore[arg-type]
    server.waiting(c)  # type: ignore[arg-type]
    gone: list[str] = []

    def next_to_go() -> None:
        newcomer = Waiter("new", 100.0)
        assert server.admit(newcomer)  # type: ignore[arg-type]
        server.waiting(newcomer)  # type: ignore[arg-type]
        gone.extend(conn.name for conn in (a, b, c) if conn.gave_way and conn.name not in gone)

    next_to_go()  # b since 2.5, c since 3, a since 5
    c.since = None  # c takes a request
    next_to_go()
    assert gone == ["b", "a"]


async def test_the_server_always_finds_the_connection_waiting_longest() -> None:
    """Connections opening, answered from their bytes, taking requests, answered and
    closing, many at the same loop time: the server's choice is always one of those
    waiting longest, and its heap stays bounded."""
    rng = random.Random(7)
    server = _server(max_connections=10**9)
    conns: list[Waiter] = []
    now = 0.0
    for step in range(20_000):
        now += rng.choice((0.0, 0.0, 1.0))
        action = rng.random()
        if action < 0.15 or not conns:  # a connection opens
            conn = Waiter(str(step), now)
            conns.append(conn)
            server.admit(conn)  # type: ignore[arg-type]
            server.waiting(conn)  # type: ignore[arg-type]
            continue
        conn = rng.choice(conns)
        if action < 0.45 and conn.since is not None:  # answered from its bytes
            conn.since = now
        elif action < 0.65 and conn.since is not None:  # takes a request
            conn.since = None
        elif action < 0.85 and conn.since is None:  # answered: waits again
            conn.since = now
            server.waiting(conn)  # type: ignore[arg-type]
        elif action >= 0.85:  # closes
            conns.remove(conn)
            server.forget(conn)  # type: ignore[arg-type]
        if step % 7 == 0:
            waiting = [c.since for c in conns if c.since is not None]
            found = server._longest_waiting()
            if not waiting:
                assert found is None
            else:
                assert found is not None and found.waiting_since() == min(waiting)
        assert len(server._heap) <= 2 * len(server._waiting) + 65
    # Connections that close without the server looking: their entries do not pile up.
    crowd = [Waiter(f"crowd {i}", now) for i in range(1000)]
    for conn in crowd:
        server.admit(conn)  # type: ignore[arg-type]
        server.waiting(conn)  # type: ignore[arg-type]
    for conn in crowd:
        server.forget(conn)  # type: ignore[arg-type]
    assert len(server._heap) <= 2 * len(server._waiting) + 65


def test_the_cap_leaves_the_reserve_but_at_least_1024_or_a_quarter_of_a_low_limit() -> None:
    assert connection_cap(1_048_576, reserve=1152) == 1_048_576 - 1152
    assert connection_cap(65536, reserve=1152) == 65536 - 1152
    assert connection_cap(20_000, reserve=19_500) == 1024
    assert connection_cap(4096, reserve=4000) == 1024
    assert connection_cap(1024, reserve=1152) == 256
    assert connection_cap(resource.RLIM_INFINITY, reserve=1152) == (1 << 20) - 1152


@pytest.mark.parametrize("soft", [4096, 8192, 20_000, 65_536, 1_048_576])
@pytest.mark.parametrize("workers", [1, 2, 8])
@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("by_hand", [False, True])
def test_chunk_files_and_connections_share_the_descriptor_limit_without_overcommitting(
    monkeypatch: pytest.MonkeyPatch, soft: int, workers: int, cluster: bool, by_hand: bool
) -> None:
    """Every descriptor a worker may hold fits under its limit: chunk files kept open
    (its own and each sibling's), client connections (at least 1,024 or a quarter of a
    low limit, or `max_connections` set by hand), origin, peer and sibling sockets and LOTA's own files;
    where the limit allows, most of it holds chunk files (a node serves tens of thousands
    of objects to hundreds of connections)."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, soft))
    config = Config(
        workers=workers,
        cache=CacheConfig(dirs=("/cache",)),
        cluster=ClusterConfig(members=("10.0.0.2:9000",), secret="s" * 16)
        if cluster
        else ClusterConfig(),
        max_connections=soft // 2 if by_hand else 0,
    )
    assert config.cluster.on == cluster
    # LOTA's own include a session's pool to and from each sibling (aiohttp's 100) and,
    # in a cluster, the pool of sockets to other nodes.
    sockets = (workers - 1) * 2 * 100 + (PEER_POOL_SIZE if cluster else 0)
    own = own_descriptors(config)
    assert own >= sockets + ORIGIN_POOL_SIZE
    cap = connection_limits(config).max_connections
    chunk_files = chunk_descriptors(config) * workers
    # Only where LOTA's own sockets leave no room for 512 chunk files does it take more
    # (and say so at start).
    assert (cap + own + chunk_files <= soft) == (own + cap + 512 <= soft)
    assert cap == (soft // 2 if by_hand else max(min(1024, soft // 4), soft - own - chunk_files))
    if soft >= 20_000 and not by_hand:
        assert chunk_files >= min(soft * 3 // 4, 131_072 * workers)
