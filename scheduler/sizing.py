"""Sizing: for each pool, the profile and replica count that meet its target load with the
fewest slices.

Capacity per replica comes from the pool's capacity entries (requests/s at the SLO, or a
batching latency model evaluated at the SLO, as in Nexus). Options are ranked by memory
slices used (a whole non-MIG device counts as 8), then compute slices, then replicas; an
option holds on every GPU type where that profile reaches the target with at most that
many replicas, so the placer may use any of them. The lower-ranked options are kept: a
pool that does not fit at its best size can fall back to them.

A replica's memory need is the pool's ``memory_gib`` (every model it serves loaded), or,
for a pool with a ``working_set`` (:mod:`scheduler.working_set`), the largest footprint
sum a replica holds under the gateway's residency policy at the measured demand. That
need shrinks as replicas are added (the models spread), so a profile too small at the
replica count the target asks for may still serve the pool with a few more replicas:
the fewest that fit it are taken, and the ranking by slices decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES, PROFILES, WHOLE_DEVICE, GpuType


@dataclass(frozen=True)
class SizingOption:
    profile: int
    """MIG profile id, or WHOLE_DEVICE for a non-MIG GPU."""
    replicas: int
    gpu_types: tuple[str, ...]
    replica_rps: float
    """Per-replica capacity, the lowest over ``gpu_types`` (what is guaranteed)."""
    meets_target: bool
    memory_gib: float = 0.0
    """Memory one replica needs at this replica count (its working set, or memory_gib)."""

    @property
    def slices_per_replica(self) -> int:
        return 8 if self.profile == WHOLE_DEVICE else PROFILES[self.profile].memory_slices

    @property
    def compute_per_replica(self) -> int:
        return 7 if self.profile == WHOLE_DEVICE else PROFILES[self.profile].compute_slices

    def rank_key(self) -> tuple[bool, int, int, int, int]:
        return (
            not self.meets_target,
            self.replicas * self.slices_per_replica,
            self.replicas * self.compute_per_replica,
            self.replicas,
            -len(self.gpu_types),
        )


@dataclass(frozen=True)
class PoolSizing:
    pool: str
    target_rps: float
    options: tuple[SizingOption, ...]
    problem: str | None = None
    """Why there is no option at all (the pool cannot be placed anywhere)."""

    @property
    def best(self) -> SizingOption | None:
        return self.options[0] if self.options else None


def replica_rps(pool: PoolSpec, kind: GpuType, profile: int) -> float | None:
    """Capacity of one replica of ``pool`` on ``profile`` of ``kind``; None if not given.

    An entry naming the GPU type beats one that does not.
    """
    found: float | None = None
    found_specific = False
    for entry in pool.capacity:
        if entry.gpu_type is not None and entry.gpu_type != kind.name:
            continue
        if profile == WHOLE_DEVICE:
            matches = entry.profile is None
        else:
            matches = entry.profile is not None and kind.resolve_profile(entry.profile) == profile
        if not matches:
            continue
        specific = entry.gpu_type is not None
        if found is None or (specific and not found_specific):
            found, found_specific = entry.replica_rps(pool.slo_ms), specific
    return found


@dataclass(frozen=True)
class _Fit:
    kind: str
    profile: int
    replicas: int
    rps: float
    meets: bool
    memory_gib: float


def capacity_table(pool: PoolSpec, kinds: Iterable[GpuType]) -> dict[tuple[str, int], float]:
    """(GPU type, profile) -> replica capacity for every pair the pool's entries cover;
    the same answers as :func:`replica_rps`, in one pass over the entries."""
    table: dict[tuple[str, int], float] = {}
    specific: set[tuple[str, int]] = set()
    kinds = list(kinds)
    for entry in pool.capacity:
        for kind in kinds:
            if entry.gpu_type is not None and entry.gpu_type != kind.name:
                continue
            if entry.profile is None:
                pid = None if kind.mig_capable else WHOLE_DEVICE
            else:
                pid = kind.resolve_profile(entry.profile)
            if pid is None:
                continue
            key = (kind.name, pid)
            if key not in table or (entry.gpu_type is not None and key not in specific):
                table[key] = entry.replica_rps(pool.slo_ms)
                if entry.gpu_type is not None:
                    specific.add(key)
    return table


def _fits(pool: PoolSpec, kinds: Iterable[GpuType], target: float) -> list[_Fit]:
    kinds = list(kinds)
    memory = {k.name: k for k in kinds}
    fits = []
    for (name, pid), rps in capacity_table(pool, kinds).items():
        if rps <= 0:
            continue
        needed = max(pool.min_replicas, math.ceil(target / rps - 1e-9))
        meets = needed <= pool.max_replicas
        replicas = _replicas_in(pool, memory[name].profile_memory_gib(pid),
                                min(needed, pool.max_replicas))
        if replicas is None:
            continue
        fits.append(_Fit(name, pid, replicas, rps, meets,
                         pool.memory_need_gib(max(replicas, 1))))
    return fits


def _replicas_in(pool: PoolSpec, memory_gib: float, needed: int) -> int | None:
    """The fewest replicas, at least ``needed``, whose need fits ``memory_gib`` (None:
    none up to max_replicas). With memory_gib the need does not depend on the count."""
    if pool.working_set is None:
        return needed if pool.memory_need_gib(needed) <= memory_gib else None
    if pool.memory_floor_gib() > memory_gib:
        return None
    for replicas in range(needed, max(needed, pool.max_replicas) + 1):
        if pool.memory_need_gib(max(replicas, 1)) <= memory_gib:
            return replicas
    return None


def _options(fits: list[_Fit]) -> list[SizingOption]:
    by_profile: dict[int, list[_Fit]] = {}
    for fit in fits:
        by_profile.setdefault(fit.profile, []).append(fit)
    unique: dict[tuple[int, int, bool], SizingOption] = {}
    for profile, group in by_profile.items():
        for fit in group:
            if (profile, fit.replicas, fit.meets) in unique:
                continue
            # This profile and replica count also hold on every other type that needs
            # no more replicas of it.
            same = [f for f in group if f.replicas <= fit.replicas and f.meets >= fit.meets]
            unique[(profile, fit.replicas, fit.meets)] = SizingOption(
                profile=profile,
                replicas=fit.replicas,
                gpu_types=tuple(sorted({f.kind for f in same})),
                replica_rps=min(f.rps for f in same),
                meets_target=fit.meets,
                memory_gib=fit.memory_gib,
            )
    return sorted(unique.values(), key=lambda o: (o.rank_key(), o.profile, o.gpu_types))


def _no_option_reason(pool: PoolSpec, kinds: list[GpuType]) -> str:
    if not kinds:
        wanted = ", ".join(pool.constraints.gpu_types) or "any"
        return f"no GPU of an allowed type in the fleet (allowed: {wanted})"
    biggest = max(
        (k.profile_memory_gib(p), k.name)
        for k in kinds
        for p in (k.profiles if k.mig_capable else [WHOLE_DEVICE])
    )
    least = max(pool.memory_need_gib(pool.max_replicas), pool.memory_floor_gib())
    if biggest[0] < least:
        said = (f"needs {least:g} GiB" if pool.working_set is None else
                f"its working set needs {least:.1f} GiB a replica even at max_replicas "
                f"{pool.max_replicas}")
        return f"{said}; the largest allowed device has {biggest[0]:g} GiB ({biggest[1]})"
    return "no capacity entry covers a profile that is big enough on the fleet's GPU types"


def _prefer_current(
    options: list[SizingOption], current: int, any_cost: bool
) -> list[SizingOption]:
    """Move the best option on the pool's current profile to the front when it meets the
    target and costs no more slices (or at any cost, when stability comes first): a small
    demand change then resizes the pool in place instead of swapping every instance."""
    same = [o for o in options if o.profile == current and o.meets_target]
    if not same or same[0] is options[0]:
        return options
    slices = same[0].replicas * same[0].slices_per_replica
    if any_cost or slices <= options[0].replicas * options[0].slices_per_replica:
        return [same[0], *(o for o in options if o is not same[0])]
    return options


def size_pool(
    pool: PoolSpec,
    fleet_types: Iterable[str],
    headroom: float = 1.0,
    current_profile: int | None = None,
    stick_at_any_cost: bool = False,
) -> PoolSizing:
    """Rank the ways ``pool`` can be served on the GPU types present in the fleet.

    ``current_profile``: the profile the pool runs on now, preferred on equal cost (or at
    any cost that meets the target, with ``stick_at_any_cost``).
    """
    target = pool.target_rps * headroom
    allowed = set(pool.constraints.gpu_types) or set(GPU_TYPES)
    kinds = [GPU_TYPES[name] for name in sorted(set(fleet_types) & allowed)]
    options = _options(_fits(pool, kinds, target))
    if not options:
        return PoolSizing(pool.name, target, (), _no_option_reason(pool, kinds))
    if current_profile is not None:
        options = _prefer_current(options, current_profile, stick_at_any_cost)
    return PoolSizing(pool.name, target, tuple(options))
