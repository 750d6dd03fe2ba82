"""Stated reasons: why a pool is unplaced, degraded or short of its target."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from scheduler.leftover import FreeSpace
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES, WHOLE_DEVICE
from scheduler.request import PlanningRequest
from scheduler.sizing import PoolSizing, SizingOption
from scheduler.snapshot import Demand, Snapshot, node_admits
from scheduler.working_set import all_models_gib, resident_models


def profile_label(option: SizingOption) -> str:
    if option.profile == WHOLE_DEVICE:
        return "whole " + "/".join(option.gpu_types)
    names = sorted({GPU_TYPES[t].profile_name(option.profile) for t in option.gpu_types})
    return f"{'/'.join(names)} (profile {option.profile})"


def no_gpu_reason(request: PlanningRequest, pool: PoolSpec, option: SizingOption) -> str:
    """Which constraint leaves no GPU: types, node selector, or untolerated taints."""
    with_type = [n for n in request.fleet.nodes if any(g.type in option.gpu_types for g in n.gpus)]
    selector = pool.constraints.node_selector
    selected = [n for n in with_type if all(n.labels.get(k) == v for k, v in selector.items())]
    if not selected:
        return (
            f"no node with {'/'.join(option.gpu_types)} GPUs matches node_selector {dict(selector)}"
        )
    if not any(node_admits(n, pool) for n in selected):
        taints = sorted({f"{t.key}={t.value}:{t.effect}" for n in selected for t in n.taints})
        return f"every matching node has a taint the pool does not tolerate: {', '.join(taints)}"
    return "no eligible GPU"


def unplaced_reason(
    request: PlanningRequest,
    snapshot: Snapshot,
    pool: PoolSpec,
    sizing: PoolSizing,
    space: FreeSpace,
    neighbours: Callable[[Demand], Sequence[tuple[int, str]]],
) -> str:
    """Reason for a pool with no instances. ``neighbours(d)``: (-priority, name) of the
    pools planned on the GPUs that ``d`` may use, sorted."""
    if sizing.problem is not None or sizing.best is None:
        return sizing.problem or "cannot be sized"
    option = sizing.best
    demand = snapshot.demand_by_pool.get(pool.name)
    if demand is None or not demand.eligible:
        return no_gpu_reason(request, pool, option)
    room = space.total_room(option.profile, demand.eligible)
    near = neighbours(demand)  # (-priority, name), sorted: highest priority first
    cut = bisect.bisect_left(near, (-pool.priority, ""))
    above = [name for _, name in near[: min(cut, 5)]]
    equal = [name for p, name in near[cut : cut + 6] if p == -pool.priority and name != pool.name]
    text = (
        f"insufficient capacity: needs {option.replicas} x {profile_label(option)}, "
        f"room left for {room} on {len(demand.eligible)} eligible GPUs"
    )
    if snapshot.current_by_pool.get(pool.name) and above:
        text = f"preempted by higher-priority pools {', '.join(above[:5])}; " + text
    elif above:
        text += f"; higher-priority pools placed first: {', '.join(above[:5])}"
    elif equal:
        text += f"; equal-priority pools use the space: {', '.join(equal[:5])}"
    return text


def shortfall_reason(
    pool: PoolSpec, option: SizingOption, placed: int, served: float, target: float
) -> str:
    return (
        f"capacity short: {placed} x {profile_label(option)} placed, serving "
        f"{served:.0f} of {target:.0f} req/s (min_replicas {pool.min_replicas})"
    )


def under_target_reason(pool: PoolSpec, option: SizingOption, target: float) -> str:
    return (
        f"target {target:.0f} req/s exceeds max_replicas {pool.max_replicas} x "
        f"{option.replica_rps:.0f} req/s on {profile_label(option)}"
    )


def working_set_reason(pool: PoolSpec, option: SizingOption) -> str:
    """How a pool with a working set was sized: what a replica holds against the sum."""
    assert pool.working_set is not None
    models = pool.working_set.models
    held = resident_models(pool.working_set, option.replicas)
    return (f"sized from its working set: {option.memory_gib:.1f} GiB a replica "
            f"({held} of {len(models)} models resident at the measured demand over "
            f"{option.replicas} replica{'s' if option.replicas != 1 else ''}); every "
            f"model resident would need "
            f"{all_models_gib(pool.working_set):.1f} GiB")
