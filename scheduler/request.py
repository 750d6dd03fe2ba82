"""A planning request (fleet + pools + options), how to load it, and the checks that need
more than one field at a time. Every problem names the field at fault."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from scheduler.errors import InputProblem, InvalidPlanningInput
from scheduler.inventory import Fleet, Frozen, GpuSpec, NodeSpec
from scheduler.pools import PoolSpec
from scheduler.profiles import GPU_TYPES, PROFILES, gpu_type
from scheduler.working_set import with_report

Loc = tuple[str | int, ...]


class PlannerOptions(Frozen):
    solver: Literal["auto", "exact", "heuristic"] = "auto"
    objective: Literal["auto", "efficiency", "stability"] = Field(
        default="auto",
        description="efficiency: GPUs, fragmentation, then disruption. "
        "stability: disruption first (re-plans that move as little as possible). "
        "auto: stability when the fleet already runs pools (a re-plan), else efficiency.",
    )
    time_limit_s: float = Field(default=10.0, gt=0, le=600)
    exact_max_variables: int = Field(
        default=20_000, ge=0, description="auto uses CP-SAT up to this many placement variables."
    )
    workers: int = Field(default=2, ge=1, le=32)
    headroom: float = Field(default=1.0, ge=0.5, le=10, description="Multiplier on target_rps.")
    seed: int = 0
    heuristic_restarts: int = Field(default=4, ge=1, le=64)
    degrade: bool = Field(
        default=True, description="Give pools that do not fit whole at least min_replicas."
    )


class PlanningRequest(Frozen):
    fleet: Fleet
    pools: tuple[PoolSpec, ...] = ()
    options: PlannerOptions = PlannerOptions()

    @property
    def runs_pools(self) -> bool:
        """Whether any GPU of the fleet serves a pool now (planning again, not afresh)."""
        return any(
            g.pool is not None or (g.mig is not None and any(i.pool for i in g.mig.instances))
            for n in self.fleet.nodes
            for g in n.gpus
        )

    def with_objective_resolved(self) -> PlanningRequest:
        """``auto`` made concrete: a running fleet is re-planned for stability (each
        rebuilt GPU stops every pod on it), an idle one packed for efficiency."""
        if self.options.objective != "auto":
            return self
        objective = "stability" if self.runs_pools else "efficiency"
        return self.model_copy(
            update={"options": self.options.model_copy(update={"objective": objective})}
        )


def _gpu_problems(gpu: GpuSpec, node: NodeSpec, loc: Loc) -> Iterator[InputProblem]:
    kind = GPU_TYPES[gpu.type]
    if gpu.mig is not None and not kind.mig_capable and (gpu.mig.enabled or gpu.mig.instances):
        yield InputProblem((*loc, "mig"), f"{gpu.type} is not MIG-capable")
        return
    if gpu.pool is not None and kind.mig_capable:
        yield InputProblem((*loc, "pool"), "MIG-capable GPUs list pools per instance in mig")
    if gpu.mig is None:
        return
    if gpu.mig.instances and not gpu.mig.enabled:
        yield InputProblem((*loc, "mig", "instances"), "instances listed while MIG is disabled")
    used = 0
    counts: dict[int, int] = {}
    for k, inst in enumerate(gpu.mig.instances):
        where = (*loc, "mig", "instances", k)
        pid = kind.resolve_profile(inst.profile)
        if pid is None:
            known = ", ".join(f"{p} ({kind.profile_name(p)})" for p in kind.profiles)
            yield InputProblem(
                (*where, "profile"), f"profile {inst.profile!r} unknown on {gpu.type}: {known}"
            )
            continue
        profile = PROFILES[pid]
        if inst.start not in profile.start_slots:
            yield InputProblem(
                (*where, "start"),
                f"{kind.profile_name(pid)} cannot start at slot {inst.start}; "
                f"valid: {list(profile.start_slots)}",
            )
            continue
        mask = profile.slot_mask(inst.start)
        if mask & used:
            yield InputProblem(where, "overlaps another instance's memory slots")
        used |= mask
        counts[pid] = counts.get(pid, 0) + 1
        if counts[pid] > profile.max_per_gpu:
            yield InputProblem(
                where, f"more than {profile.max_per_gpu} x {kind.profile_name(pid)} on one GPU"
            )
    if counts.get(5) and counts.get(9) and not node.allows_4g_with_3g:  # mig.md
        yield InputProblem(
            (*loc, "mig", "instances"),
            f"{kind.profile_name(5)} beside {kind.profile_name(9)} needs driver R510+ "
            f"(node has {node.driver_version}): no such layout can exist on it",
        )


def _fleet_problems(fleet: Fleet) -> Iterator[InputProblem]:
    seen_nodes: set[str] = set()
    for i, node in enumerate(fleet.nodes):
        loc: Loc = ("fleet", "nodes", i)
        if node.name in seen_nodes:
            yield InputProblem((*loc, "name"), f"duplicate node {node.name!r}")
        seen_nodes.add(node.name)
        seen_gpus: set[int] = set()
        for j, gpu in enumerate(node.gpus):
            if gpu.index in seen_gpus:
                yield InputProblem((*loc, "gpus", j, "index"), f"duplicate GPU index {gpu.index}")
            seen_gpus.add(gpu.index)
            yield from _gpu_problems(gpu, node, (*loc, "gpus", j))


def _pool_problems(pools: tuple[PoolSpec, ...]) -> Iterator[InputProblem]:
    seen: set[str] = set()
    for i, pool in enumerate(pools):
        loc: Loc = ("pools", i)
        if pool.name in seen:
            yield InputProblem((*loc, "name"), f"duplicate pool {pool.name!r}")
        seen.add(pool.name)
        for k, entry in enumerate(pool.capacity):
            where = (*loc, "capacity", k)
            if entry.profile is None:
                if entry.gpu_type is not None and GPU_TYPES[entry.gpu_type].mig_capable:
                    yield InputProblem(
                        (*where, "profile"),
                        f"{entry.gpu_type} is MIG-capable: name a profile (0 = whole GPU)",
                    )
                continue
            types = [gpu_type(entry.gpu_type)] if entry.gpu_type else list(GPU_TYPES.values())
            if not any(t.resolve_profile(entry.profile) is not None for t in types):
                scope = entry.gpu_type or "any GPU type"
                yield InputProblem(
                    (*where, "profile"), f"profile {entry.profile!r} unknown on {scope}"
                )


def check_request(request: PlanningRequest) -> list[InputProblem]:
    """Cross-field problems of a structurally valid request (empty when it is sound)."""
    return [*_fleet_problems(request.fleet), *_pool_problems(request.pools)]


def _problems_from(error: ValidationError, prefix: Loc = ()) -> list[InputProblem]:
    return [InputProblem((*prefix, *e["loc"]), e["msg"]) for e in error.errors()]


def parse_request(data: Mapping[str, Any]) -> PlanningRequest:
    """Validate a request given as plain data; InvalidPlanningInput lists every problem."""
    try:
        request = PlanningRequest.model_validate(data)
    except ValidationError as e:
        raise InvalidPlanningInput(_problems_from(e)) from e
    problems = check_request(request)
    if problems:
        raise InvalidPlanningInput(problems)
    return request


def read_document(path: Path) -> Any:
    """YAML or JSON (JSON is YAML) from a file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.safe_load(text)


def load_request(
    fleet_path: Path,
    pools_path: Path,
    options: PlannerOptions | None = None,
    residency: Mapping[str, Any] | None = None,
) -> PlanningRequest:
    """Read ``fleet.yaml`` (``nodes: [...]``) and ``pools.yaml`` (``pools: [...]``).

    ``residency``: the gateway's ``GET /v1/residency`` answer; each pool with a
    ``working_set`` takes its models (footprints, demand) from it."""
    fleet = read_document(fleet_path)
    pools = read_document(pools_path)
    if isinstance(fleet, dict) and "fleet" in fleet:
        fleet = fleet["fleet"]
    if isinstance(pools, dict):
        pools = pools.get("pools", [])
    if residency is not None and isinstance(pools, list):
        pools = with_report(pools, residency)
    data: dict[str, Any] = {"fleet": fleet, "pools": pools}
    if options is not None:
        data["options"] = options.model_dump()
    return parse_request(data)
