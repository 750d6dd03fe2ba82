"""Each model's recent traffic for the console: request rate, p50 and p99 over time.

:class:`TrafficHistory` samples the gateway's own Prometheus registry every few seconds
(``infergate_requests_total`` and the ``infergate_request_duration_seconds`` histogram,
user traffic only: warm-up and rollout replays are left out). Both data planes count
into that registry (the Python forwarder directly, HAProxy through its request log), so
the console shows the same figures whichever plane carries inference.

A point is one interval between two samples: its rate is the requests counted in it per
second, and its quantiles are read from the histogram buckets counted in it, linearly
interpolated inside a bucket (what Prometheus's ``histogram_quantile`` does). No request
is timed twice: the history costs one registry walk per interval, off the hot path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

REQUESTS = "infergate_requests"
LATENCY = "infergate_request_duration_seconds"
USER = "user"
TENANT_REQUESTS = "infergate_tenant_requests"
TENANT_QUEUE_WAIT = "infergate_tenant_queue_wait_seconds"
TENANT_IN_FLIGHT = "infergate_tenant_in_flight_requests"


@dataclass(frozen=True)
class Series:
    """What a history reads: a counter of requests, a histogram, and the key a sample
    counts under (None: left out)."""

    requests: str
    histogram: str
    key: Callable[[Mapping[str, str]], str | None]


# each model's user traffic and its latency
MODELS = Series(REQUESTS, LATENCY,
                lambda labels: labels["model"] if labels.get("traffic") == USER else None)
# each tenant's requests (refused ones too) and how long its admitted ones waited in the
# gateway's queue, per class: "tenant priority"
TENANTS = Series(TENANT_REQUESTS, TENANT_QUEUE_WAIT,
                 lambda labels: f"{labels['tenant']} {labels['priority']}")


@dataclass(frozen=True)
class Counts:
    """Cumulative figures of one key at one instant."""

    requests: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), sorted


@dataclass(frozen=True)
class Point:
    at: float  # the interval's end (wall clock, seconds)
    rate: float  # requests per second
    p50_s: float | None  # None: no answer timed in the interval
    p99_s: float | None


def read_counts(registry: CollectorRegistry, series: Series = MODELS) -> dict[str, Counts]:
    """Per key: requests counted so far and the histogram's buckets, summed over every
    other label (a model's pools and protocols)."""
    requests: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in registry.collect():
        if family.name not in (series.requests, series.histogram):
            continue
        for sample in family.samples:
            labels = sample.labels
            key = series.key(labels)
            if key is None:
                continue
            if sample.name == f"{series.requests}_total":
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == f"{series.histogram}_bucket":
                bound = float(labels["le"])
                per_key = buckets.setdefault(key, {})
                per_key[bound] = per_key.get(bound, 0.0) + sample.value
    return {key: Counts(requests.get(key, 0.0), tuple(sorted(buckets.get(key, {}).items())))
            for key in requests.keys() | buckets.keys()}


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``histogram_quantile``'s rule):
    interpolated inside its bucket; in the +Inf bucket, the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def interval(before: Counts, after: Counts, seconds: float, at: float) -> Point:
    """The point for what was counted between two samples (a counter that went back,
    a restarted registry, counts as starting from zero)."""
    requests = after.requests - before.requests
    if requests < 0:
        before = Counts(0.0, ())
        requests = after.requests
    earlier = dict(before.buckets)
    delta = [(bound, max(0.0, count - earlier.get(bound, 0.0))) for bound, count in after.buckets]
    return Point(at, requests / seconds if seconds > 0 else 0.0,
                 quantile(0.5, delta), quantile(0.99, delta))


class TrafficHistory:
    """The last ``keep`` intervals of every model's traffic (owned by the console; the
    sampler task is started by the gateway's ``serve``)."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 5.0, keep: int = 120,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry, self.interval_s, self.keep, self._clock = registry, interval_s, keep, clock
        self._last: tuple[float, dict[str, Counts]] | None = None
        self._points: dict[str, deque[Point]] = {}

    def sample(self) -> None:
        now, counts = self._clock(), read_counts(self.registry)
        if self._last is not None:
            then, before = self._last
            for model, after in counts.items():
                points = self._points.setdefault(model, deque(maxlen=self.keep))
                points.append(interval(before.get(model, Counts(0.0, ())), after, now - then,
                                       now))
        self._last = (now, counts)

    def points(self, model: str) -> list[Point]:
        return list(self._points.get(model, ()))

    def models(self) -> Iterable[str]:
        return self._points.keys()

    async def run_forever(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)


@dataclass(frozen=True)
class TenantRow:
    """One tenant and class over the console's window."""

    tenant: str
    priority: str
    rate: float  # requests a second, refused ones included
    in_flight: int  # admitted and not answered, now
    wait_p50_s: float | None  # in the gateway's queue (None: none admitted in the window)
    wait_p99_s: float | None


class TenantWindow:
    """Each tenant and class over the last ``window_s``: its request rate and how long
    its admitted requests waited in the gateway's queue (p50, p99), read from the same
    registry both data planes count into (owned by the console; sampled every
    ``interval_s`` by the task the gateway's ``serve`` starts)."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = 5.0,
                 window_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.registry, self.interval_s, self.window_s = registry, interval_s, window_s
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, Counts]]] = deque()

    def sample(self) -> None:
        now = self._clock()
        self._samples.append((now, read_counts(self.registry, TENANTS)))
        # the newest sample at least window_s old stays: the window's start
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def rows(self) -> list[TenantRow]:
        """Every tenant and class counted so far, by tenant then class; figures over the
        window (from the first sample on, until the window is full)."""
        if len(self._samples) < 2:
            return []
        (then, before), (now, after) = self._samples[0], self._samples[-1]
        in_flight = _in_flight(self.registry)
        rows = []
        for key, counts in sorted(after.items()):
            point = interval(before.get(key, Counts(0.0, ())), counts, now - then, now)
            tenant, _, priority = key.rpartition(" ")
            rows.append(TenantRow(tenant, priority, point.rate, in_flight.get(key, 0),
                                  point.p50_s, point.p99_s))
        return rows

    async def run_forever(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)


def _in_flight(registry: CollectorRegistry) -> dict[str, int]:
    return {TENANTS.key(sample.labels) or "": round(sample.value)
            for family in registry.collect() if family.name == TENANT_IN_FLIGHT
            for sample in family.samples}
