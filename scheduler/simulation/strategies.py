"""Allocation strategies the simulator compares: this planner and three baselines.

- :class:`PlannedMig`: this scheduler, re-planning from the current layout.
- :class:`WholeGpuPerPool`: no MIG; every replica is a whole GPU.
- :class:`StaticUniformLayout`: every GPU partitioned the same (``all-1g`` or
  ``all-balanced``), pools take whichever fitting instances are free.
- :class:`CountFirstFit`: pools sized like ours, packed first-fit by counting compute
  and memory slices only (mig-parted style), then created in that order on the real
  slot rules: instances the driver cannot place are refused.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from scheduler.inventory import Fleet
from scheduler.planner import plan_placement
from scheduler.pools import PoolSpec
from scheduler.profiles import COMPUTE_SLICES, GPU_TYPES, MEMORY_SLOTS, PROFILES, GpuType
from scheduler.replan import fleet_after, with_targets
from scheduler.request import PlannerOptions, PlanningRequest
from scheduler.sizing import replica_rps, size_pool
from scheduler.workloads import SPEEDUP, WHOLE_GPU_SPEEDUP


@dataclass(frozen=True)
class PoolAllocation:
    replicas: int
    mu: float
    """Requests/s one replica serves at the SLO."""
    compute_slices: int
    """Compute slices per replica (7 for a whole GPU)."""


@dataclass(frozen=True)
class Allocation:
    pools: Mapping[str, PoolAllocation]
    gpus_used: int
    repartitioned: int = 0
    refused: int = 0
    pending: int = 0
    """Replicas wanted but not placed."""


class Strategy(Protocol):
    name: str

    def allocate(self, forecast: Mapping[str, float]) -> Allocation: ...


def _kind(fleet: Fleet) -> GpuType:
    return GPU_TYPES[fleet.nodes[0].gpus[0].type]


def _wanted(pool: PoolSpec, rps: float, mu: float) -> int:
    if mu <= 0:
        return 0
    return min(pool.max_replicas, max(pool.min_replicas, math.ceil(rps / mu - 1e-9)))


@dataclass
class PlannedMig:
    fleet: Fleet
    pools: Sequence[PoolSpec]
    options: PlannerOptions
    name: str = "MIG planner (this)"
    seed: int = 0

    def allocate(self, forecast: Mapping[str, float]) -> Allocation:
        request = PlanningRequest(
            fleet=self.fleet, pools=with_targets(self.pools, forecast), options=self.options
        )
        plan = plan_placement(
            request, wall_clock=lambda: datetime(2025, 1, 1, tzinfo=UTC),
            rng=random.Random(self.seed),
        )  # fmt: skip
        self.fleet = fleet_after(self.fleet, plan)
        pools = {}
        for p in plan.pools:
            if p.replicas_placed and p.profile_id is not None:
                compute = PROFILES[p.profile_id].compute_slices if p.profile_id >= 0 else 7
                pools[p.name] = PoolAllocation(p.replicas_placed, p.replica_rps, compute)
        pending = sum(max(0, p.replicas_wanted - p.replicas_placed) for p in plan.pools)
        return Allocation(
            pools, plan.metrics.gpus_used, plan.metrics.gpus_repartitioned, 0, pending
        )


@dataclass
class WholeGpuPerPool:
    fleet: Fleet
    pools: Sequence[PoolSpec]
    headroom: float = 1.0
    name: str = "whole GPU per pool (no MIG)"

    def allocate(self, forecast: Mapping[str, float]) -> Allocation:
        kind = _kind(self.fleet)
        free = self.fleet.gpu_count
        pools = {}
        pending = 0
        for pool in sorted(self.pools, key=lambda p: (-p.priority, p.name)):
            mu = (replica_rps(pool, kind, 0) or 0.0) * WHOLE_GPU_SPEEDUP / SPEEDUP[0]
            fits = kind.memory_gib >= pool.memory_need_gib(1)
            want = _wanted(pool, forecast[pool.name] * self.headroom, mu) if fits else 0
            got = min(want, free)
            free -= got
            pending += want - got
            if got:
                pools[pool.name] = PoolAllocation(got, mu, COMPUTE_SLICES)
        return Allocation(pools, self.fleet.gpu_count - free, pending=pending)


UNIFORM_LAYOUTS: Mapping[str, Mapping[int, int]] = {
    "all-1g": {19: 7},
    "all-balanced": {19: 2, 14: 1, 9: 1},
}


@dataclass
class StaticUniformLayout:
    fleet: Fleet
    pools: Sequence[PoolSpec]
    layout: str = "all-balanced"
    headroom: float = 1.0
    name: str = field(default="")

    def __post_init__(self) -> None:
        self.name = self.name or f"static {self.layout}"

    def allocate(self, forecast: Mapping[str, float]) -> Allocation:
        per_gpu = UNIFORM_LAYOUTS[self.layout]
        gpus = self.fleet.gpu_count
        kind = _kind(self.fleet)
        free = {pid: n * gpus for pid, n in per_gpu.items()}
        used = dict.fromkeys(per_gpu, 0)
        pools, pending = {}, 0
        ordered = sorted(self.pools, key=lambda p: (-p.priority, p.target_rps, p.name))
        for pool in ordered:
            sizing = size_pool(pool.model_copy(update={"target_rps": forecast[pool.name]}),
                               [kind.name], self.headroom)  # fmt: skip
            options = [o for o in sizing.options if o.profile in per_gpu]
            if not options:
                pending += sizing.best.replicas if sizing.best else 1
                continue
            option = next((o for o in options if free[o.profile] >= o.replicas), options[0])
            got = min(option.replicas, free[option.profile])
            free[option.profile] -= got
            used[option.profile] += got
            pending += option.replicas - got
            if got:
                compute = PROFILES[option.profile].compute_slices
                pools[pool.name] = PoolAllocation(got, option.replica_rps, compute)
        gpus_used = max(math.ceil(used[p] / per_gpu[p]) for p in per_gpu)
        return Allocation(pools, gpus_used, pending=pending)


@dataclass
class CountFirstFit:
    fleet: Fleet
    pools: Sequence[PoolSpec]
    headroom: float = 1.0
    name: str = "first-fit on counts"
    _previous: list[tuple[int, ...]] = field(default_factory=list)

    def allocate(self, forecast: Mapping[str, float]) -> Allocation:
        kind = _kind(self.fleet)
        gpus: list[list[tuple[str, int]]] = [[] for _ in range(self.fleet.gpu_count)]
        compute = [0] * len(gpus)
        memory = [0] * len(gpus)
        wanted: dict[str, tuple[int, float]] = {}
        pending = 0
        for pool in sorted(self.pools, key=lambda p: (-p.priority, p.name)):
            sizing = size_pool(pool.model_copy(update={"target_rps": forecast[pool.name]}),
                               [kind.name], self.headroom)  # fmt: skip
            option = sizing.best
            if option is None:
                continue
            wanted[pool.name] = (option.profile, option.replica_rps)
            spec = PROFILES[option.profile]
            for _ in range(option.replicas):
                for g in range(len(gpus)):  # counts only: "7 slices, 4+3 fits"
                    if (compute[g] + spec.compute_slices <= COMPUTE_SLICES
                            and memory[g] + spec.memory_slices <= MEMORY_SLOTS):  # fmt: skip
                        gpus[g].append((pool.name, option.profile))
                        compute[g] += spec.compute_slices
                        memory[g] += spec.memory_slices
                        break
                else:
                    pending += 1
        placed: dict[str, int] = {}
        refused = 0
        for instances in gpus:  # the driver creates them in order, first free start slot
            mask = 0
            for name, pid in instances:
                spec = PROFILES[pid]
                start = next((s for s in spec.start_slots if not spec.slot_mask(s) & mask), None)
                if start is None:
                    refused += 1
                    continue
                mask |= spec.slot_mask(start)
                placed[name] = placed.get(name, 0) + 1
        layouts = [tuple(sorted(pid for _, pid in g)) for g in gpus]
        changed = sum(a != b for a, b in zip(layouts, self._previous, strict=False))
        self._previous = layouts
        pools = {
            name: PoolAllocation(n, wanted[name][1], PROFILES[wanted[name][0]].compute_slices)
            for name, n in placed.items()
        }
        return Allocation(pools, sum(1 for g in gpus if g), changed, refused, pending)
