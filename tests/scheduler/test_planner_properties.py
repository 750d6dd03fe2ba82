"""Property-based tests: random fleets (with current layouts) and random pools thrown at
the planners and the validator. Bounded examples keep the suite fast."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.exact import solve_exact
from scheduler.heuristic import solve_heuristic
from scheduler.layouts import layout_table
from scheduler.objective import score
from scheduler.plan import PlannedInstance
from scheduler.planner import plan_placement
from scheduler.profiles import PROFILES
from scheduler.request import parse_request
from scheduler.snapshot import build_snapshot
from scheduler.validator import validate_plan

MIG_TYPES = ["A100-40GB", "A100-80GB", "H100-80GB"]
POOL_NAMES = [f"p{i}" for i in range(8)]
# a node's current layouts are ones its driver can make: no 4g beside 3g before R510
DRIVERS = {"550.54.15": True, "470.82.01": False}  # version: allows 4g with 3g
LAYOUTS = {allows: layout_table(allows).layouts for allows in (True, False)}
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def gpus(draw: st.DrawFn, index: int, allows_4g_with_3g: bool) -> dict[str, Any]:
    kind = draw(st.sampled_from([*MIG_TYPES, "T4"]))
    if kind == "T4":
        owner = draw(st.sampled_from([None, *POOL_NAMES[:3]]))
        return {"index": index, "type": kind, "pool": owner}
    layouts = LAYOUTS[allows_4g_with_3g]
    layout = draw(st.sampled_from(layouts)) if draw(st.booleans()) else None
    if layout is None:
        return {"index": index, "type": kind}
    instances = [
        {"profile": pid, "start": start, "pool": draw(st.sampled_from([None, *POOL_NAMES]))}
        for pid, start in layout.placements
    ]
    return {"index": index, "type": kind, "mig": {"instances": instances}}


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, Any]:
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        count = draw(st.integers(1, 3))
        driver = draw(st.sampled_from(sorted(DRIVERS)))
        node: dict[str, Any] = {
            "name": f"node-{n}",
            "labels": {"zone": draw(st.sampled_from(["a", "b"]))},
            "gpus": [draw(gpus(i, DRIVERS[driver])) for i in range(count)],
            "driver_version": driver,
        }
        if draw(st.integers(0, 4)) == 0:
            node["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        nodes.append(node)
    return {"nodes": nodes}


@st.composite
def pools(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for name in POOL_NAMES[: draw(st.integers(1, len(POOL_NAMES)))]:
        profiles = draw(st.lists(st.sampled_from([0, 5, 9, 14, 15, 19, 20]), min_size=1,
                                 max_size=3, unique=True))  # fmt: skip
        capacity: list[dict[str, Any]] = [
            {"profile": p, "rps": draw(st.integers(20, 400))} for p in profiles
        ]
        if draw(st.booleans()):
            capacity.append({"gpu_type": "T4", "rps": draw(st.integers(20, 400))})
        low = draw(st.integers(0, 2))
        constraints: dict[str, Any] = {}
        if draw(st.integers(0, 3)) == 0:
            constraints["node_selector"] = {"zone": "a"}
        if draw(st.integers(0, 3)) == 0:
            constraints["gpu_types"] = draw(st.lists(st.sampled_from(MIG_TYPES), min_size=1,
                                                     max_size=2, unique=True))  # fmt: skip
        if draw(st.booleans()):
            constraints["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
        if draw(st.integers(0, 4)) == 0:
            constraints["max_replicas_per_gpu"] = 1
        out.append(
            {
                "name": name,
                "model": name,
                "memory_gib": draw(st.sampled_from([1.0, 4.0, 9.0, 15.0, 30.0, 60.0])),
                "target_rps": draw(st.integers(0, 1500)),
                "min_replicas": low,
                "max_replicas": draw(st.integers(max(1, low), 6)),
                "priority": draw(st.sampled_from([0, 0, 100, 1000])),
                "constraints": constraints,
                "capacity": capacity,
            }
        )
    return out


def requests(**options: Any) -> st.SearchStrategy[Any]:
    return st.builds(
        lambda f, p: parse_request({"fleet": f, "pools": p, "options": options}), fleets(), pools()
    )


@PROPERTY
@given(requests(solver="heuristic"), st.sampled_from(["efficiency", "stability"]))
def test_heuristic_plans_pass_the_validator_when_inputs_are_random(
    req: Any, objective: str
) -> None:
    req = req.model_copy(
        update={"options": req.options.model_copy(update={"objective": objective})}
    )
    plan = plan_placement(req, rng=random.Random(1))  # raises PlanRejected on violations
    assert validate_plan(req, plan) == []
    for outcome in plan.pools:
        if outcome.status == "unplaced":
            assert outcome.replicas_placed == 0 and outcome.reasons
        elif outcome.status in ("placed", "degraded"):
            assert outcome.replicas_placed >= 1


@settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(requests(solver="exact", time_limit_s=5.0, workers=1))
def test_cp_sat_plans_pass_the_validator_when_inputs_are_random(req: Any) -> None:
    plan = plan_placement(req, rng=random.Random(2))
    assert validate_plan(req, plan) == []


@settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(requests())
def test_cp_sat_is_never_worse_than_heuristic_when_it_proves_optimality(req: Any) -> None:
    snapshot = build_snapshot(req)
    heuristic = solve_heuristic(snapshot, "efficiency", lambda: 0.0, random.Random(0), 0.0, 1)
    exact = solve_exact(snapshot, "efficiency", 5.0, 1, 0)
    assert exact is not None
    if exact.status == "optimal":
        assert score(snapshot, exact.assignment).key("efficiency") <= heuristic.score.key(
            "efficiency"
        )


@PROPERTY
@given(requests(solver="heuristic"), st.data())
def test_validator_rejects_plan_when_an_instance_is_moved_off_its_start_slots(
    req: Any, data: st.DataObject
) -> None:
    plan = plan_placement(req, rng=random.Random(3))
    mig = [g for g in plan.gpus if g.instances and g.instances[0].profile_id >= 0]
    if not mig:
        return
    victim = data.draw(st.sampled_from(mig))
    inst = victim.instances[0]
    valid = PROFILES[inst.profile_id].start_slots
    wrong = data.draw(st.sampled_from([s for s in range(8) if s not in valid]))
    moved: PlannedInstance = inst.model_copy(update={"start": wrong})
    gpus = tuple(
        g.model_copy(update={"instances": (moved, *g.instances[1:])}) if g is victim else g
        for g in plan.gpus
    )
    assert validate_plan(req, plan.model_copy(update={"gpus": gpus})) != []
