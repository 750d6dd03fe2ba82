"""What one tenant's run measured and what it says (``bench_tenants``; pure, no I/O):
the gateway's per-tenant counts read from its ``/metrics``, the figures of one h2load
run (admitted throughput, refusals, success, p50/p99 with their bounds where gRPC
refusals hide among the 200s, the gateway's own histograms), and the arithmetic under
them: Jain's index, a Prometheus histogram's quantile, percentile bounds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.console.traffic import quantile
from gateway.errors import CANCELLED_OUTCOME
from loadtests.harness import metric_samples, percentile, with_range

TENANT_REQUESTS = "infergate_tenant_requests_total"
TENANT_LATENCY = "infergate_tenant_request_duration_seconds_bucket"
LATENCY_KEY = "le:"  # TenantCounts' entries of a tenant's latency histogram, by bound
TENANT_QUEUE_WAIT = "infergate_tenant_queue_wait_seconds_bucket"
QUEUE_KEY = "qw:"  # TenantCounts' entries of a tenant's queue-wait histogram, by bound
# the gateway's own latency figures against h2load's for the same requests
FIGURES_GOAL_RATIO, FIGURES_GOAL_MS = 0.10, 1.0
# the gateway's name for its refusals counter, and the one its issue gave first
TENANT_REFUSED = ("infergate_tenant_refused_requests_total", "infergate_tenant_refused_total")
GATEWAY_REQUESTS = "infergate_requests_total"
GATEWAY_IN_FLIGHT = "infergate_in_flight_requests"
WHOLE_GATEWAY = "*"  # TenantCounts' entry for GATEWAY_REQUESTS
# Outcomes read from h2load's own log, for a run straight at the member (no gateway to
# count them: every answer a success, Triton refuses nothing)
MEMBER_ANSWERS = "h2load, straight at the member"
# what a run's p50/p99 are, from best to worst known, and their mark in the table
EXACT, UPPER_BOUND, ALL_ANSWERS = "exact", "upper bound", "all answers"
LATENCY_KINDS = (EXACT, UPPER_BOUND, ALL_ANSWERS)
LATENCY_MARKS = {EXACT: "", UPPER_BOUND: "<=", ALL_ANSWERS: "~"}


# -- pure arithmetic -------------------------------------------------------------------

def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one
    has everything; nan when nobody has anything (no fairness to judge)."""
    if not values:
        raise ValueError("Jain's index of nothing")
    if any(v < 0 for v in values):
        raise ValueError(f"Jain's index takes amounts >= 0: {list(values)}")
    squares = sum(v * v for v in values)
    if squares == 0:
        return math.nan
    return sum(values) ** 2 / (len(values) * squares)


def histogram_quantile(buckets: Mapping[float, float], q: float) -> float:
    """The ``q`` (0..100) quantile of a Prometheus histogram, its cumulative counts by
    upper bound (``+Inf`` among them), as the console reads its charts
    (``histogram_quantile``'s rule); nan when it counted nothing."""
    found = quantile(q / 100, sorted(buckets.items()))
    return math.nan if found is None else found


def figures_within(gateway_ms: float, client_ms: float) -> bool | None:
    """The gateway's figure within 10% (or 1 ms) of the client's; None: either missing."""
    if not (math.isfinite(gateway_ms) and math.isfinite(client_ms)):
        return None
    return abs(gateway_ms - client_ms) <= max(FIGURES_GOAL_MS, FIGURES_GOAL_RATIO * client_ms)


def percentile_bounds(values: Sequence[float], q: float, hidden: int) -> tuple[float, float]:
    """Bounds on the nearest-rank ``q`` percentile of ``values`` once ``hidden`` of them,
    which cannot be told apart (gRPC refusals: HTTP 200 like the successes), are taken
    out: (those were the slowest, those were the fastest). Both are the percentile itself
    when ``hidden`` is 0; nan when nothing is left."""
    kept = len(values) - max(0, hidden)
    if kept <= 0:
        return math.nan, math.nan
    ordered = sorted(values)
    return percentile(ordered[:kept], q), percentile(ordered[len(ordered) - kept:], q)


# -- the gateway's per-tenant counts ---------------------------------------------------

