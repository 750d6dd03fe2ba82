from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from scheduler.errors import PlanRejected
from scheduler.plan import PlacementPlan, PlanRecord
from scheduler.planner import plan_id, plan_placement
from scheduler.request import PlanningRequest
from tests.scheduler.builders import gpu, node, pool, request

FIXED = datetime(2025, 1, 1, tzinfo=UTC)


def plan(req: PlanningRequest, seed: int = 0) -> PlacementPlan:
    return plan_placement(req, wall_clock=lambda: FIXED, rng=random.Random(seed))


def test_plan_placement_uses_cp_sat_when_fleet_is_small(example_record: PlanRecord) -> None:
    assert example_record.plan.solver == "cp-sat"
    assert example_record.plan.solver_status in ("optimal", "feasible")
    assert example_record.plan.metrics.pools_unplaced == 0


def test_plan_placement_uses_heuristic_when_asked() -> None:
    req = request([node("n", [gpu(0)])], [pool("a")], solver="heuristic")
    assert plan(req).solver == "heuristic"


def test_plan_placement_is_reproducible_when_seed_and_clock_are_fixed() -> None:
    nodes = [node("n", [gpu(i) for i in range(4)])]
    pools = [pool(f"p{i}", {19: 100, 14: 190}, target=100 + 70 * i) for i in range(8)]
    req = request(nodes, pools, solver="heuristic")
    a, b = plan(req, 3), plan(req, 3)
    assert a.model_dump(exclude={"solve_seconds"}) == b.model_dump(exclude={"solve_seconds"})
    assert a.created_at == FIXED


def test_plan_id_is_stable_when_request_is_identical(example_request: PlanningRequest) -> None:
    same = PlanningRequest.model_validate(example_request.model_dump())
    assert plan_id(same) == plan_id(example_request)
    changed = example_request.model_copy(update={"pools": example_request.pools[:-1]})
    assert plan_id(changed) != plan_id(example_request)


def test_plan_placement_degrades_pool_when_room_is_left_for_fewer_replicas() -> None:
    nodes = [node("n", [gpu(0)])]
    pools = [
        pool("big", {9: 100}, target=100, priority=10),
        pool("wide", {9: 100}, target=300, min_replicas=1, max_replicas=3),
    ]
    outcome = plan(request(nodes, pools)).pool("wide")
    assert outcome.status == "degraded"
    assert (outcome.replicas_wanted, outcome.replicas_placed) == (3, 1)
    assert "capacity short" in outcome.reasons[0]


def test_plan_placement_explains_unplaced_pool_when_selector_matches_nothing() -> None:
    pools = [pool("lost", constraints={"node_selector": {"zone": "mars"}})]
    outcome = plan(request([node("n", [gpu(0)])], pools)).pool("lost")
    assert outcome.status == "unplaced" and "node_selector" in outcome.reasons[0]


def test_plan_placement_explains_unplaced_pool_when_taint_not_tolerated() -> None:
    taint = {"key": "gpu", "value": "reserved", "effect": "NoSchedule"}
    outcome = plan(request([node("n", [gpu(0)], taints=[taint])], [pool("a")])).pool("a")
    assert outcome.status == "unplaced" and "gpu=reserved:NoSchedule" in outcome.reasons[0]


def test_plan_placement_reports_preemption_when_higher_priority_takes_the_gpu() -> None:
    nodes = [node("n", [gpu(0, layout=[(0, 0, "batch")])])]
    pools = [pool("batch", {0: 100}, priority=0), pool("online", {0: 100}, priority=1000)]
    result = plan(request(nodes, pools))
    assert result.pool("online").status == "placed"
    batch = result.pool("batch")
    assert batch.status == "unplaced"
    assert batch.reasons[0].startswith("preempted by higher-priority pools online")
    assert (result.metrics.instances_moved, result.metrics.instances_removed) == (0, 1)


def test_plan_placement_keeps_idle_instances_when_gpu_is_not_repartitioned() -> None:
    nodes = [node("n", [gpu(0, layout=[(9, 0, "a"), (9, 4, None)])])]
    result = plan(request(nodes, [pool("a", {9: 100})], objective="stability"))
    (g,) = result.gpus
    assert not g.repartition
    assert [(i.start, i.pool, i.kept) for i in g.instances] == [(0, "a", True), (4, None, False)]


def test_plan_placement_gives_whole_t4_when_pool_runs_on_whole_devices() -> None:
    nodes = [node("t4", [gpu(0, kind="T4"), gpu(1, kind="T4", pool="tok")])]
    tok = pool("tok", target=500)
    tok["capacity"] = [{"gpu_type": "T4", "rps": 300}]
    result = plan(request(nodes, [tok]))
    outcome = result.pool("tok")
    assert (outcome.status, outcome.profile_id, outcome.replicas_placed) == ("placed", -1, 2)
    assert result.metrics.instances_kept == 1


def test_plan_placement_flags_target_shortfall_when_max_replicas_binds() -> None:
    result = plan(request([node("n", [gpu(0)])], [pool("a", target=1000, max_replicas=2)]))
    outcome = result.pool("a")
    assert outcome.status == "placed" and outcome.served_rps == 200
    assert "exceeds max_replicas 2" in outcome.reasons[0]


def test_plan_placement_raises_when_validator_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.planner as planner

    monkeypatch.setattr(planner, "validate_plan", lambda request, plan: ["broken"])
    with pytest.raises(PlanRejected, match="broken"):
        plan(request([node("n", [gpu(0)])], [pool("a")]))


def test_plan_placement_moves_nothing_when_demand_changes_slightly_under_stability() -> None:
    from scheduler.replan import fleet_after, with_targets

    nodes = [node("n", [gpu(i) for i in range(3)])]
    pools = [pool(f"p{i}", {19: 100, 14: 195, 9: 280}, target=150 + 90 * i) for i in range(6)]
    first = plan(request(nodes, pools, objective="stability", time_limit_s=5.0))
    req = request(nodes, pools, objective="stability", time_limit_s=5.0)
    bumped = {p.name: p.target_rps * 1.08 for p in req.pools}
    again_req = req.model_copy(
        update={"fleet": fleet_after(req.fleet, first), "pools": with_targets(req.pools, bumped)}
    )
    again = plan(again_req)
    assert again.metrics.instances_moved == 0
    assert again.metrics.instances_kept == sum(p.replicas_placed for p in first.pools)
