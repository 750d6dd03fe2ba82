from __future__ import annotations

import random
import time

from scheduler.heuristic import HeuristicResult, solve_heuristic
from scheduler.objective import per_gpu
from scheduler.packing import Packing
from scheduler.request import PlanningRequest
from scheduler.snapshot import Snapshot, build_snapshot
from tests.scheduler.builders import gpu, node, pool, request


def solve(req: PlanningRequest, objective: str = "efficiency") -> tuple[Snapshot, HeuristicResult]:
    snapshot = build_snapshot(req)
    result = solve_heuristic(snapshot, objective, time.monotonic, random.Random(0), 0.5, 4)
    return snapshot, result


def test_heuristic_fits_4g_and_3g_on_one_gpu_when_3g_is_listed_first() -> None:
    # Slot-unaware first fit puts the 3g at slot 0 and then the 4g has nowhere to go.
    req = request(
        [node("n", [gpu(0)])],
        [pool("small", {9: 100}, target=100), pool("big", {5: 100}, target=100)],
    )
    snapshot, result = solve(req)
    layout = sorted((p, s) for _, p, s in per_gpu(snapshot, result.assignment)[0])
    assert layout == [(5, 0), (9, 4)]


def test_heuristic_uses_one_gpu_when_pools_pack_exactly() -> None:
    pools = [pool(f"p{i}", {14: 100}, target=100) for i in range(3)] + [pool("q", {19: 100})]
    snapshot, result = solve(request([node("n", [gpu(0), gpu(1)])], pools))
    assert result.score.gpus_used == 1 and sum(result.score.unplaced_by_priority) == 0


def test_heuristic_honours_node_selector_and_taints_when_choosing_gpus() -> None:
    nodes = [
        node("plain", [gpu(0)]),
        node("tainted", [gpu(0)], taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
        node("labelled", [gpu(0)], labels={"zone": "b"}),
    ]
    pools = [
        pool("tolerant", constraints={"tolerations": [{"key": "k", "operator": "Exists"}]}),
        pool("zoned", constraints={"node_selector": {"zone": "b"}}),
        pool("picky", target=300),  # may not use the tainted node
    ]
    snapshot, result = solve(request(nodes, pools))
    nodes_of = {
        name: {snapshot.gpus[g].node for g, _ in places}
        for name, places in result.assignment.items()
    }
    assert nodes_of["zoned"] == {"labelled"}
    assert "tainted" not in nodes_of["picky"]


def test_heuristic_reuses_idle_instance_when_objective_is_stability() -> None:
    nodes = [node("n", [gpu(0, layout=[(9, 0, None), (9, 4, "old")]), gpu(1)])]
    pools = [pool("old", {9: 100}), pool("new", {9: 100})]
    snapshot, result = solve(request(nodes, pools), "stability")
    assert result.score.gpus_repartitioned == 0
    assert result.assignment["old"] == ((0, 4),) and result.assignment["new"] == ((0, 0),)


def test_heuristic_places_higher_priority_when_capacity_is_short() -> None:
    nodes = [node("n", [gpu(0, layout=[(0, 0, "low")])])]
    pools = [pool("low", {0: 100}, priority=0), pool("high", {0: 100}, priority=10)]
    snapshot, result = solve(request(nodes, pools), "stability")
    assert set(result.assignment) == {"high"}
    assert result.score.unplaced_by_priority == (0, 1)


def test_packing_find_prefers_used_gpu_when_empty_gpu_also_fits() -> None:
    req = request([node("n", [gpu(0), gpu(1), gpu(2)])], [pool("a", {19: 100}, target=300)])
    snapshot = build_snapshot(req)
    packing = Packing(snapshot, gpu_order=[2, 1, 0])
    demand = snapshot.demands[0]
    first = packing.find(demand)
    assert first == 2  # all empty: the first in tie-break order
    packing.add(demand, first)
    assert packing.find(demand) == 2


def test_heuristic_respects_max_replicas_per_gpu_when_constrained() -> None:
    req = request(
        [node("n", [gpu(0), gpu(1), gpu(2)])],
        [pool("spread", {19: 100}, target=300, constraints={"max_replicas_per_gpu": 1})],
    )
    snapshot, result = solve(req)
    assert sorted(g for g, _ in result.assignment["spread"]) == [0, 1, 2]
