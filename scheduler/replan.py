"""Helpers for planning again: the fleet as a plan leaves it, and pools with new targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.inventory import Fleet, GpuSpec, MigInstanceSpec, MigState
from scheduler.plan import PlacementPlan
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES


def fleet_after(fleet: Fleet, plan: PlacementPlan) -> Fleet:
    """``fleet`` with every GPU's current layout replaced by the planned one."""
    planned = {(g.node, g.index): g for g in plan.gpus}
    nodes = []
    for node in fleet.nodes:
        gpus = []
        for gpu in node.gpus:
            target = planned[(node.name, gpu.index)]
            if GPU_TYPES[gpu.type].mig_capable:
                instances = tuple(
                    MigInstanceSpec(profile=i.profile_id, start=i.start, pool=i.pool)
                    for i in target.instances
                )
                state = MigState(enabled=target.mig_enabled, instances=instances)
                gpus.append(GpuSpec(index=gpu.index, type=gpu.type, mig=state))
            else:
                pool = target.instances[0].pool if target.instances else None
                gpus.append(GpuSpec(index=gpu.index, type=gpu.type, pool=pool))
        nodes.append(node.model_copy(update={"gpus": tuple(gpus)}))
    return Fleet(nodes=tuple(nodes))


def with_targets(pools: Sequence[PoolSpec], targets: Mapping[str, float]) -> tuple[PoolSpec, ...]:
    """Pools with ``target_rps`` replaced where ``targets`` names them."""
    return tuple(
        p.model_copy(update={"target_rps": round(targets[p.name], 3)}) if p.name in targets else p
        for p in pools
    )