@dataclass(frozen=True)
class TenantCounts:
    """Per tenant: ``infergate_tenant_requests_total`` by outcome, and the refused
    counter by reason (as ``refused:<reason>``), summed over every other label; under
    :data:`WHOLE_GATEWAY`, ``infergate_requests_total`` of user traffic by outcome (for a
    gateway without tenancy); ``families``: which of them the gateway exposes."""

    by_tenant: Mapping[str, Mapping[str, float]]
    families: frozenset[str]
    in_flight: float | None = None  # the gateway's requests in flight now (a gauge)

    def minus(self, before: TenantCounts) -> TenantCounts:
        delta = {t: {k: v - before.by_tenant.get(t, {}).get(k, 0.0) for k, v in c.items()}
                 for t, c in self.by_tenant.items()}
        return TenantCounts(delta, self.families | before.families, self.in_flight)

    def total(self) -> float:
        return sum(sum(c.values()) for c in self.by_tenant.values())


def tenant_counts(metrics_text: str) -> TenantCounts:
    """The per-tenant counters (and the gateway-wide one) in a Prometheus exposition."""
    by_tenant: dict[str, dict[str, float]] = {}
    families: set[str] = set()
    in_flight: float | None = None
    for s in metric_samples(metrics_text):
        if s.name == GATEWAY_IN_FLIGHT:
            in_flight = (in_flight or 0.0) + s.value
            continue
        tenant = s.labels.get("tenant", "?")
        if s.name == TENANT_REQUESTS:
            key = s.labels.get("outcome", "?")
        elif s.name == TENANT_LATENCY:
            key = LATENCY_KEY + s.labels.get("le", "+Inf")
        elif s.name == TENANT_QUEUE_WAIT:
            key = QUEUE_KEY + s.labels.get("le", "+Inf")
        elif s.name in TENANT_REFUSED:
            key = "refused:" + s.labels.get("reason", "?")
        elif s.name == GATEWAY_REQUESTS and s.labels.get("traffic", "user") == "user":
            tenant, key = WHOLE_GATEWAY, s.labels.get("outcome", "?")
        else:
            continue
        families.add(s.name)
        counts = by_tenant.setdefault(tenant, {})
        counts[key] = counts.get(key, 0.0) + s.value
    return TenantCounts(by_tenant, frozenset(families), in_flight)


@dataclass(frozen=True)
class Outcomes:
    """One tenant's requests over one run as the gateway counted them."""

    succeeded: int
    refused: int
    failed: int  # refused included; cancelled not (CANCELLED_OUTCOME)
    reasons: Mapping[str, int]  # refusals by reason, where the gateway says
    source: str = TENANT_REQUESTS  # the counter they come from


# CANCELLED_OUTCOME, the gateway's outcome for a request its client gave up on: in these
# runs only h2load's own, the requests still in flight when it ends its run (no tenant
# sends a deadline), which are neither a success nor a failure of the gateway; h2load's
# log leaves them out of the HTTP figures the same way


def member_outcomes(statuses: Mapping[int, int]) -> Outcomes:
    """A run straight at the member, from h2load's log (``statuses``: HTTP status ->
    answers; -1 no answer, h2load's own cut at its end, left out as the gateway leaves
    out what its client cancelled). Over gRPC an error of Triton's is an HTTP 200 too,
    so it counts as a success: nothing at the member refuses, and the bench's models
    answer every well-formed request."""
    succeeded = statuses.get(200, 0)
    failed = sum(n for status, n in statuses.items() if status not in (200, -1))
    return Outcomes(succeeded, 0, failed, {}, MEMBER_ANSWERS)


def outcomes(counts: TenantCounts, tenant: str, alone: bool = False) -> Outcomes | None:
    """The tenant's own counts; for the only client of a gateway (``alone``) without
    per-tenant counts (no ``tenancy:``), the whole gateway's; None when neither.
    Requests the client cancelled (:data:`CANCELLED_OUTCOME`) are left out."""
    if TENANT_REQUESTS in counts.families:
        mine = counts.by_tenant.get(tenant, {})
        source = TENANT_REQUESTS
    elif alone and GATEWAY_REQUESTS in counts.families:
        mine = counts.by_tenant.get(WHOLE_GATEWAY, {})
        source = GATEWAY_REQUESTS
    else:
        return None
    reasons = {k.removeprefix("refused:"): round(v) for k, v in mine.items()
               if k.startswith("refused:") and round(v)}
    by_outcome = {k: round(v) for k, v in mine.items()
                  if not k.startswith(("refused:", LATENCY_KEY, QUEUE_KEY))
                  and k != CANCELLED_OUTCOME}
    succeeded = by_outcome.get("success", 0)
    refused = by_outcome.get("rejected", sum(reasons.values()))
    return Outcomes(succeeded, refused, sum(by_outcome.values()) - succeeded, reasons, source)


