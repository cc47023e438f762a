"""The connection timing rules and the connection cap, without sockets."""

from __future__ import annotations

import resource

from lota.connections import HeadClock, connection_cap


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
    # 20,000 with two workers: 70% kept for chunk files, 128 + 512 for the rest.
    assert connection_cap(20_000, reserve=14_640) == 5_360
    assert connection_cap(resource.RLIM_INFINITY, reserve=1152) == (1 << 20) - 1152
