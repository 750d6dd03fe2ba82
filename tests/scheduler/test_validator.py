from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler.plan import GpuPlan, PlacementPlan, PlannedInstance, PlanRecord
from scheduler.planner import plan_placement
from scheduler.validator import validate_plan
from tests.scheduler.builders import gpu, node, pool, request


def with_gpu(plan: PlacementPlan, key: str, change: Callable[[GpuPlan], GpuPlan]) -> PlacementPlan:
    gpus = tuple(change(g) if g.key == key else g for g in plan.gpus)
    return plan.model_copy(update={"gpus": gpus})


def used_gpu(plan: PlacementPlan) -> GpuPlan:
    return next(g for g in plan.gpus if g.used and g.instances[0].profile_id >= 0)


def test_validate_plan_accepts_planner_output_when_examples(example_record: PlanRecord) -> None:
    assert validate_plan(example_record.request, example_record.plan) == []


def test_validate_plan_catches_invalid_start_slot_when_3g_starts_at_2(
    example_record: PlanRecord,
) -> None:
    target = used_gpu(example_record.plan)
    bad = PlannedInstance(profile_id=9, profile="3g.40gb", start=2, memory_slices=4, pool=None)
    plan = with_gpu(example_record.plan, target.key,
                    lambda g: g.model_copy(update={"instances": (bad,)}))  # fmt: skip
    problems = validate_plan(example_record.request, plan)
    assert any("cannot start at slot 2" in p for p in problems)


def test_validate_plan_catches_overlap_when_two_instances_share_a_slot(
    example_record: PlanRecord,
) -> None:
    target = used_gpu(example_record.plan)

    def duplicate(g: GpuPlan) -> GpuPlan:
        return g.model_copy(update={"instances": g.instances + g.instances[:1]})

    problems = validate_plan(
        example_record.request, with_gpu(example_record.plan, target.key, duplicate)
    )
    assert any("used by two instances" in p for p in problems)
    assert any("instances, outcome says" in p for p in problems)


def test_validate_plan_catches_media_extension_limit_when_two_on_one_gpu() -> None:
    req = request([node("n", [gpu(0)])], [])
    plan = plan_placement(req)
    me = [PlannedInstance(profile_id=20, profile="1g.10gb+me", start=s, memory_slices=1, pool=None)
          for s in (0, 1)]  # fmt: skip
    bad = with_gpu(plan, "n/0", lambda g: g.model_copy(
        update={"instances": tuple(me), "mig_enabled": True, "repartition": True}))  # fmt: skip
    assert any("at most 1" in p for p in validate_plan(req, bad))


def test_validate_plan_catches_memory_shortfall_when_model_is_bigger_than_profile() -> None:
    req = request([node("n", [gpu(0)])], [pool("fat", {19: 100, 9: 300}, memory=30.0)])
    plan = plan_placement(req)
    assert validate_plan(req, plan) == []

    def shrink(g: GpuPlan) -> GpuPlan:
        small = g.instances[0].model_copy(
            update={"profile_id": 19, "profile": "1g.10gb", "memory_slices": 1}
        )
        return g.model_copy(update={"instances": (small,)})

    problems = validate_plan(req, with_gpu(plan, "n/0", shrink))
    assert any("GiB <" in p for p in problems)


def test_validate_plan_catches_missing_repartition_flag_when_layout_changes() -> None:
    req = request([node("n", [gpu(0)])], [pool("a")])
    plan = plan_placement(req)
    unflagged = with_gpu(plan, "n/0", lambda g: g.model_copy(update={"repartition": False}))
    assert any("repartition is not flagged" in p for p in validate_plan(req, unflagged))


def test_validate_plan_catches_4g_with_3g_when_driver_is_old() -> None:
    req = request([node("n", [gpu(0)], driver_version="470.1")], [])
    plan = plan_placement(req)
    mix = (
        PlannedInstance(profile_id=5, profile="4g.40gb", start=0, memory_slices=4, pool=None),
        PlannedInstance(profile_id=9, profile="3g.40gb", start=4, memory_slices=4, pool=None),
    )
    bad = with_gpu(plan, "n/0", lambda g: g.model_copy(
        update={"instances": mix, "mig_enabled": True, "repartition": True}))  # fmt: skip
    assert any("R510" in p for p in validate_plan(req, bad))


@pytest.mark.parametrize("field", ["gpu_type", "taint"])
def test_validate_plan_catches_ineligible_gpu_when_constraints_exclude_it(field: str) -> None:
    taints = [{"key": "k", "value": "v", "effect": "NoSchedule"}] if field == "taint" else []
    nodes = [node("n", [gpu(0)], taints=taints)]
    pools = [pool("a", constraints={"gpu_types": ["H100-80GB"]} if field == "gpu_type" else {})]
    req = request(nodes, pools)
    # A plan made without the constraint, checked against the constrained request.
    free = request([node("n", [gpu(0)])], [pool("a")])
    problems = validate_plan(req, plan_placement(free).model_copy(update={"id": "x"}))
    assert any(("not allowed" if field == "gpu_type" else "not tolerated") in p for p in problems)
