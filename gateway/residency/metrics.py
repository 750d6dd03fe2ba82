"""The residency's Prometheus metrics (on the gateway's one registry; docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# a model's load: a Python-backend stub on CPU takes about a second, a large engine on a
# GPU tens of seconds
LOAD_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0)
# an eviction, out of routing to its room free: a drain of the requests in flight there,
# the unload, its processes' exit (Triton's Python backend waits a second per instance)
EVICTION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class ResidencyMetrics:
    resident_gauge: Gauge
    loads: Counter
    load_failures: Counter
    evictions: Counter
    load_seconds: Histogram
    eviction_seconds: Histogram
    waiting: Gauge
    budget: Gauge
    used: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ResidencyMetrics:
        return cls(
            resident_gauge=Gauge(
                "infergate_model_resident",
                "1 while the model is loaded, warm and routed to on the member.",
                ("model", "member"), registry=registry),
            loads=Counter(
                "infergate_model_loads",
                "Models loaded by the residency, by reason (pinned, demand, miss, preload, "
                "deploy).", ("model", "reason"), registry=registry),
            load_failures=Counter(
                "infergate_model_load_failures",
                "Loads that failed (the model is marked failed on that member).",
                ("model", "member"), registry=registry),
            evictions=Counter(
                "infergate_model_evictions",
                "Models unloaded by the residency, by reason (room, surplus, budget).",
                ("model", "reason"), registry=registry),
            load_seconds=Histogram(
                "infergate_model_load_seconds",
                "Time from a load's start to the model being warm on the member.",
                buckets=LOAD_BUCKETS_S, registry=registry),
            eviction_seconds=Histogram(
                "infergate_model_eviction_seconds",
                "Time from a model taken out of routing on a member to its memory free there "
                "(drain, unload, its processes' exit).",
                buckets=EVICTION_BUCKETS_S, registry=registry),
            waiting=Gauge(
                "infergate_waiting_room_requests",
                "Requests waiting for their model to load (misses).", ("model",),
                registry=registry),
            budget=Gauge(
                "infergate_member_memory_budget_bytes",
                "A member's memory budget (residency), headroom included.",
                ("pool", "member"), registry=registry),
            used=Gauge(
                "infergate_member_memory_used_bytes",
                "The footprints of the models a member holds or loads.",
                ("pool", "member"), registry=registry),
        )

    def resident(self, model: str, on: Mapping[str, bool]) -> None:
        for member, resident in on.items():
            self.resident_gauge.labels(model, member).set(1 if resident else 0)
