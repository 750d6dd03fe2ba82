"""The gateway's Prometheus metrics (one registry, created in ``main()``).

Names follow Prometheus conventions (base units, ``_total`` counters). docs/metrics.md
documents each one; ``infergate_pool_saturation`` is the gauge a
Kubernetes HPA should target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# bounds close enough that a quantile interpolated between two of them is within about
# 10% of the exact one (1, 2, 5 per decade put a p50 of 2.7 ms anywhere in 2..5 ms)
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015,
    0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.65, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)
# HAProxy logs the queue's wait in whole milliseconds (%Tw): 0 first, then from 1 ms
QUEUE_WAIT_BUCKETS_S = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                        5.0, 10.0, 30.0, 60.0)
RESPONSE_COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    in_flight: Gauge
    queued: Gauge
    rejected: Counter
    upstream_errors: Counter
    member_healthy: Gauge
    member_queue: Gauge
    member_info: Gauge
    saturation: Gauge
    first_response: Histogram
    tenant_requests: Counter
    tenant_refused: Counter
    tenant_latency: Histogram
    tenant_in_flight: Gauge
    tenant_queue_wait: Histogram
    responses_per_request: Histogram
    rollout_percent: Gauge
    rollout_decisions: Counter
    replica_requests: Counter

    def render(self) -> bytes:
        return generate_latest(self.registry)


def observe_many(child: Any, value: float, count: int) -> None:
    """``count`` observations of ``value`` into one histogram child at once (what
    ``observe`` does ``count`` times; prometheus-client has no public call for it)."""
    buckets, bounds, total = (getattr(child, "_buckets", None),
                              getattr(child, "_upper_bounds", None), getattr(child, "_sum", None))
    if buckets is None or bounds is None or total is None:
        for _ in range(count):
            child.observe(value)
        return
    total.inc(value * count)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(count)
            return


def create_metrics(registry: CollectorRegistry | None = None) -> GatewayMetrics:
    registry = registry or CollectorRegistry()
    labels = ("model", "pool")
    return GatewayMetrics(
        registry=registry,
        requests=Counter(
            "infergate_requests",
            "Inference requests by outcome (success, client_error, upstream_error, "
            "rejected, unavailable, deadline) and protocol.",
            (*labels, "protocol", "outcome", "traffic"),
            registry=registry,
        ),
        latency=Histogram(
            "infergate_request_duration_seconds",
            "End-to-end inference latency through the gateway, seconds.",
            (*labels, "protocol", "traffic"),
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        in_flight=Gauge(
            "infergate_in_flight_requests",
            "Requests forwarded to Triton and not yet answered.",
            labels,
            registry=registry,
        ),
        queued=Gauge(
            "infergate_queued_requests",
            "Requests of the model beyond the concurrency its members execute: waiting in "
            "Triton's queues (nothing waits in the gateway).",
            ("model",),
            registry=registry,
        ),
        rejected=Counter(
            "infergate_rejected_requests",
            "Requests the gateway refused itself, by reason: rejected (admission control, "
            "rate limits, tenancy), not_ready, deadline (a deadline the pool could not meet).",
            ("model", "reason"),
            registry=registry,
        ),
        upstream_errors=Counter(
            "infergate_upstream_errors",
            "Failed calls to a Triton member (connection/unavailable), by member.",
            ("pool", "member"),
            registry=registry,
        ),
        member_healthy=Gauge(
            "infergate_member_healthy",
            "1 if the member passes health checks and is not ejected, else 0.",
            ("pool", "member"),
            registry=registry,
        ),
        member_queue=Gauge(
            "infergate_member_queued_requests",
            "Requests queued inside the member (Triton's nv_inference_pending_request_count).",
            ("pool", "member"),
            registry=registry,
        ),
        member_info=Gauge(
            "infergate_member_info",
            "1 per member: the Triton version it reports (GET /v2; 'unknown' when it "
            "cannot be read) and how the data plane's gRPC requests reach it: 'shared' "
            "HTTP/2 connections, or 'per_request' (Triton before 2.57.0, server#8034).",
            ("pool", "member", "version", "grpc_connections"),
            registry=registry,
        ),
        saturation=Gauge(
            "infergate_pool_saturation",
            "(in flight + queued upstream) / capacity per pool: the HPA target.",
            ("pool",),
            registry=registry,
        ),
        tenant_requests=Counter(
            "infergate_tenant_requests",
            "Inference requests per tenant and priority class, by outcome (as "
            "infergate_requests_total; 'rejected' are the refused ones). Only with tenancy.",
            ("tenant", "priority", "outcome"),
            registry=registry,
        ),
        tenant_refused=Counter(
            "infergate_tenant_refused_requests",
            "Requests refused per tenant and class, by reason: rate, tenant_limit, "
            "overloaded (the model's bound), saturated (the class ceiling), fair_share, "
            "deadline (a deadline the pool could not meet).",
            ("tenant", "priority", "reason"),
            registry=registry,
        ),
        tenant_latency=Histogram(
            "infergate_tenant_request_duration_seconds",
            "Latency of admitted requests per tenant and class, seconds.",
            ("tenant", "priority"),
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        tenant_in_flight=Gauge(
            "infergate_tenant_in_flight_requests",
            "Admitted requests of a tenant not yet answered.",
            ("tenant", "priority"),
            registry=registry,
        ),
        tenant_queue_wait=Histogram(
            "infergate_tenant_queue_wait_seconds",
            "Time admitted requests waited in the gateway's queue for a member's slot, per "
            "tenant and class, seconds (0 in pools that do not queue in the gateway); "
            "within the request's latency.",
            ("tenant", "priority"),
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=registry,
        ),
        first_response=Histogram(
            "infergate_time_to_first_response_seconds",
            "Streamed requests (gRPC ModelStreamInfer, HTTP generate_stream): time from "
            "the request reaching the member to its first response, seconds.",
            ("model", "protocol"),
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        rollout_percent=Gauge(
            "infergate_rollout_candidate_percent",
            "During a rollout: the candidate version's percent of the model's unversioned "
            "requests (0 once it ends).",
            ("model", "stable", "candidate"),
            registry=registry,
        ),
        rollout_decisions=Counter(
            "infergate_rollout_decisions",
            "Rollout verdicts per model: promote, hold, rollback (and abort, interrupted).",
            ("model", "decision"),
            registry=registry,
        ),
        replica_requests=Counter(
            "infergate_replica_requests",
            "User inference requests the data-plane replicas served, as they report them to "
            "the control plane every second (the residency's demand; each replica's own "
            "/metrics has them by pool, protocol and outcome).",
            ("model",),
            registry=registry,
        ),
        responses_per_request=Histogram(
            "infergate_responses_per_request",
            "Streamed requests: responses (errors included) the member sent per request.",
            ("model", "protocol"),
            buckets=RESPONSE_COUNT_BUCKETS,
            registry=registry,
        ),
    )
