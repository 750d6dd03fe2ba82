"""The planners' common objective, computed the same way for every solver.

An :data:`Assignment` maps each pool to its instances as (GPU position, start slot). A
pool is either placed whole (``replicas`` instances) or not at all; the degraded
fallback runs after the solvers and is not part of the objective.

Terms, in order of importance:

1. unplaced pools per priority tier, highest priority first;
2. ``efficiency``: GPUs used, fragmentation, GPUs repartitioned, instances moved;
   ``stability``: GPUs repartitioned, instances moved, GPUs used, fragmentation.

*Fragmentation* sums, over used MIG GPUs, the free memory slots the largest
still-placeable profile cannot use: of the planned layout on a rebuilt GPU, of the
current layout (idle instances included: they stay) on one that is not.

Disruption is modelled as mig-parted (the GPU Operator's MIG manager) applies a config:
a config is counts per profile, and a GPU whose counts already match is left alone, while
any other GPU is *rebuilt*: every instance on it is destroyed (``ClearMigConfig``) and the
new set is created where the driver puts it (start slots cannot be chosen). So:

- a GPU is *repartitioned* (rebuilt) when its planned instances need more of some profile
  than it has now (or MIG is off on it). A GPU that has enough keeps its whole current
  layout, surplus instances idle, and the node's config lists its current counts;
- an instance is *kept* only on a GPU that is not rebuilt: per (pool, profile) on that
  GPU, min(planned, current). Nothing on a rebuilt GPU is kept, whatever its slot;
- an instance is *moved* when its pool ran it before and the plan does not keep it:
  per pool, min(current, planned) minus kept. *Disrupted* instances (plan metrics) are
  every current pool instance that is not kept.

A plan that only moves instances between slots therefore changes nothing (mig-parted
skips the GPU), and one that "keeps" an instance on a rebuilt GPU is not credited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.layouts import fragmentation, mask_of
from scheduler.snapshot import GpuView, Snapshot

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


def rebuilt(gpu: GpuView, planned_profiles: Iterable[int]) -> bool:
    """Whether mig-parted must rebuild ``gpu`` to give it ``planned_profiles``: some
    profile is wanted more often than the GPU has it now (every count, when MIG is off)."""
    if not gpu.kind.mig_capable:
        return False
    have = Counter(c.profile for c in gpu.current) if gpu.mig_enabled else Counter()
    want = Counter(planned_profiles)
    return any(n > have[p] for p, n in want.items())


def kept_on(gpu: GpuView, planned: Iterable[tuple[str, int]]) -> Counter[tuple[str, int]]:
    """(pool, profile) -> instances that keep serving that pool on a GPU not rebuilt."""
    want = Counter(planned)
    have = Counter((c.pool, c.profile) for c in gpu.current if c.pool is not None)
    return Counter({key: min(n, have[key]) for key, n in want.items() if have[key]})


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
        if gpu.kind.mig_capable:
            if rebuilt(gpu, (p for _, p, _ in planned)):
                frag += fragmentation(mask_of((p, s) for _, p, s in planned))
                repartitioned += 1
                continue
            # mig-parted leaves the GPU as it is: its slots, not the planned ones, count.
            frag += fragmentation(mask_of(gpu.current_placements))
        kept += sum(kept_on(gpu, ((pool, p) for pool, p, _ in planned)).values())
    moved = -kept
    for d in snapshot.demands:
        if d.pool in placed:
            moved += min(snapshot.current_by_pool.get(d.pool, 0), len(assignment[d.pool]))
    return PlanScore(tuple(unplaced), used, frag, repartitioned, moved, kept)
