"""The planner's output: a PlacementPlan (per GPU: instances with profile, start slot and
pool; per pool: outcome and reasons), and the record that pairs it with its request."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from scheduler.inventory import Frozen
from scheduler.request import PlanningRequest

PoolStatus = Literal["placed", "degraded", "unplaced", "scaled-to-zero"]


class PlannedInstance(Frozen):
    profile_id: int = Field(description="MIG profile id; -1 for a whole non-MIG GPU.")
    profile: str = Field(description="Name label on this GPU type, e.g. 3g.40gb.")
    start: int
    memory_slices: int
    pool: str | None = Field(description="None: an existing instance left idle.")
    kept: bool = Field(
        default=False, description="The pool already runs this instance and keeps it."
    )


class GpuPlan(Frozen):
    node: str
    index: int
    gpu_type: str
    mig_enabled: bool
    repartition: bool = Field(
        description="mig-parted rebuilds this GPU: every current instance is destroyed."
    )
    instances: tuple[PlannedInstance, ...] = ()
    fragmentation: int = 0
    largest_free: str | None = Field(
        default=None, description="Largest profile still placeable beside the pools."
    )

    @property
    def key(self) -> str:
        return f"{self.node}/{self.index}"

    @property
    def used(self) -> bool:
        return any(i.pool is not None for i in self.instances)


class PoolOutcome(Frozen):
    name: str
    model: str
    status: PoolStatus
    priority: int
    priority_class: str
    profile_id: int | None = None
    replicas_wanted: int = 0
    replicas_placed: int = 0
    replica_rps: float = 0.0
    target_rps: float = 0.0
    served_rps: float = 0.0
    gpu_types: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class PlanMetrics(Frozen):
    gpus_total: int
    gpus_used: int
    memory_slices_used: int
    fragmentation: int
    gpus_repartitioned: int
    nodes_reconfigured: int
    instances_moved: int
    instances_kept: int
    instances_removed: int = Field(
        default=0, description="Current instances a pool no longer gets (scaled down, preempted)."
    )
    instances_disrupted: int = Field(
        default=0,
        description="Current pool instances that do not keep serving their pool in place "
        "(destroyed by a rebuild, handed to another pool, or no longer needed).",
    )
    instances_destroyed: int = Field(
        default=0, description="Current pool instances on GPUs mig-parted rebuilds."
    )
    pools_placed: int
    pools_degraded: int
    pools_unplaced: int


class PlacementPlan(Frozen):
    id: str
    created_at: datetime
    objective: str
    solver: str = Field(description="cp-sat or heuristic")
    solver_status: str = Field(description="optimal, feasible or heuristic")
    solve_seconds: float
    metrics: PlanMetrics
    gpus: tuple[GpuPlan, ...]
    pools: tuple[PoolOutcome, ...]

    def pool(self, name: str) -> PoolOutcome:
        for outcome in self.pools:
            if outcome.name == name:
                return outcome
        raise KeyError(name)

    @property
    def unplaced(self) -> tuple[PoolOutcome, ...]:
        return tuple(p for p in self.pools if p.status == "unplaced")


class PlanRecord(Frozen):
    """A plan with the request it answers: enough to render manifests or re-plan."""

    request: PlanningRequest
    plan: PlacementPlan