# -- one run ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """One tenant's h2load run in one phase."""

    tenant: str
    protocol: str
    in_flight: int
    seconds: float  # h2load's measured duration
    statuses: Mapping[int, int]  # HTTP status -> answers in h2load's log (-1: no answer)
    latencies_us: tuple[float, ...]  # of the HTTP 200 answers
    counted: Outcomes | None  # by the gateway (None: not exposed)
    problem: str = ""
    refusal_latencies_us: tuple[float, ...] = ()  # of the HTTP 429 answers
    offered_per_s: float = 0.0  # paced: the rate it was sent at (0: closed loop)
    # the gateway's latency histogram of the tenant's admitted requests over the run
    # (cumulative counts by upper bound, seconds)
    gateway_buckets: Mapping[float, float] | None = None
    # the gateway's histogram of the tenant's wait in its queue over the run
    queue_buckets: Mapping[float, float] | None = None


@dataclass(frozen=True)
class Figures:
    admitted_per_s: float | None
    refused: int | None
    success_pct: float | None
    p50_ms: float
    p99_ms: float  # an upper bound where refusals hide among the 200s (gRPC)
    p99_low_ms: float  # the lower bound (equal when exact)
    latency: str  # LATENCY_KINDS: exact, an upper bound, or over every answer
    note: str = ""
    refusal_p50_ms: float = math.nan  # how long an HTTP 429 took to arrive
    gateway_p50_ms: float = math.nan  # the gateway's own figures for the same requests
    gateway_p99_ms: float = math.nan
    queue_p50_ms: float = math.nan  # the gateway's figures of its wait in the queue
    queue_p99_ms: float = math.nan


def figures(m: Measured) -> Figures:
    """What one run says about its tenant (``bench_tenants``' docstring says from where)."""
    logged = sum(m.statuses.values())
    not_200 = logged - m.statuses.get(200, 0)
    note = m.problem
    if m.protocol == "http":
        succeeded, failed = m.statuses.get(200, 0), not_200
        refused: int | None = m.statuses.get(429, 0)
        hidden = 0
    elif m.counted is not None:
        succeeded, failed, refused = m.counted.succeeded, m.counted.failed, m.counted.refused
        hidden = max(0, failed - not_200)  # failures h2load saw as HTTP 200
        if m.counted.source == MEMBER_ANSWERS:
            note = (note + "; " if note else "") + (
                "straight at the member: h2load's answers, a gRPC error among them would "
                "count as a success")
        elif m.counted.source != TENANT_REQUESTS:
            note = (note + "; " if note else "") + (
                f"gRPC counts: the whole gateway's {m.counted.source} (its only client; "
                "no per-tenant counts without tenancy)")
    else:
        p50 = percentile_bounds(m.latencies_us, 50, 0)[1] / 1e3
        p99 = percentile_bounds(m.latencies_us, 99, 0)[1] / 1e3
        return Figures(None, None, None, p50, p99, math.nan, ALL_ANSWERS,
                       (note + "; " if note else "")
                       + "gRPC refusals unknown: the gateway exposes no per-tenant counts "
                       "(latency over every HTTP 200 answer, refusals included)")
    total = succeeded + failed
    p50_low, p50_high = percentile_bounds(m.latencies_us, 50, hidden)
    p99_low, p99_high = percentile_bounds(m.latencies_us, 99, hidden)
    gateway, queue = m.gateway_buckets or {}, m.queue_buckets or {}
    return Figures(succeeded / m.seconds if m.seconds > 0 else None, refused,
                   100.0 * succeeded / total if total else None, p50_high / 1e3,
                   p99_high / 1e3, p99_low / 1e3, EXACT if hidden == 0 else UPPER_BOUND, note,
                   percentile_bounds(m.refusal_latencies_us, 50, 0)[0] / 1e3,
                   histogram_quantile(gateway, 50) * 1e3, histogram_quantile(gateway, 99) * 1e3,
                   histogram_quantile(queue, 50) * 1e3, histogram_quantile(queue, 99) * 1e3)


def latency_buckets(counts: TenantCounts, tenant: str, prefix: str = LATENCY_KEY
                    ) -> dict[float, float] | None:
    """The tenant's latency histogram in ``counts`` (``prefix``: its queue-wait one; None:
    the gateway gave none)."""
    found = {float(k.removeprefix(prefix)): v
             for k, v in counts.by_tenant.get(tenant, {}).items() if k.startswith(prefix)}
    return found or None


def ranged(row: Mapping[str, Any], key: str, spec: str, unit: str = "") -> str:
    """The median, then (lowest..highest) over rounds; 'n/a' when not measured."""
    return "n/a" if row.get(key) is None else with_range(row, key, spec, unit)
