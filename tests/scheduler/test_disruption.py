"""Disruption as mig-parted causes it (issue 12, point 1): a GPU whose profile counts
already match is left alone, any other is rebuilt and loses every instance."""

from __future__ import annotations

from scheduler.migparted import mig_parted_config, node_configs
from scheduler.plan import PlacementPlan
from scheduler.planner import plan_placement
from scheduler.validator import validate_plan
from tests.scheduler.builders import gpu, node, pool, request


def only_gpu(plan: PlacementPlan, key: str = "n/0"):  # type: ignore[no-untyped-def]
    return next(g for g in plan.gpus if g.key == key)


def test_plan_marks_nothing_kept_on_a_rebuilt_gpu_when_its_counts_change() -> None:
    # a runs a 3g at slot 0; b needs a second 3g on the only GPU: mig-parted rebuilds it
    # and destroys a's instance, though the new layout has a 3g at slot 0 again.
    req = request([node("n", [gpu(0, layout=[(9, 0, "a"), (14, 4, None), (19, 6, None)])])],
                  [pool("a", {9: 100}), pool("b", {9: 100})])  # fmt: skip
    plan = plan_placement(req)
    g = only_gpu(plan)
    assert g.repartition and sorted(i.pool or "" for i in g.instances) == ["a", "b"]
    assert not any(i.kept for i in g.instances)
    m = plan.metrics
    assert (m.instances_kept, m.instances_moved, m.instances_destroyed) == (0, 1, 1)
    assert m.instances_disrupted == 1
    assert validate_plan(req, plan) == []


def test_plan_leaves_slots_as_they_are_when_only_a_slot_move_would_lower_fragmentation() -> None:
    # 1g at slots 0 and 4 leave at most a 2-slot window (fragmentation 4); at 0 and 1 they
    # would leave a 4-slot one (2). Same counts: mig-parted would not touch the GPU, so
    # the plan must not pretend to have moved them.
    req = request([node("n", [gpu(0, layout=[(19, 0, "a"), (19, 4, "a")])])],
                  [pool("a", target=200)], solver="exact", objective="efficiency")  # fmt: skip
    plan = plan_placement(req)
    g = only_gpu(plan)
    assert [(i.start, i.kept) for i in g.instances] == [(0, True), (4, True)]
    assert not g.repartition
    assert plan.metrics.instances_disrupted == 0 and plan.metrics.fragmentation == 4


def test_plan_keeps_an_instance_of_the_right_profile_when_its_slot_differs_from_the_hint() -> None:
    # b moves onto a's GPU, which has an idle 1g: no rebuild; a keeps its own instance.
    req = request(
        [node("n", [gpu(0, layout=[(19, 0, "a"), (19, 3, None)]), gpu(1, layout=[(19, 0, "b")])])],
        [pool("a"), pool("b")],
        objective="efficiency",
    )
    plan = plan_placement(req)
    g0 = only_gpu(plan, "n/0")
    assert not g0.repartition and [(i.start, i.pool, i.kept) for i in g0.instances] == [
        (0, "a", True),
        (3, "b", False),
    ]
    assert plan.metrics.gpus_repartitioned == 0 and plan.metrics.instances_disrupted == 1


def test_mig_parted_entry_lists_current_counts_of_a_kept_gpu_when_its_node_is_relabelled() -> None:
    # GPU 0 keeps 7 x 1g (one used); GPU 1 is rebuilt for a 7g. The node's config must
    # give GPU 0 its current counts, or mig-parted would rebuild it as well.
    seven = [(19, s, "a" if s == 0 else None) for s in range(7)]
    req = request([node("n", [gpu(0, layout=seven), gpu(1, layout=[(9, 0, None)])])],
                  [pool("a"), pool("big", {0: 100}, target=50)])  # fmt: skip
    plan = plan_placement(req)
    assert [g.repartition for g in plan.gpus] == [False, True]
    entries = mig_parted_config(plan)["mig-configs"][node_configs(plan)["n"]]
    by_gpu = {i: e.get("mig-devices") for e in entries for i in e["devices"]}
    assert by_gpu == {0: {"1g.10gb": 7}, 1: {"7g.80gb": 1}}


def test_stability_rebuilds_fewer_gpus_than_efficiency_when_consolidation_needs_rebuilds() -> None:
    nodes = [node("n", [gpu(0, layout=[(9, 0, "a"), (14, 4, None), (19, 6, None)]),
                        gpu(1, layout=[(9, 0, "b")])])]  # fmt: skip
    pools = [pool("a", {9: 100}), pool("b", {9: 100})]
    eff = plan_placement(request(nodes, pools, objective="efficiency")).metrics
    stable = plan_placement(request(nodes, pools, objective="stability")).metrics
    assert (eff.gpus_used, eff.gpus_repartitioned, eff.instances_disrupted) == (1, 1, 2)
    assert (stable.gpus_used, stable.gpus_repartitioned, stable.instances_disrupted) == (2, 0, 0)


def test_default_objective_is_stability_when_the_fleet_already_runs_pools() -> None:
    nodes = [node("n", [gpu(0, layout=[(9, 0, "a"), (14, 4, None), (19, 6, None)]),
                        gpu(1, layout=[(9, 0, "b")])])]  # fmt: skip
    pools = [pool("a", {9: 100}), pool("b", {9: 100})]
    plan = plan_placement(request(nodes, pools))
    assert plan.objective == "stability"
    assert (plan.metrics.gpus_repartitioned, plan.metrics.instances_disrupted) == (0, 0)
    fresh = plan_placement(request([node("n", [gpu(0), gpu(1)])], pools))
    assert fresh.objective == "efficiency" and fresh.metrics.gpus_used == 1
