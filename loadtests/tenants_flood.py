"""Issue 36's flood scenarios of ``bench_tenants`` (``--scenarios flood``; pure, no I/O):
a closed-loop flood of :data:`FLOOD_IN_FLIGHT` requests in flight that retries every
refusal at once, beside a light tenant paced open loop (critical beside a sheddable
flood, standard beside a standard one), three standard tenants sharing the flood
(Jain's index of their goodput) and the flood alone without tenancy (the pool's goodput
the others compare with); each on four gateways (:data:`ARMS`): before (refusals
answered at once, its pool queueing in Triton), tarpit (refusals answered after the
tenancy's ``refusal_delay_ms``), after (both: queued in the gateway, ``gateway_queue``,
and the tarpit) and nolane (after without the light tenant's lane, ``lane_per_member``
0); with ``bench_tenants --levels`` (a model with Triton priority levels) a fifth,
nolevels (the tarpit with the tenancy's ``triton_levels`` off: the classes not given to
Triton as levels). Beside them, at the member (:data:`MEMBER`): no gateway, the light
tenant and a flood of the pool's capacity in flight straight at Triton, the floor any
gateway that keeps the member busy at that capacity stands on. Their phases, goals, rows
and table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadtests.harness import finite_median, num, table
from loadtests.tenants_figures import (
    EXACT,
    LATENCY_KINDS,
    LATENCY_MARKS,
    Measured,
    figures,
    ranged,
)
from loadtests.tenants_scenarios import (
    JAIN_GOAL,
    PACED_SHARE,
    PACED_STREAMS,
    Phase,
    Samples,
    TenantLoad,
    fairness_row,
    verdict,
    whole,
)

FLOOD_IN_FLIGHT = 64  # issue 36's noisy neighbour: closed loop, every refusal retried at once
# issue 36's goals (the flood scenarios, after: the gateway queues)
FLOOD_SUCCESS_GOAL_PCT, FLOOD_P99_GOALS = 99.5, {"critical": 1.2, "standard": 1.5}
FLOOD_GOODPUT_GOAL_RATIO = 0.95
# the gateways: refusals at once, queueing in Triton; queueing in the gateway and refusals
# after the tenancy's delay (a tarpit); the same without the light tenant's lane
# (lane_per_member 0); the tarpit alone, queueing in Triton
BEFORE, AFTER, NO_LANE, TARPIT = "flood-before", "queued", "queued-nolane", "flood-tarpit"
ARMS = ((BEFORE, "before"), (AFTER, "after"), (NO_LANE, "nolane"),
        (TARPIT, "tarpit"))  # gateway, phase tag
# with a model that has Triton priority levels: the tarpit without the classes as levels
NO_LEVELS = "flood-tarpit-nolevels"
LEVELS_ARMS = (*ARMS, (NO_LEVELS, "nolevels"))
# no gateway: the light tenant and a flood of the pool's capacity in flight (closed loop)
# straight at the member. What a gateway whose queue gives each member exactly its
# capacity, ordered perfectly and costing nothing, would give the light tenant: Triton
# sees no class, so one scenario (the light critical tenant) stands for both
MEMBER = "member"
MEMBER_TAG = "member"


def arms(levels: bool = False) -> tuple[tuple[str, str], ...]:
    """The gateways of a run: :data:`LEVELS_ARMS` for a model with levels."""
    return LEVELS_ARMS if levels else ARMS


def flood_phases(levels: bool = False, capacity: int = 0) -> list[Phase]:
    """Issue 36's flood (the module docstring), on each gateway of :func:`arms`; each
    alone run right before its mixed one. ``flood-goodput``: the flood alone without
    tenancy. ``capacity`` > 0: at the member too (:data:`MEMBER`), its flood that many in
    flight."""
    light_critical = TenantLoad("light-critical", "critical", PACED_STREAMS, PACED_SHARE)
    light_standard = TenantLoad("light-standard", "standard", PACED_STREAMS, PACED_SHARE)
    shed_flood = TenantLoad("flood-sheddable", "sheddable", FLOOD_IN_FLIGHT)
    std_flood = TenantLoad("flood-standard64", "standard", FLOOD_IN_FLIGHT)
    thirds = [FLOOD_IN_FLIGHT // 3 + (i < FLOOD_IN_FLIGHT % 3) for i in range(3)]
    fair = tuple(TenantLoad(f"flood-fair-{chr(ord('a') + i)}", "standard", n)
                 for i, n in enumerate(thirds))
    phases = [Phase("flood-goodput", "alone-none", (std_flood,), "none")]
    for side, tag in arms(levels):
        phases += [
            Phase("flood-priority", f"alone-{tag}", (light_critical,), side),
            Phase("flood-priority", f"mixed-{tag}", (light_critical, shed_flood), side),
            Phase("flood-standard", f"alone-{tag}", (light_standard,), side),
            Phase("flood-standard", f"mixed-{tag}", (light_standard, std_flood), side),
            Phase("flood-fairness", f"mixed-{tag}", fair, side),
        ]
    if capacity > 0:
        held = TenantLoad(shed_flood.tenant, shed_flood.priority, capacity)
        phases += [
            Phase("flood-priority", f"alone-{MEMBER_TAG}", (light_critical,), MEMBER),
            Phase("flood-priority", f"mixed-{MEMBER_TAG}", (light_critical, held), MEMBER),
        ]
    return phases


def flood_rows(samples: Samples, model: str, protocol: str) -> list[dict[str, Any]]:
    """Issue 36's table, one row per flood scenario and gateway (:data:`ARMS`): the
    light tenant alone and beside the flood, the flood's goodput, the pool's goodput
    beside the flood over the flood's alone without tenancy, Jain's index."""
    def runs(scenario: str, phase: str) -> list[dict[str, Measured]]:
        return samples.get((scenario, phase, model, protocol), [])

    base = [figures(run[t]).admitted_per_s for run in runs("flood-goodput", "alone-none")
            for t in run]
    base_goodput = finite_median(base)
    rows: list[dict[str, Any]] = []
    for _, tag in (*LEVELS_ARMS, (MEMBER, MEMBER_TAG)):  # those measured
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
    if tag == MEMBER_TAG:  # no gateway: what the goals are measured against
        row["goal"], row["met"] = "no gateway: the flood held at capacity", "reference"
        return row
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
    """Issue 36's table: before (queued in Triton), after (in the gateway), tarpit
    (refusals after the tenancy's delay)."""
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
        "queues in Triton, refusals at once; after: in the gateway (gateway_queue), tenancy "
        "refusals answered after the tenancy's refusal_delay_ms; nolane: after without "
        "the light tenant's lane (lane_per_member 0); tarpit: that delay, queued in Triton; "
        "nolevels (a model with Triton priority levels): tarpit without the classes as "
        "Triton's levels (tenancy triton_levels: false); member: no gateway, the light "
        "tenant and a flood of the pool's capacity in flight straight at Triton (the floor "
        "of a gateway that keeps the member busy at that capacity; Triton sees no class, "
        "so it stands for both scenarios).",
        table(("scenario", "gateway", "model", "protocol", "light tenant", "success alone %",
               "success with flood %", "p50 vs alone", "p99 vs alone", "queue wait p50/p99 ms",
               "flood goodput/s", "pool goodput vs no tenancy", "Jain", "met?"), cells)])
