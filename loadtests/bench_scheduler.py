"""Benchmark the MIG placement scheduler; prints a Markdown table of measured figures.

    .venv/bin/python loadtests/bench_scheduler.py [--quick] [--json]

Import :func:`run_benchmarks` (or :func:`run`, the ``make bench`` contract) to get the
rows as dicts: ``metric``, ``value``, ``goal``, ``met``, ``detail``, plus numeric
figures; keys ending in ``ratio`` are the headline ones. Every figure is measured in this
run, side by side with its baseline; medians where a figure repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.harness import table
from scheduler.exact import solve_exact
from scheduler.heuristic import solve_heuristic
from scheduler.objective import score
from scheduler.planner import plan_placement
from scheduler.profiles import GPU_TYPES
from scheduler.replan import fleet_after, with_targets
from scheduler.request import PlannerOptions, PlanningRequest
from scheduler.simulation.scenario import Scenario
from scheduler.simulation.scenario import run as run_scenario
from scheduler.sizing import replica_rps
from scheduler.snapshot import build_snapshot
from scheduler.workloads import (
    MODEL_SIZES,
    SMALL_MODELS,
    SPEEDUP,
    WHOLE_GPU_SPEEDUP,
    synthetic_fleet,
    synthetic_pools,
)

Row = dict[str, Any]


def _row(
    metric: str, value: str, goal: str, met: bool | None, detail: str = "", **figures: float
) -> Row:
    return {"metric": metric, "value": value, "goal": goal, "met": met, "detail": detail,
            **figures}  # fmt: skip


def optimality_gap(instances: int = 20, seed: int = 0, time_limit_s: float = 20.0) -> list[Row]:
    """Heuristic vs the CP-SAT optimum on small generated instances."""
    gpu_gaps, equal, proved, unplaced_gaps, ratios = [], 0, 0, [], []
    for i in range(instances):
        rng = random.Random(seed * 1000 + i)
        fleet = synthetic_fleet(rng.randint(2, 6), gpus_per_node=2)
        pools = synthetic_pools(rng.randint(4, 10), rng, load=0.8)
        snapshot = build_snapshot(PlanningRequest(fleet=fleet, pools=pools))
        heuristic = solve_heuristic(snapshot, "efficiency", time.monotonic, rng, 0.5, 4)
        exact = solve_exact(snapshot, "efficiency", time_limit_s, 2, seed)
        if exact is None:
            continue
        best = score(snapshot, exact.assignment)
        proved += exact.status == "optimal"
        h = heuristic.score
        equal += h.key("efficiency") == best.key("efficiency")
        gpu_gaps.append((h.gpus_used - best.gpus_used) / max(1, best.gpus_used))
        ratios.append(h.gpus_used / max(1, best.gpus_used))
        unplaced_gaps.append(sum(h.unplaced_by_priority) - sum(best.unplaced_by_priority))
    n = len(gpu_gaps)
    median_gap = statistics.median(gpu_gaps) if gpu_gaps else math.nan
    return [
        _row(
            "optimality gap, GPUs used (heuristic vs CP-SAT optimum)",
            f"median {100 * median_gap:.1f}%, max {100 * max(gpu_gaps):.1f}%",
            "0",
            median_gap == 0,
            f"{n} instances (2-6 GPUs, 4-10 pools), {proved} proved optimal; heuristic equal "
            f"on the whole objective in {equal}/{n}; extra unplaced pools "
            f"{sum(unplaced_gaps)}; the planner itself uses CP-SAT here (gap 0 when proved)",
            heuristic_vs_optimum_gpus_ratio=statistics.median(ratios) if ratios else math.nan,
            instances=n,
        )
    ]


def _whole_gpus(pool: Any, kind: Any) -> int:
    mu = (replica_rps(pool, kind, 0) or 0.0) * WHOLE_GPU_SPEEDUP / SPEEDUP[0]
    return max(pool.min_replicas, math.ceil(pool.target_rps / mu)) if mu else 0


def gpus_vs_whole(pools: int = 200, gpus: int = 400, seed: int = 1) -> list[Row]:
    """GPUs this planner uses vs one whole GPU per replica (no MIG), same demand."""
    rng = random.Random(seed)
    specs = synthetic_pools(pools, rng, load=1.2, sizes=MODEL_SIZES)
    request = PlanningRequest(fleet=synthetic_fleet(gpus), pools=specs)
    plan = plan_placement(request, rng=random.Random(seed))
    kind = GPU_TYPES["A100-80GB"]
    whole = sum(_whole_gpus(p, kind) for p in specs)
    ratio = plan.metrics.gpus_used / whole
    return [
        _row(
            "GPUs used vs whole GPU per pool",
            f"{ratio:.2f}x ({plan.metrics.gpus_used} vs {whole})",
            "<= 0.70x",
            ratio <= 0.70,
            f"{pools} pools, realistic model-size mix, {plan.metrics.pools_unplaced} unplaced, "
            f"solver {plan.solver}",
            gpus_vs_whole_gpu_ratio=ratio,
        )
    ]


def plan_time(gpus: int = 1000, pools: int = 5000, repeats: int = 3, seed: int = 2) -> list[Row]:
    """Wall time of one full plan (sizing, placement, validation) at fleet scale."""
    rng = random.Random(seed)
    specs = synthetic_pools(pools, rng, load=0.35, sizes=SMALL_MODELS)
    request = PlanningRequest(fleet=synthetic_fleet(gpus), pools=specs)
    times, plan = [], None
    for r in range(repeats):
        started = time.perf_counter()
        plan = plan_placement(request, rng=random.Random(r))
        times.append(time.perf_counter() - started)
    assert plan is not None
    median = statistics.median(times)
    m = plan.metrics
    return [
        _row(
            f"plan time, {gpus} GPUs x {pools} pools",
            f"{median:.2f} s (median of {repeats})",
            "<= 2 s",
            median <= 2.0,
            f"solver {plan.solver}; {m.gpus_used} GPUs used, {m.pools_placed} placed, "
            f"{m.pools_degraded} degraded, {m.pools_unplaced} unplaced",
            seconds=round(median, 3),
        )
    ]


def disruption(
    gpus: int = 32, pools: int = 40, seed: int = 3, time_limit_s: float = 10.0
) -> list[Row]:
    """Re-plan after every pool's demand moves by up to +/-10%.

    Disruption is counted as mig-parted causes it: a GPU whose profile counts change is
    rebuilt and loses every instance (``instances destroyed``); ``disrupted`` adds the
    instances handed to another pool or no longer needed. The first plan packs an empty
    fleet for efficiency; the re-plan runs under each objective, ``auto`` being the
    default (stability, since the fleet now runs pools).
    """
    rng = random.Random(seed)
    specs = synthetic_pools(pools, rng, load=1.2, sizes=SMALL_MODELS)
    fleet = synthetic_fleet(gpus)
    first = plan_placement(
        PlanningRequest(
            fleet=fleet,
            pools=specs,
            options=PlannerOptions(objective="efficiency", time_limit_s=time_limit_s, seed=seed),
        ),
        rng=random.Random(seed),
    )
    change = random.Random(seed + 1)
    targets = {p.name: p.target_rps * change.uniform(0.9, 1.1) for p in specs}
    instances = sum(p.replicas_placed for p in first.pools)
    rows = []
    for objective in ("efficiency", "stability", "auto"):
        options = PlannerOptions(objective=objective, time_limit_s=time_limit_s, seed=seed)
        again = plan_placement(
            PlanningRequest(
                fleet=fleet_after(fleet, first), pools=with_targets(specs, targets), options=options
            ),
            rng=random.Random(seed),
        )
        m = again.metrics
        rows.append(
            _row(
                f"re-plan after a 10% demand change ({objective})",
                f"{m.instances_disrupted} instances disrupted "
                f"({100 * m.instances_disrupted / max(1, instances):.0f}%), "
                f"{m.instances_destroyed} destroyed by {m.gpus_repartitioned} GPU rebuilds",
                "low",
                None,
                f"{instances} instances on {first.metrics.gpus_used} GPUs before; "
                f"{m.gpus_used} GPUs after; {m.instances_kept} kept, {m.instances_moved} moved, "
                f"{m.instances_removed} removed; objective {again.objective}; "
                f"solver {again.solver} ({again.solver_status})",
                disrupted_instances_ratio=m.instances_disrupted / max(1, instances),
                moved_instances_ratio=m.instances_moved / max(1, instances),
                repartitioned_gpus_ratio=m.gpus_repartitioned / max(1, first.metrics.gpus_used),
                instances_disrupted=m.instances_disrupted,
                instances_destroyed=m.instances_destroyed,
                gpus_repartitioned=m.gpus_repartitioned,
                gpus_used=m.gpus_used,
            )
        )
    return rows


def simulation(scenario: Scenario | None = None) -> list[Row]:
    """Simulated day: utilisation of this planner vs each baseline, queueing vs no MIG."""
    scenario = scenario or Scenario()
    results = run_scenario(scenario)
    ours, rest = results[0], results[1:]
    whole = next(r for r in results if r.name.startswith("whole GPU"))
    rows = [
        _row(
            "simulated utilisation (this planner)",
            f"{100 * ours.utilisation:.0f}%",
            ">= 68%",
            ours.utilisation >= 0.68,
            f"{scenario.pools} pools, {scenario.gpus} GPUs, {scenario.hours:g} h; "
            f"GPUs in use {ours.gpus_used_mean:.1f} (peak {ours.gpus_used_peak}); "
            f"SLO attainment {100 * ours.slo_attainment:.1f}%; {ours.repartitions} repartitions",
            utilisation=round(ours.utilisation, 3),
        )
    ]
    for r in rest:
        times = ours.utilisation / max(r.utilisation, 1e-9)
        rows.append(
            _row(
                f"simulated utilisation: {r.name}",
                f"{100 * r.utilisation:.0f}% (ours is {times:.1f}x)",
                "below ours",
                r.utilisation < ours.utilisation,
                f"GPUs in use {r.gpus_used_mean:.1f}; SLO attainment "
                f"{100 * r.slo_attainment:.1f}%; queue {r.mean_queue_ms:.0f} ms; pending "
                f"{r.pending_replica_minutes:.0f} replica-min; refused instances "
                f"{r.refused_instances}; {r.repartitions} repartitions",
                ours_vs_baseline_utilisation_ratio=times,
            )
        )
    cut = 1 - ours.mean_queue_ms / whole.mean_queue_ms if whole.mean_queue_ms else 0.0
    rows.append(
        _row(
            "simulated queueing vs whole GPU per pool",
            f"{100 * cut:.0f}% less "
            f"({ours.mean_queue_ms:.0f} vs {whole.mean_queue_ms:.0f} ms mean)",
            ">= 60% less",
            cut >= 0.60,
            f"pending replica-minutes {ours.pending_replica_minutes:.0f} vs "
            f"{whole.pending_replica_minutes:.0f}",
            queueing_vs_whole_gpu_ratio=ours.mean_queue_ms / max(whole.mean_queue_ms, 1e-9),
        )
    )
    return rows


def run_benchmarks(quick: bool = False) -> list[Row]:
    """All benchmark rows; ``quick`` shrinks every size (for smoke tests)."""
    steps: list[Callable[[], list[Row]]]
    if quick:
        steps = [
            lambda: optimality_gap(instances=3, time_limit_s=5.0),
            lambda: gpus_vs_whole(pools=30, gpus=60),
            lambda: plan_time(gpus=50, pools=200, repeats=1),
            lambda: disruption(gpus=8, pools=10, time_limit_s=2.0),
            lambda: simulation(Scenario(gpus=12, pools=12, hours=3, replan_min=30.0)),
        ]
    else:
        steps = [optimality_gap, gpus_vs_whole, plan_time, disruption, simulation]
    rows: list[Row] = []
    for step in steps:
        rows.extend(step())
    return rows


def run() -> list[Row]:
    """The ``make bench`` contract: every benchmark at full size."""
    return run_benchmarks()


def markdown(rows: list[Row]) -> str:
    def met(r: Row) -> str:
        return "-" if r["met"] is None else ("yes" if r["met"] else "no")

    return table(("metric", "value", "goal", "met", "detail"),
                 ((r["metric"], r["value"], r["goal"], met(r), r["detail"]) for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    args = parser.parse_args()
    rows = run_benchmarks(quick=args.quick)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
