"""The overload scenarios of ``bench_tenants`` (pure, no I/O): the tenants' loads and the
phases that run them (noisy neighbour, priority, fairness, paced, cost), their goals
and verdicts, and the fairness row (Jain's index over the tenants)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtests.harness import finite_median, spread
from loadtests.tenants_figures import Measured, figures, jain_index

LIGHT_IN_FLIGHT, HEAVY_IN_FLIGHT = 1, 10  # the noisy neighbour: 10x the light tenant
# paced tenants: this share of Triton's own throughput, over up to PACED_STREAMS at once;
# the floods beside them: FLOOD_SHARE of it, open loop too, up to HEAVY_IN_FLIGHT at once
PACED_SHARE, PACED_STREAMS, FLOOD_SHARE = 0.1, 2, 4.0
FAIR_TENANTS, FAIR_SHARE_OF_CAPACITY = 3, 0.8
SUCCESS_GOAL_PCT, P99_GOAL_RATIO, JAIN_GOAL = 99.0, 1.2, 0.95
# tenancy, and tenancy with the gateway's queue, cost at most 3 % of throughput (issue 36)
COST_GOAL_RATIO = 0.97
COST_GOAL = f"throughput >= {COST_GOAL_RATIO:g}x without tenancy"
ALONE_SUCCESS_GOAL_PCT, PACED_P99_GOAL_RATIO = 99.9, 1.5


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


def cost_phases(capacity: int) -> list[Phase]:
    """One client at capacity in flight, no flood: through a gateway without tenancy, one
    with a single tenant, and one with that tenant whose pool queues in the gateway
    (``gateway_queue``): what tenancy and queueing cost (goal: :data:`COST_GOAL_RATIO`)."""
    solo = TenantLoad("solo", "standard", capacity)
    return [Phase("cost", "none", (solo,), "none"), Phase("cost", "tenancy", (solo,), "one"),
            Phase("cost", "queued", (solo,), "one-queued")]


Key = tuple[str, str, str, str]  # (scenario, phase, model, protocol)
Samples = dict[Key, list[dict[str, Measured]]]


# -- goals -----------------------------------------------------------------------------

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
