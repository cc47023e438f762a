"""Counts kept as plain numbers on a hot path (lota.metrics.LaterCount, LaterHistogram)
read exactly as Prometheus' own updates would have left them."""

from __future__ import annotations

import pytest
from prometheus_client import Histogram

from lota.metrics import LaterHistogram, Metrics

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
