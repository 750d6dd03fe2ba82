"""The console's traffic history and tenant window: rates and quantiles read from the
gateway's own registry, fed as each data plane feeds it (the Python forwarder observes
one request at a time; HAProxy's request log adds many at once)."""

from __future__ import annotations

import pytest

from gateway.console.traffic import (
    Counts,
    TenantWindow,
    TrafficHistory,
    interval,
    quantile,
    read_counts,
)
from gateway.metrics import create_metrics, observe_many


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quantile_interpolates_inside_its_bucket_as_prometheus_does() -> None:
    buckets = ((0.01, 50.0), (0.02, 90.0), (0.05, 100.0), (float("inf"), 100.0))
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.7, buckets) == pytest.approx(0.015)
    assert quantile(0.99, buckets) == pytest.approx(0.047)
    assert quantile(0.25, buckets) == pytest.approx(0.005)  # the first bucket from 0
    assert quantile(0.5, ((0.01, 0.0), (float("inf"), 0.0))) is None
    assert quantile(0.99, ((0.01, 1.0), (float("inf"), 10.0))) == 0.01  # beyond the last


def test_history_counts_user_requests_of_both_planes_per_interval() -> None:
    metrics, clock = create_metrics(), Clock()
    history = TrafficHistory(metrics.registry, interval_s=5, keep=3, clock=clock)
    history.sample()  # the first sample only sets the start
    for _ in range(40):  # the Python plane: one at a time, two pools
        metrics.requests.labels("m", "a", "http", "success", "user").inc()
        metrics.latency.labels("m", "a", "http", "user").observe(0.004)
    metrics.requests.labels("m", "b", "grpc", "success", "user").inc(60)  # HAProxy's log
    observe_many(metrics.latency.labels("m", "b", "grpc", "user"), 0.015, 60)
    metrics.requests.labels("m", "a", "http", "success", "warmup").inc(1000)  # not users'
    metrics.latency.labels("m", "a", "http", "warmup").observe(9.0)
    clock.now += 10
    history.sample()
    (point,) = history.points("m")
    assert point.rate == pytest.approx(10.0)  # 100 requests in 10 s
    # the slowest 60 took 15 ms: the buckets' bounds (12.5, 15 ms) hold p99 within 1 %
    assert 0.01 < point.p50_s < 0.015 and point.p99_s == pytest.approx(0.015, rel=0.01)
    clock.now += 10
    history.sample()  # nothing new: rate 0, no quantiles
    assert history.points("m")[-1].rate == 0 and history.points("m")[-1].p99_s is None
    for _ in range(3):
        clock.now += 10
        history.sample()
    assert len(history.points("m")) == 3  # keep


def test_a_counter_that_went_back_counts_from_zero() -> None:
    before = Counts(500.0, ((0.01, 500.0), (float("inf"), 500.0)))
    after = Counts(20.0, ((0.01, 10.0), (float("inf"), 20.0)))
    point = interval(before, after, 10.0, 0.0)
    assert point.rate == 2.0 and point.p50_s == 0.01


def test_read_counts_sums_pools_and_protocols() -> None:
    metrics = create_metrics()
    metrics.requests.labels("x", "a", "http", "success", "user").inc(3)
    metrics.requests.labels("x", "b", "grpc", "client_error", "user").inc(2)
    counts = read_counts(metrics.registry)
    assert counts["x"].requests == 5 and counts["x"].buckets == ()  # none timed yet


def test_tenant_window_gives_each_tenant_and_class_its_rate_and_queue_wait() -> None:
    """Fed as both planes feed the registry (HAProxy's log adds many at once); the
    window is the last ``window_s``, its start the newest sample at least that old."""
    metrics, clock = create_metrics(), Clock()
    window = TenantWindow(metrics.registry, interval_s=5, window_s=20, clock=clock)
    window.sample()
    assert window.rows() == []  # one sample: no interval yet
    metrics.tenant_requests.labels("light", "critical", "success").inc(30)
    observe_many(metrics.tenant_queue_wait.labels("light", "critical"), 0.0, 30)
    metrics.tenant_requests.labels("flood", "sheddable", "success").inc(90)
    metrics.tenant_requests.labels("flood", "sheddable", "rejected").inc(110)
    observe_many(metrics.tenant_queue_wait.labels("flood", "sheddable"), 0.2, 90)
    metrics.tenant_in_flight.labels("flood", "sheddable").set(64)
    clock.now += 10
    window.sample()
    flood, light = window.rows()
    assert (flood.tenant, flood.priority, flood.in_flight) == ("flood", "sheddable", 64)
    assert flood.rate == pytest.approx(20.0)  # 200 in 10 s, refused ones included
    assert flood.wait_p99_s == pytest.approx(0.2, rel=0.05)
    assert (light.tenant, light.rate, light.in_flight) == ("light", 3.0, 0)
    assert light.wait_p50_s is not None and light.wait_p50_s < 0.001
    for _ in range(4):  # 40 s with nothing new: the window holds none of it
        clock.now += 10
        window.sample()
    flood, light = window.rows()
    assert flood.rate == 0 and flood.wait_p99_s is None and light.rate == 0


def test_a_tenant_named_with_spaces_keeps_its_name_and_class() -> None:
    metrics, clock = create_metrics(), Clock()
    window = TenantWindow(metrics.registry, clock=clock)
    window.sample()
    metrics.tenant_requests.labels("team a", "standard", "success").inc()
    clock.now += 5
    window.sample()
    (row,) = window.rows()
    assert (row.tenant, row.priority) == ("team a", "standard")
