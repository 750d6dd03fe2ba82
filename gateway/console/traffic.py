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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

REQUESTS = "infergate_requests"
LATENCY = "infergate_request_duration_seconds"
USER = "user"


@dataclass(frozen=True)
class Counts:
    """Cumulative figures of one model at one instant."""

    requests: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), sorted


@dataclass(frozen=True)
class Point:
    at: float  # the interval's end (wall clock, seconds)
    rate: float  # requests per second
    p50_s: float | None  # None: no answer timed in the interval
    p99_s: float | None


def read_counts(registry: CollectorRegistry) -> dict[str, Counts]:
    """Per model: user requests counted so far and the latency histogram's buckets,
    summed over pools and protocols."""
    requests: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in registry.collect():
        if family.name not in (REQUESTS, LATENCY):
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("traffic") != USER:
                continue
            model = labels["model"]
            if sample.name == f"{REQUESTS}_total":
                requests[model] = requests.get(model, 0.0) + sample.value
            elif sample.name == f"{LATENCY}_bucket":
                bound = float(labels["le"])
                per_model = buckets.setdefault(model, {})
                per_model[bound] = per_model.get(bound, 0.0) + sample.value
    return {model: Counts(requests.get(model, 0.0),
                          tuple(sorted(buckets.get(model, {}).items())))
            for model in requests.keys() | buckets.keys()}


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
