"""The planners' common objective, computed the same way for every solver.

An :data:`Assignment` maps each pool to its instances as (GPU position, start slot). A
pool is either placed whole (``replicas`` instances) or not at all; the degraded
fallback runs after the solvers and is not part of the objective.

Terms, in order of importance:

1. unplaced pools per priority tier, highest priority first;
2. ``efficiency``: GPUs used, fragmentation, GPUs repartitioned, instances moved;
   ``stability``: GPUs repartitioned, instances moved, GPUs used, fragmentation.

*Fragmentation* sums, over MIG GPUs, the free memory slots the largest still-placeable
profile cannot use. A GPU is *repartitioned* when its planned instances are not a subset
of its current ones (MIG Manager then reconfigures it, stopping its clients). An
instance is *moved* when its pool ran it before and the plan does not keep it where it
was: per pool, min(current, planned) minus kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.layouts import fragmentation, mask_of
from scheduler.profiles import WHOLE_DEVICE
from scheduler.snapshot import Snapshot

Assignment = Mapping[str, tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class PlanScore:
    unplaced_by_priority: tuple[int, ...]
    """Unplaced pools per priority tier (``Snapshot.priorities`` order)."""
    gpus_used: int
    fragmentation: int
    gpus_repartitioned: int
    instances_moved: int
    instances_kept: int

    def key(self, objective: str) -> tuple[int, ...]:
        if objective == "stability":
            rest = (
                self.gpus_repartitioned,
                self.instances_moved,
                self.gpus_used,
                self.fragmentation,
            )
        else:
            rest = (
                self.gpus_used,
                self.fragmentation,
                self.gpus_repartitioned,
                self.instances_moved,
            )
        return (*self.unplaced_by_priority, *rest)


def per_gpu(snapshot: Snapshot, assignment: Assignment) -> list[list[tuple[str, int, int]]]:
    """(pool, profile, start) planned on each GPU position."""
    profile_of = {d.pool: d.profile for d in snapshot.demands}
    out: list[list[tuple[str, int, int]]] = [[] for _ in snapshot.gpus]
    for pool, places in assignment.items():
        for g, start in places:
            out[g].append((pool, profile_of[pool], start))
    return out


def score(snapshot: Snapshot, assignment: Assignment) -> PlanScore:
    placed = {pool for pool, places in assignment.items() if places}
    tiers = snapshot.priorities
    unplaced = [0] * len(tiers)
    for d in snapshot.demands:
        if d.pool not in placed:
            unplaced[tiers.index(d.priority)] += 1
    used = frag = repartitioned = kept = 0
    for gpu, planned in zip(snapshot.gpus, per_gpu(snapshot, assignment), strict=True):
        if not planned:
            continue
        used += 1
        current = {(c.profile, c.start): c.pool for c in gpu.current}
        if gpu.kind.mig_capable:
            frag += fragmentation(mask_of((p, s) for _, p, s in planned))
            if any((p, s) not in current for _, p, s in planned):
                repartitioned += 1
        kept += sum(1 for pool, p, s in planned if current.get((p, s)) == pool)
    moved = -kept
    for d in snapshot.demands:
        if d.pool in placed:
            moved += min(snapshot.current_by_pool.get(d.pool, 0), len(assignment[d.pool]))
    return PlanScore(tuple(unplaced), used, frag, repartitioned, moved, kept)


def kept_instances(snapshot: Snapshot, pool: str, places: tuple[tuple[int, int], ...]) -> int:
    profile = next((d.profile for d in snapshot.demands if d.pool == pool), WHOLE_DEVICE)
    n = 0
    for g, start in places:
        n += any(
            c.pool == pool and c.profile == profile and c.start == start
            for c in snapshot.gpus[g].current
        )
    return n
