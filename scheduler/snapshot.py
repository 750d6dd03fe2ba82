"""The planners' input: an immutable, solver-friendly view of a planning request.

GPUs are numbered 0..n-1; each sized pool becomes a :class:`Demand` for ``replicas``
instances of one profile on a set of eligible GPUs. Demands with the same eligibility
share one ``signature`` so that the heuristic can bucket GPUs by class instead of
checking constraints per GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from scheduler.inventory import NodeSpec
from scheduler.layouts import CountVector, Placement, counts_of
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES, WHOLE_DEVICE, GpuType
from scheduler.request import PlanningRequest
from scheduler.sizing import PoolSizing, SizingOption, size_pool


@dataclass(frozen=True)
class CurrentInstance:
    profile: int
    start: int
    pool: str | None


@dataclass(frozen=True)
class GpuView:
    position: int
    node: str
    index: int
    kind: GpuType
    allows_4g_with_3g: bool
    mig_enabled: bool
    current: tuple[CurrentInstance, ...]

    @property
    def key(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def family(self) -> str:
        """Which layout table governs the GPU: 'mig', 'mig-r470' (no 4g+3g) or 'whole'."""
        if not self.kind.mig_capable:
            return "whole"
        return "mig" if self.allows_4g_with_3g else "mig-r470"

    @property
    def current_placements(self) -> frozenset[Placement]:
        return frozenset((c.profile, c.start) for c in self.current)

    @property
    def current_counts(self) -> CountVector:
        return counts_of((c.profile, c.start) for c in self.current if c.profile != WHOLE_DEVICE)


@dataclass(frozen=True)
class Demand:
    pool: str
    priority: int
    profile: int
    replicas: int
    min_replicas: int
    eligible: tuple[int, ...]
    signature: int
    max_per_gpu: int | None = None
    max_per_node: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the solvers read. ``eligibility`` caches GPU sets per constraint
    signature (a memo, not state: the same inputs always give the same sets)."""

    gpus: tuple[GpuView, ...]
    demands: tuple[Demand, ...]
    sizings: Mapping[str, PoolSizing]
    current_by_pool: Mapping[str, int]
    eligibility: Eligibility

    @cached_property
    def demand_by_pool(self) -> Mapping[str, Demand]:
        return MappingProxyType({d.pool: d for d in self.demands})

    @property
    def priorities(self) -> tuple[int, ...]:
        """Distinct demand priorities, highest first (the objective's leading tiers)."""
        return tuple(sorted({d.priority for d in self.demands}, reverse=True))


def node_admits(node: NodeSpec, pool: PoolSpec) -> bool:
    if any(node.labels.get(k) != v for k, v in pool.constraints.node_selector.items()):
        return False
    return all(
        any(t.tolerates(taint) for t in pool.constraints.tolerations)
        for taint in node.taints
        if taint.hard
    )


def _gpu_views(request: PlanningRequest) -> tuple[GpuView, ...]:
    views: list[GpuView] = []
    for node in request.fleet.nodes:
        for gpu in sorted(node.gpus, key=lambda g: g.index):
            kind = GPU_TYPES[gpu.type]
            current: tuple[CurrentInstance, ...] = ()
            enabled = False
            if kind.mig_capable:
                enabled = gpu.mig is not None and gpu.mig.enabled
                instances = gpu.mig.instances if gpu.mig is not None and enabled else ()
                current = tuple(
                    CurrentInstance(kind.resolve_profile(i.profile) or 0, i.start, i.pool)
                    for i in instances
                )
            elif gpu.pool is not None:
                current = (CurrentInstance(WHOLE_DEVICE, 0, gpu.pool),)
            views.append(
                GpuView(
                    len(views), node.name, gpu.index, kind, node.allows_4g_with_3g, enabled, current
                )
            )
    return tuple(views)


class Eligibility:
    """Which GPUs a pool may use with a sizing option, computed once per distinct
    constraint signature (GPU types, whole or MIG, node selector, tolerations)."""

    def __init__(self, request: PlanningRequest, gpus: Sequence[GpuView]) -> None:
        self._nodes = request.fleet.nodes
        self._gpus = gpus
        self._signatures: dict[tuple[object, ...], int] = {}
        self._eligible: list[tuple[int, ...]] = []

    def signature(self, pool: PoolSpec, option: SizingOption) -> int:
        key = (
            option.gpu_types,
            option.profile == WHOLE_DEVICE,
            tuple(sorted(pool.constraints.node_selector.items())),
            pool.constraints.tolerations,
        )
        found = self._signatures.get(key)
        if found is None:
            found = self._signatures[key] = len(self._eligible)
            self._eligible.append(self._compute(pool, option))
        return found

    def gpus(self, pool: PoolSpec, option: SizingOption) -> tuple[int, ...]:
        return self._eligible[self.signature(pool, option)]

    def _compute(self, pool: PoolSpec, option: SizingOption) -> tuple[int, ...]:
        admitted = {node.name for node in self._nodes if node_admits(node, pool)}
        types = set(option.gpu_types)
        whole = option.profile == WHOLE_DEVICE
        return tuple(
            g.position
            for g in self._gpus
            if g.node in admitted
            and g.kind.name in types
            and whole != g.kind.mig_capable
            and (whole or option.profile in g.kind.profiles)
        )


def build_snapshot(request: PlanningRequest) -> Snapshot:
    gpus = _gpu_views(request)
    fleet_types = {g.kind.name for g in gpus}
    headroom = request.options.headroom
    running: dict[str, Counter[int]] = {}
    for g in gpus:
        for inst in g.current:
            if inst.pool is not None:
                running.setdefault(inst.pool, Counter())[inst.profile] += 1
    # With stability first, a pool keeps its current profile whenever that still meets
    # the target, so a demand change resizes it in place. (Efficiency first re-sizes
    # freely: measured, sticking there costs GPUs.)
    stick = request.options.objective == "stability"

    def current_profile(pool: str) -> int | None:
        if not stick or pool not in running:
            return None
        return running[pool].most_common(1)[0][0]

    sizings = {
        p.name: size_pool(p, fleet_types, headroom, current_profile(p.name), stick)
        for p in request.pools
    }
    eligibility = Eligibility(request, gpus)
    demands = []
    for pool in request.pools:
        option = sizings[pool.name].best
        if option is None or option.replicas == 0:
            continue
        signature = eligibility.signature(pool, option)
        demands.append(
            Demand(
                pool=pool.name,
                priority=pool.priority,
                profile=option.profile,
                replicas=option.replicas,
                min_replicas=max(1, pool.min_replicas),
                eligible=eligibility.gpus(pool, option),
                signature=signature,
                max_per_gpu=pool.constraints.max_replicas_per_gpu,
                max_per_node=pool.constraints.max_replicas_per_node,
            )
        )
    current = {pool: sum(counts.values()) for pool, counts in running.items()}
    return Snapshot(
        gpus=gpus,
        demands=tuple(demands),
        sizings=MappingProxyType(sizings),
        current_by_pool=MappingProxyType(current),
        eligibility=eligibility,
    )
