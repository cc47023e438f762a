"""The connection timing rules and the connection cap, without sockets."""

from __future__ import annotations

import resource

import pytest

from lota.cluster.config import ClusterConfig
from lota.cluster.peers import POOL_SIZE as PEER_POOL_SIZE
from lota.config import CacheConfig, Config
from lota.connections import (
    HeadClock,
    chunk_descriptors,
    connection_cap,
    connection_limits,
    own_descriptors,
)
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


def test_the_cap_leaves_the_reserve_but_at_least_a_quarter_of_the_descriptors() -> None:
    assert connection_cap(1_048_576, reserve=1152) == 1_048_576 - 1152
    assert connection_cap(65536, reserve=1152) == 65536 - 1152
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
    (its own and each sibling's), client connections (at least a quarter, or
    `max_connections` set by hand), origin, peer and sibling sockets and LOTA's own files;
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
    assert cap == (soft // 2 if by_hand else max(soft // 4, soft - own - chunk_files))
    if soft >= 20_000 and not by_hand:
        assert chunk_files >= min(soft // 2, 131_072 * workers)
