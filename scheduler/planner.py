"""The placement policy: a pure function from a planning request to a PlacementPlan.

Steps: size every pool; build the snapshot; run the heuristic; when the problem is small
enough (or CP-SAT is asked for), improve on it with CP-SAT under the time limit; give
pools that did not fit whole the room that is left (degraded, at least min_replicas);
assemble the plan with stated reasons; and let the independent validator check it.
A plan the validator rejects is never returned.

The clock, the wall clock and the random generator are parameters, so the same request
with the same generator gives the same plan.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from scheduler.assemble import PoolPlacement, assemble_plan
from scheduler.errors import PlanRejected
from scheduler.exact import solve_exact, variable_count
from scheduler.heuristic import solve_heuristic
from scheduler.leftover import FreeSpace
from scheduler.objective import Assignment, score
from scheduler.plan import PlacementPlan
from scheduler.request import PlannerOptions, PlanningRequest
from scheduler.snapshot import Snapshot, build_snapshot
from scheduler.validator import validate_plan

Clock = Callable[[], float]
WallClock = Callable[[], datetime]

HEURISTIC_BUDGET_S = 0.5
"""Time the heuristic may spend on extra passes (the first pass always runs)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def plan_id(request: PlanningRequest) -> str:
    """Content address of a request: the same request always gets the same plan id."""
    digest = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
    return f"plan-{digest[:16]}"


def _use_exact(snapshot: Snapshot, options: PlannerOptions) -> bool:
    if not snapshot.demands or options.solver == "heuristic":
        return False
    return options.solver == "exact" or variable_count(snapshot) <= options.exact_max_variables


def solve(
    snapshot: Snapshot, options: PlannerOptions, clock: Clock, rng: random.Random
) -> tuple[Assignment, str, str]:
    """Best assignment, the solver that found it and its status."""
    started = clock()
    heuristic = solve_heuristic(
        snapshot,
        options.objective,
        clock,
        rng,
        time_budget_s=min(HEURISTIC_BUDGET_S, options.time_limit_s / 4),
        restarts=options.heuristic_restarts,
    )
    if not _use_exact(snapshot, options):
        return heuristic.assignment, "heuristic", "heuristic"
    remaining = max(0.5, options.time_limit_s - (clock() - started))
    exact = solve_exact(
        snapshot,
        options.objective,
        remaining,
        options.workers,
        seed=rng.randrange(2**31),
        hint=heuristic.assignment,
    )
    if exact is None:
        return heuristic.assignment, "heuristic", "heuristic"
    if score(snapshot, exact.assignment).key(options.objective) > heuristic.score.key(
        options.objective
    ):
        return heuristic.assignment, "heuristic", "heuristic"
    return exact.assignment, "cp-sat", exact.status


def _degrade(
    request: PlanningRequest, snapshot: Snapshot, placements: dict[str, PoolPlacement]
) -> dict[str, PoolPlacement]:
    """Fill left-over room for pools that got nothing: for each of the pool's sizing
    options, place what fits, and keep the option that serves the most."""
    space = FreeSpace(
        snapshot,
        (
            (g, (pool, pp.option.profile, s))
            for pool, pp in placements.items()
            for g, s in pp.places
        ),
    )
    pools = {p.name: p for p in request.pools}
    extra: dict[str, PoolPlacement] = {}
    waiting = [d for d in snapshot.demands if d.pool not in placements]
    for d in sorted(waiting, key=lambda d: (-d.priority, d.pool)):
        pool = pools[d.pool]
        floor = max(1, pool.min_replicas)
        best: tuple[float, PoolPlacement] | None = None
        for option in snapshot.sizings[d.pool].options:
            eligible = snapshot.eligibility.gpus(pool, option)
            if space.total_room(option.profile, eligible) < floor:
                continue
            c = pool.constraints
            got = space.fill(
                d.pool,
                option.profile,
                eligible,
                option.replicas,
                c.max_replicas_per_gpu,
                c.max_replicas_per_node,
            )
            space.release(d.pool, option.profile, got)
            served = len(got) * option.replica_rps
            if len(got) >= floor and (best is None or served > best[0]):
                best = (served, PoolPlacement(option, tuple(got), degraded=True))
        if best is not None:
            chosen = best[1]
            c = pool.constraints
            got = space.fill(
                d.pool,
                chosen.option.profile,
                snapshot.eligibility.gpus(pool, chosen.option),
                len(chosen.places),
                c.max_replicas_per_gpu,
                c.max_replicas_per_node,
            )
            extra[d.pool] = PoolPlacement(chosen.option, tuple(sorted(got)), degraded=True)
    return extra


def plan_placement(
    request: PlanningRequest,
    *,
    clock: Clock = time.monotonic,
    wall_clock: WallClock = _utcnow,
    rng: random.Random | None = None,
) -> PlacementPlan:
    """Plan MIG layouts and pool placement for ``request`` (see the module docstring)."""
    started = clock()
    asked = request
    request = request.with_objective_resolved()
    options = request.options
    rng = rng if rng is not None else random.Random(options.seed)
    snapshot = build_snapshot(request)
    assignment, solver, status = solve(snapshot, options, clock, rng)
    placements: dict[str, PoolPlacement] = {}
    for d in snapshot.demands:
        places = assignment.get(d.pool, ())
        option = snapshot.sizings[d.pool].best
        if places and option is not None:
            placements[d.pool] = PoolPlacement(option, tuple(places), degraded=False)
    if options.degrade:
        placements.update(_degrade(request, snapshot, placements))
    plan = assemble_plan(
        request,
        snapshot,
        placements,
        plan_id=plan_id(asked),
        solver=solver,
        solver_status=status,
        solve_seconds=clock() - started,
        created_at=wall_clock(),
    )
    violations = validate_plan(request, plan)
    if violations:
        raise PlanRejected("planner produced an invalid plan: " + "; ".join(violations[:5]))
    return plan
