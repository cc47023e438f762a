"""Counts kept as plain numbers on a hot path (lota.metrics.LaterCount, LaterHistogram)
read exactly as Prometheus' own updates would have left them."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import Histogram

from lota.metrics import LaterHistogram, Metrics
from lota.node.lag import watch_lag

# Bucket bounds and the values either side of them, zero and past the last bound.
VALUES = [0.0, 0.0005, 0.00050001, 0.0007, 0.001, 0.3, 1.0, 59.9, 60.0, 61.0, 3600.0]


def test_later_counts_read_as_prometheus_counted_them() -> None:
    direct, later = Metrics(), Metrics()
    # One histogram observed into two series, as a hit's time is (all requests', hits').
    seconds = later.later_histogram(
        later.request_seconds.labels("GetObject"), later.cache_request_seconds.labels("HIT")
    )
    requests = later.later(later.requests.labels("GetObject", "200"))
    sent = later.later(later.bytes_out)
    for value in VALUES:
        direct.request_seconds.labels("GetObject").observe(value)
        direct.cache_request_seconds.labels("HIT").observe(value)
        direct.requests.labels("GetObject", "200").inc()
        direct.bytes_out.inc(65536)
        seconds.observe(value)
        requests.n += 1
        sent.n += 65536
    assert later.render() == direct.render()
    # Read again with nothing new: folded once, not twice.
    assert later.render() == direct.render()
    seconds.observe(0.002)
    direct.request_seconds.labels("GetObject").observe(0.002)
    direct.cache_request_seconds.labels("HIT").observe(0.002)
    assert later.render() == direct.render()


def test_histograms_observed_alike_must_share_their_buckets() -> None:
    metrics = Metrics()
    other = Histogram("other_seconds", "", buckets=(1.0, 2.0), registry=None)
    with pytest.raises(ValueError, match="same buckets"):
        LaterHistogram(metrics.request_seconds.labels("GetObject"), other)


async def test_a_loop_held_shows_as_lag() -> None:
    """lota.node.lag: a step holding the loop for 60 ms makes the timer due every 20 ms
    run at least 40 ms late once; each look is observed."""
    lag = Metrics().event_loop_lag_seconds
    async with asyncio.TaskGroup() as group:
        watching = group.create_task(watch_lag(lag, every=0.02))
        await asyncio.sleep(0.1)
        time.sleep(0.06)  # a step that holds the loop
        await asyncio.sleep(0.1)
        watching.cancel()
    samples = {s.name + str(s.labels): s.value for s in lag.collect()[0].samples}
    looks = samples["lota_event_loop_lag_seconds_count{}"]
    assert looks >= 5
    late = looks - samples["lota_event_loop_lag_seconds_bucket{'le': '0.02'}"]
    assert late >= 1
    assert samples["lota_event_loop_lag_seconds_sum{}"] >= 0.04
