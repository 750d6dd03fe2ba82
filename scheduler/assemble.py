"""Assemble a PlacementPlan from the placements the planner chose: per-GPU layouts
(keeping idle instances on GPUs that need no repartition), metrics, and pool outcomes
with their reasons."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler import diagnose
from scheduler.layouts import fragmentation, largest_placeable, mask_of
from scheduler.leftover import FreeSpace
from scheduler.objective import rebuilt
from scheduler.plan import GpuPlan, PlacementPlan, PlanMetrics, PlannedInstance, PoolOutcome
from scheduler.profiles import MEMORY_SLOTS, PROFILES, WHOLE_DEVICE
from scheduler.request import PlanningRequest
from scheduler.sizing import SizingOption
from scheduler.snapshot import Demand, GpuView, Snapshot

Planned = tuple[str, int, int]
"""(pool, profile id, start slot) on one GPU."""


@dataclass(frozen=True)
class PoolPlacement:
    option: SizingOption
    places: tuple[tuple[int, int], ...]
    degraded: bool


def _instance(
    gpu: GpuView, profile: int, start: int, pool: str | None, kept: bool
) -> PlannedInstance:
    slices = MEMORY_SLOTS if profile == WHOLE_DEVICE else PROFILES[profile].memory_slices
    return PlannedInstance(
        profile_id=profile,
        profile=gpu.kind.profile_name(profile),
        start=start,
        memory_slices=slices,
        pool=pool,
        kept=kept,
    )


def _kept_layout(gpu: GpuView, planned: list[Planned]) -> tuple[PlannedInstance, ...]:
    """A GPU mig-parted leaves alone: its current instances where they are, handed to the
    planned pools by profile (a pool keeps the instances it runs first), the rest idle."""
    wanted: dict[int, list[str]] = {}
    for pool, p, _ in planned:
        wanted.setdefault(p, []).append(pool)
    current = sorted(gpu.current, key=lambda c: c.start)
    owner: dict[int, str | None] = {}
    for i, c in enumerate(current):  # first, pools that already run this instance
        if c.pool is not None and c.pool in wanted.get(c.profile, ()):
            wanted[c.profile].remove(c.pool)
            owner[i] = c.pool
    for i, c in enumerate(current):
        if i not in owner:
            rest = wanted.get(c.profile)
            owner[i] = rest.pop(0) if rest else None
    return tuple(
        _instance(gpu, c.profile, c.start, owner[i], owner[i] is not None and owner[i] == c.pool)
        for i, c in enumerate(current)
    )


def gpu_plan(gpu: GpuView, planned: list[Planned]) -> GpuPlan:
    base: dict[str, Any] = {"node": gpu.node, "index": gpu.index, "gpu_type": gpu.kind.name}
    if not gpu.kind.mig_capable:
        current = {(c.profile, c.start): c.pool for c in gpu.current}
        instances = tuple(
            _instance(gpu, p, s, pool, current.get((p, s)) == pool) for pool, p, s in planned
        )
        return GpuPlan(**base, mig_enabled=False, repartition=False, instances=instances)
    repartition = rebuilt(gpu, (p for _, p, _ in planned))
    if repartition:  # mig-parted destroys every instance and creates the planned set
        instances = tuple(
            _instance(gpu, p, s, pool, False) for pool, p, s in sorted(planned, key=lambda x: x[2])
        )
    else:
        instances = _kept_layout(gpu, planned)
    mask = mask_of((i.profile_id, i.start) for i in instances)
    largest = largest_placeable(mask)
    return GpuPlan(
        **base,
        mig_enabled=gpu.mig_enabled or repartition,
        repartition=repartition,
        instances=instances,
        fragmentation=fragmentation(mask) if planned else 0,
        largest_free=None if largest is None else gpu.kind.profile_name(largest),
    )


def _metrics(
    snapshot: Snapshot, gpus: tuple[GpuPlan, ...], outcomes: list[PoolOutcome]
) -> PlanMetrics:
    kept: dict[str, int] = {}
    placed: dict[str, int] = {}
    for g in gpus:
        for inst in g.instances:
            if inst.pool is not None:
                placed[inst.pool] = placed.get(inst.pool, 0) + 1
                kept[inst.pool] = kept.get(inst.pool, 0) + inst.kept
    moved = sum(
        min(n, placed.get(pool, 0)) - kept.get(pool, 0)
        for pool, n in snapshot.current_by_pool.items()
    )
    removed = sum(max(0, n - placed.get(pool, 0)) for pool, n in snapshot.current_by_pool.items())
    destroyed = sum(
        1 for g, view in zip(gpus, snapshot.gpus, strict=True) if g.repartition
        for c in view.current if c.pool is not None
    )  # fmt: skip
    used = [g for g in gpus if g.used]
    return PlanMetrics(
        gpus_total=len(gpus),
        gpus_used=len(used),
        memory_slices_used=sum(i.memory_slices for g in gpus for i in g.instances if i.pool),
        fragmentation=sum(g.fragmentation for g in gpus),
        gpus_repartitioned=sum(g.repartition for g in gpus),
        nodes_reconfigured=len({g.node for g in gpus if g.repartition}),
        instances_moved=moved,
        instances_kept=sum(kept.values()),
        instances_removed=removed,
        instances_disrupted=sum(snapshot.current_by_pool.values()) - sum(kept.values()),
        instances_destroyed=destroyed,
        pools_placed=sum(o.status == "placed" for o in outcomes),
        pools_degraded=sum(o.status == "degraded" for o in outcomes),
        pools_unplaced=sum(o.status == "unplaced" for o in outcomes),
    )


def _outcomes(
    request: PlanningRequest,
    snapshot: Snapshot,
    placements: Mapping[str, PoolPlacement],
    holders: Mapping[int, list[str]],
    space: FreeSpace,
) -> list[PoolOutcome]:
    out = []
    priority = {p.name: p.priority for p in request.pools}
    near: dict[int, list[tuple[int, str]]] = {}

    def neighbours(d: Demand) -> list[tuple[int, str]]:
        if d.signature not in near:
            names = {q for g in d.eligible for q in holders.get(g, ())}
            near[d.signature] = sorted((-priority[q], q) for q in names)
        return near[d.signature]

    for pool in request.pools:
        sizing = snapshot.sizings[pool.name]
        common: dict[str, Any] = {
            "name": pool.name,
            "model": pool.model,
            "priority": pool.priority,
            "priority_class": pool.priority_class_name,
            "target_rps": pool.target_rps,
        }
        pp = placements.get(pool.name)
        if pp is not None:
            n, option = len(pp.places), pp.option
            capacity = n * option.replica_rps
            reasons = []
            if pp.degraded:
                reasons.append(
                    diagnose.shortfall_reason(
                        pool, option, n, min(capacity, sizing.target_rps), sizing.target_rps
                    )
                )
            elif not option.meets_target:
                reasons.append(diagnose.under_target_reason(pool, option, sizing.target_rps))
            if pool.working_set is not None:
                reasons.append(diagnose.working_set_reason(pool, option))
            out.append(
                PoolOutcome(
                    **common,
                    status="degraded" if pp.degraded else "placed",
                    profile_id=option.profile,
                    replicas_wanted=sizing.best.replicas if sizing.best else n,
                    replicas_placed=n,
                    replica_rps=option.replica_rps,
                    served_rps=min(capacity, pool.target_rps),
                    gpu_types=option.gpu_types,
                    reasons=tuple(reasons),
                )
            )
        elif sizing.best is not None and sizing.best.replicas == 0:
            out.append(
                PoolOutcome(**common, status="scaled-to-zero", profile_id=sizing.best.profile)
            )
        else:
            reason = diagnose.unplaced_reason(request, snapshot, pool, sizing, space, neighbours)
            best = sizing.best
            out.append(
                PoolOutcome(
                    **common,
                    status="unplaced",
                    profile_id=best.profile if best else None,
                    replicas_wanted=best.replicas if best else 0,
                    replica_rps=best.replica_rps if best else 0.0,
                    gpu_types=best.gpu_types if best else (),
                    reasons=(reason,),
                )
            )
    return out


def assemble_plan(
    request: PlanningRequest,
    snapshot: Snapshot,
    placements: Mapping[str, PoolPlacement],
    *,
    plan_id: str,
    solver: str,
    solver_status: str,
    solve_seconds: float,
    created_at: datetime,
) -> PlacementPlan:
    per_gpu: list[list[Planned]] = [[] for _ in snapshot.gpus]
    holders: dict[int, list[str]] = {}
    for pool, pp in placements.items():
        for g, s in pp.places:
            per_gpu[g].append((pool, pp.option.profile, s))
            holders.setdefault(g, []).append(pool)
    gpus = tuple(gpu_plan(gpu, per_gpu[gpu.position]) for gpu in snapshot.gpus)
    space = FreeSpace(snapshot, ((g, item) for g, items in enumerate(per_gpu) for item in items))
    outcomes = _outcomes(request, snapshot, placements, holders, space)
    return PlacementPlan(
        id=plan_id,
        created_at=created_at,
        objective=request.options.objective,
        solver=solver,
        solver_status=solver_status,
        solve_seconds=round(solve_seconds, 4),
        metrics=_metrics(snapshot, gpus, outcomes),
        gpus=gpus,
        pools=tuple(outcomes),
    )
