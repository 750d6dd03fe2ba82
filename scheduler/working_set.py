"""A pool's working set: the memory one member needs when the gateway's residency
(docs/residency.md) decides which models each member holds, instead of every model on
every member.

A pool with ``working_set`` serves many models; each has a memory footprint and a
measured demand (requests/s, smoothed), as the gateway's ``GET /v1/residency`` reports
them. At a replica count ``n``, the members hold what the residency policy
(:func:`gateway.policy.residency.plan`, the gateway's own code) places on ``n`` members
holding nothing yet, with room for everything: models pinned (``min_replicas``, or
``pinned`` on every member), then each model with demand, ``ceil(demand_rps /
rps_per_replica)`` replicas (capped at ``n``), each on the member with the most room
left. The memory a member needs is the largest footprint sum a member holds then, plus
``headroom_gib``; models with no demand and no ``min_replicas`` take none (they load on a
miss, evicting the coldest). :mod:`scheduler.sizing` chooses the profile from that, not
from the sum of every model the pool may serve (:func:`all_models_gib`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import Field, model_validator

from gateway.policy import residency as policy
from scheduler.errors import InputProblem, InvalidPlanningInput
from scheduler.inventory import Frozen

GIB = 1024**3


class ResidentModel(Frozen):
    """One model a pool with a working set may serve: an entry of ``GET /v1/residency``'s
    ``models`` (extra fields of that entry are ignored when read from a report)."""

    name: str = Field(min_length=1)
    footprint_bytes: int = Field(ge=0, description="Memory the model takes once loaded.")
    demand_rps: float = Field(default=0.0, ge=0, description="Measured requests/s, smoothed.")
    min_replicas: int = Field(default=0, ge=0, description="Members that always hold it.")
    pinned: bool = Field(default=False, description="Held by every member (not on demand).")


class WorkingSet(Frozen):
    """Size the pool from the models the residency keeps resident at their demand."""

    rps_per_replica: float = Field(
        gt=0, description="The gateway pool's residency.rps_per_replica: demand one member "
        "carries before a model gets another member.")
    headroom_gib: float = Field(
        default=0.0, ge=0, description="Kept free on each member beyond its models' "
        "footprints (Triton itself, the CUDA context: the gateway's headroom_bytes).")
    gateway_pool: str | None = Field(
        default=None, description="The gateway pool, in a residency report, whose models "
        "these are (default: this pool's name).")
    models: tuple[ResidentModel, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> WorkingSet:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("a model is listed twice in working_set.models")
        return self


def member_bytes(working_set: WorkingSet, members: int) -> int:
    """The largest footprint sum one of ``members`` members holds (module docstring)."""
    return _member_bytes(working_set, max(1, members))


@lru_cache(maxsize=4096)
def _member_bytes(working_set: WorkingSet, members: int) -> int:
    held = placement(working_set, members)
    return max((sum(sizes.values()) for sizes in held.values()), default=0)


def placement(working_set: WorkingSet, members: int) -> dict[str, dict[str, int]]:
    """member -> model -> footprint: what each of ``members`` holds under the policy."""
    total = sum(m.footprint_bytes for m in working_set.models)
    keys = [f"member-{i}" for i in range(members)]
    view = policy.ResidencyView(
        now=0.0,
        models=tuple(
            policy.ModelView(name=m.name, footprint_bytes=m.footprint_bytes,
                             min_replicas=members if m.pinned else min(m.min_replicas, members),
                             demand_rps=m.demand_rps, last_used=None)
            for m in working_set.models),
        members=tuple(policy.MemberView(key=k, budget_bytes=total + 1, available=True,
                                        held={}) for k in keys))
    plan = policy.plan(view, policy.ResidencyKnobs(rps_per_replica=working_set.rps_per_replica))
    sizes = {m.name: m.footprint_bytes for m in working_set.models}
    held: dict[str, dict[str, int]] = {k: {} for k in keys}
    for move in plan.loads:
        held[move.member][move.model] = sizes[move.model]
    return held


def working_set_gib(working_set: WorkingSet, members: int) -> float:
    """Memory one of ``members`` members needs: its largest working set plus headroom."""
    return member_bytes(working_set, members) / GIB + working_set.headroom_gib


def floor_gib(working_set: WorkingSet) -> float:
    """What any replica must hold whatever the demand and the replica count: the largest
    model (else it fits no member: the gateway refuses it) and, with one replica, every
    model kept resident (``pinned``, ``min_replicas``); plus headroom."""
    kept = sum(m.footprint_bytes for m in working_set.models if m.pinned or m.min_replicas)
    largest = max((m.footprint_bytes for m in working_set.models), default=0)
    return max(kept, largest) / GIB + working_set.headroom_gib


def all_models_gib(working_set: WorkingSet) -> float:
    """What a member would need holding every model (no residency), for comparison."""
    return sum(m.footprint_bytes for m in working_set.models) / GIB + working_set.headroom_gib


def resident_models(working_set: WorkingSet, members: int) -> int:
    """How many distinct models the members hold at ``members`` replicas."""
    return len({name for held in placement(working_set, max(1, members)).values()
                for name in held})


def models_from_report(report: Mapping[str, Any], gateway_pool: str) -> tuple[ResidentModel, ...]:
    """The models of ``gateway_pool`` in a ``GET /v1/residency`` answer (or a file of the
    same shape). ``min_replicas`` there is resolved against the gateway's members: a
    model that is not on demand and wants every member of the report's pool is pinned
    (on every member, however many the plan gives the pool)."""
    pools = {p.get("name"): p for p in report.get("pools", []) if isinstance(p, Mapping)}
    members = len(pools.get(gateway_pool, {}).get("members", []))
    found = []
    for name, entry in sorted((report.get("models") or {}).items()):
        if entry.get("pool") != gateway_pool:
            continue
        min_replicas = int(entry.get("min_replicas") or 0)
        pinned = not entry.get("on_demand", False) and members > 0 and min_replicas >= members
        found.append(ResidentModel(
            name=name, footprint_bytes=int(entry.get("footprint_bytes") or 0),
            demand_rps=float(entry.get("demand_rps") or 0.0),
            min_replicas=0 if pinned else min_replicas, pinned=pinned))
    return tuple(found)


def with_report(pools: list[Any], report: Mapping[str, Any]) -> list[Any]:
    """``pools`` (plain data, as in pools.yaml) with each ``working_set``'s models read
    from ``report``; a working set whose gateway pool the report lacks is a problem."""
    known = {p.get("name") for p in report.get("pools", []) if isinstance(p, Mapping)}
    out, problems = [], []
    for i, pool in enumerate(pools):
        working = pool.get("working_set") if isinstance(pool, Mapping) else None
        if not isinstance(working, Mapping):
            out.append(pool)
            continue
        gateway_pool = working.get("gateway_pool") or pool.get("name")
        if gateway_pool not in known:
            problems.append(InputProblem(
                ("pools", i, "working_set", "gateway_pool"),
                f"the residency report has no pool {gateway_pool!r} (it has: "
                f"{', '.join(sorted(str(k) for k in known)) or 'none'})"))
            continue
        models = [m.model_dump() for m in models_from_report(report, str(gateway_pool))]
        out.append({**pool, "working_set": {**working, "models": models}})
    if problems:
        raise InvalidPlanningInput(problems)
    return out
