"""The report of ``bench_tenants`` (pure but for the plot's file): each tenant's row
(medians over rounds, ratios against its alone run, the gateway's own figures against
the client's, the verdict), every scenario's rows from the samples, the markdown table
and the PNG."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness import figure, finite_median, num, spread, table
from loadtests.tenants_figures import (
    EXACT,
    FIGURES_GOAL_MS,
    FIGURES_GOAL_RATIO,
    LATENCY_KINDS,
    LATENCY_MARKS,
    TENANT_REQUESTS,
    Measured,
    figures,
    figures_within,
    ranged,
)
from loadtests.tenants_flood import (
    FLOOD_GOODPUT_GOAL_RATIO,
    FLOOD_P99_GOALS,
    flood_markdown,
    flood_rows,
)
from loadtests.tenants_scenarios import (
    ALONE_GOALS,
    COST_GOAL,
    COST_GOAL_RATIO,
    FLOOD_SHARE,
    GOALS,
    JAIN_GOAL,
    P99_GOAL_RATIO,
    PACED_SHARE,
    PACED_STREAMS,
    SUCCESS_GOAL_PCT,
    Key,
    Samples,
    fairness_row,
    verdict,
)

# -- rows ------------------------------------------------------------------------------

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
        none = runs_of("cost", "none", "solo")
        if none:
            base = tenant_row(("cost", "none", model, protocol), "solo", none, None)
            rows.append(base)
        for phase in ("tenancy", "queued"):  # against the gateway without tenancy
            runs = runs_of("cost", phase, "solo")
            if none and runs:
                rows.append(cost_row(base, tenant_row(("cost", phase, model, protocol),
                                                      "solo", runs, None)))
        rows += flood_rows(samples, model, protocol)
    for row in rows:
        row["seconds"] = seconds
    return rows


def cost_row(base: Mapping[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (tenancy, or tenancy and the gateway's queue) with its throughput over
    ``base``'s (no tenancy) round by round, and the cost goal."""
    ratios = [a / b for a, b in zip(row["admitted_per_s_each"], base["admitted_per_s_each"],
                                    strict=False) if a is not None and b]
    ratio = finite_median(ratios)
    row.update(throughput_ratio=ratio, throughput_ratio_range=spread(ratios), goal=COST_GOAL,
               met="n/a (not measured)" if ratio is None
               else "yes" if ratio >= COST_GOAL_RATIO else "NO (throughput)")
    return row


# -- output ----------------------------------------------------------------------------

def bounded(row: Mapping[str, Any], key: str, bound: str, spec: str = ".2f") -> str:
    """A figure, '<=' (``bound``) before it when it is an upper bound; '' when not a
    column of this row; 'n/a' when not measured."""
    if key not in row:
        return ""
    text = num(row[key], spec)
    return text if text == "n/a" else bound + text


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
        "the same client at capacity in flight against a gateway without 'tenancy:', "
        "one with a single tenant, and one with that tenant whose pool queues in the "
        "gateway (queued), interleaved. Paced: open loop (h2load --rps) at "
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
    """The overload scenarios' figure (``bench_tenants.png``) and the flood's
    (``bench_tenants_flood.png``), each where its rows were measured."""
    flood = [r for r in rows if r.get("kind") == "flood"]
    overload = [r for r in rows if r.get("kind") != "flood"]
    return ((overload_plot(overload, out) if overload else [])
            + (flood_plot(flood, out) if flood else []))


def model_cells(rows: Sequence[Mapping[str, Any]]
                ) -> tuple[list[tuple[str, str]], Any, list[str]]:
    """A figure's x axis: each (model, protocol) measured, in the rows' order, their
    positions and their tick labels."""
    cells = list(dict.fromkeys((str(r["model"]), str(r["protocol"])) for r in rows))
    labels = [f"{m.replace('efficientnet_', 'effnet-')}\n{p}" for m, p in cells]
    return cells, np.arange(len(cells)), labels


def flood_plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """Issue 36's flood: per scenario, the light tenant's p99 over alone and the pool's
    goodput over the flood's without tenancy, one bar per gateway (and the member)."""
    cells, x, labels = model_cells(rows)
    tags = list(dict.fromkeys(str(r["phase"]) for r in rows
                              if r["scenario"] != "flood-fairness"))
    path = out / "bench_tenants_flood.png"
    with figure(path, 2, 2, figsize=(11, 7)) as (fig, axes):
        for row, (scenario, limit) in enumerate((("flood-priority", FLOOD_P99_GOALS["critical"]),
                                                 ("flood-standard", FLOOD_P99_GOALS["standard"]))):
            for col, (key, goal, title) in enumerate((
                    ("p99_vs_alone_ratio", limit, "light tenant's p99 / alone"),
                    ("pool_goodput_vs_none_ratio", FLOOD_GOODPUT_GOAL_RATIO,
                     "pool's goodput / without tenancy"))):
                ax = axes[row][col]
                width = 0.8 / max(len(tags), 1)
                for i, tag in enumerate(tags):
                    ax.bar(x + (i - (len(tags) - 1) / 2) * width,
                           [next((float(r[key]) for r in rows if r["scenario"] == scenario
                                  and r["phase"] == tag and r.get(key) is not None
                                  and (r["model"], r["protocol"]) == cell), math.nan)
                            for cell in cells], width, label=tag)
                ax.axhline(goal, color="k", linestyle="dashed", linewidth=1)
                ax.set_xticks(x, labels)
                ax.set_title(f"{scenario}: {title}")
                ax.legend(fontsize=8)
        fig.suptitle("Issue 36: a closed-loop flood beside a light tenant (dashed: goals; "
                     "member: no gateway, the flood held at capacity)")
    return [path]


def overload_plot(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    cells, x, labels = model_cells(rows)
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
