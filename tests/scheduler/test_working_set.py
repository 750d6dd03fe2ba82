"""Pools sized from their working set (scheduler/working_set.py): the footprints of the
models the gateway's residency keeps resident at the measured demand, not the sum of
every model the pool may serve."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gateway.policy import residency as policy
from scheduler.cli import app
from scheduler.errors import InvalidPlanningInput
from scheduler.planner import plan_placement
from scheduler.pools import PoolSpec
from scheduler.request import load_request
from scheduler.sizing import size_pool
from scheduler.working_set import (
    GIB,
    WorkingSet,
    all_models_gib,
    member_bytes,
    models_from_report,
    placement,
    resident_models,
    working_set_gib,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "scheduler" / "examples"
CAPACITY = [{"profile": 19, "rps": 60}, {"profile": 14, "rps": 120},
            {"profile": 9, "rps": 200}, {"profile": 0, "rps": 400}]
# 40 models of three sizes; eight have demand (Zipf-like), the rest none
SIZES = [2 * GIB] * 12 + [GIB] * 14 + [GIB // 2] * 14
DEMAND = {0: 120.0, 13: 60.0, 27: 30.0, 1: 10.0, 14: 4.0, 28: 1.5, 2: 0.5, 15: 0.2}


def forty_models(**changes: Any) -> list[dict[str, Any]]:
    models = [{"name": f"model-{i:02d}", "footprint_bytes": size,
               "demand_rps": DEMAND.get(i, 0.0)} for i, size in enumerate(SIZES)]
    for name, fields in changes.items():
        next(m for m in models if m["name"] == name).update(fields)
    return models


def working_set(**fields: Any) -> dict[str, Any]:
    return {"rps_per_replica": 50, "headroom_gib": 1.0, "models": forty_models(), **fields}


def pool(**fields: Any) -> PoolSpec:
    base: dict[str, Any] = {"name": "many", "model": "many-models", "target_rps": 200,
                            "max_replicas": 8, "capacity": CAPACITY}
    base.update(fields)
    return PoolSpec.model_validate(base)


def test_forty_models_fit_a_smaller_profile_by_working_set_than_by_their_sum() -> None:
    ws = WorkingSet.model_validate(working_set())
    assert all_models_gib(ws) == pytest.approx(46.0)  # every model resident: 7g.80gb only
    by_sum = size_pool(pool(memory_gib=all_models_gib(ws)), ["A100-80GB"]).best
    by_working_set = size_pool(pool(working_set=working_set()), ["A100-80GB"]).best
    assert by_sum is not None and (by_sum.profile, by_sum.replicas) == (0, 1)
    assert by_working_set is not None and by_working_set.meets_target
    # 3g.40gb: the 8 models with demand, spread by the policy, take 10 GiB + 1 of headroom
    assert (by_working_set.profile, by_working_set.replicas) == (9, 1)
    assert by_working_set.memory_gib == pytest.approx(11.0)
    assert resident_models(ws, 1) == 8
    slices = by_working_set.replicas * by_working_set.slices_per_replica
    assert slices == 4 < by_sum.replicas * by_sum.slices_per_replica == 8


def test_a_member_needs_less_as_the_pool_has_more_and_replicas_follow_demand() -> None:
    ws = WorkingSet.model_validate(working_set())
    needs = [working_set_gib(ws, n) for n in range(1, 6)]
    assert needs == sorted(needs, reverse=True) and needs[0] > needs[-1]
    held = placement(ws, 3)
    # model-00 (120 rps at 50 a replica) on every one of 3 members; model-13 (60) on 2
    assert sum("model-00" in h for h in held.values()) == 3
    assert sum("model-13" in h for h in held.values()) == 2
    assert all("model-39" not in h for h in held.values())  # no demand: loads on a miss


def test_more_replicas_than_the_target_needs_when_that_fits_a_smaller_profile() -> None:
    # 50 rps: one 1g.10gb carries it, but one member would need 11 GiB; two need 7.5
    sized = size_pool(pool(working_set=working_set(), target_rps=50,
                           capacity=[{"profile": 19, "rps": 60}, {"profile": 9, "rps": 200}]),
                      ["A100-80GB"])
    assert sized.best is not None
    assert (sized.best.profile, sized.best.replicas) == (19, 2)
    assert sized.best.memory_gib == pytest.approx(7.5)


def test_pinned_models_count_on_every_member_and_a_model_fits_one_or_the_pool_fails() -> None:
    pinned = working_set(models=forty_models(**{"model-03": {"pinned": True},
                                               "model-04": {"min_replicas": 1}}))
    ws = WorkingSet.model_validate(pinned)
    for n in (1, 2, 4):
        held = placement(ws, n)
        assert all("model-03" in h for h in held.values())
        assert sum("model-04" in h for h in held.values()) == 1
    huge = working_set(models=forty_models(**{"model-39": {"footprint_bytes": 90 * GIB}}))
    sized = size_pool(pool(working_set=huge), ["A100-80GB"])
    assert sized.best is None and "working set needs 91.0 GiB" in (sized.problem or "")


def test_the_gateway_policy_holds_the_whole_working_set_within_a_budget_so_sized() -> None:
    """A member whose budget is the working set computed for it holds every replica the
    policy wants, from an empty start, never over the budget: random working sets."""
    rng = random.Random(29)
    for _ in range(60):
        models = [{"name": f"m{i}", "footprint_bytes": rng.randint(1, 40) * GIB // 8,
                   "demand_rps": rng.choice([0.0, 0.0, rng.uniform(0.1, 300)]),
                   "pinned": rng.random() < 0.05} for i in range(rng.randint(1, 40))]
        ws = WorkingSet.model_validate({"rps_per_replica": rng.choice([20, 50, 100]),
                                        "models": models})
        members = rng.randint(1, 6)
        budget = member_bytes(ws, members)
        view = policy.ResidencyView(
            now=0.0,
            models=tuple(policy.ModelView(m.name, m.footprint_bytes,
                                          members if m.pinned else 0, m.demand_rps, None)
                         for m in ws.models),
            members=tuple(policy.MemberView(f"k{i}", budget, True, {})
                          for i in range(members)))
        plan = policy.plan(view, policy.ResidencyKnobs(rps_per_replica=ws.rps_per_replica))
        placed: dict[str, int] = {}
        used = dict.fromkeys((m.key for m in view.members), 0)
        sizes = {m.name: m.footprint_bytes for m in ws.models}
        for move in plan.loads:
            placed[move.model] = placed.get(move.model, 0) + 1
            used[move.member] += sizes[move.model]
        assert {k: v for k, v in plan.replicas.items() if v} == placed
        assert max(used.values(), default=0) <= budget


REPORT: dict[str, Any] = {
    "enabled": True,
    "pools": [{"name": "cpu", "budget_bytes": 4 * GIB, "headroom_bytes": 0,
               "members": [{"key": "a:8001", "models": []}, {"key": "b:8001", "models": []}]},
              {"name": "other", "members": []}],
    "models": {
        "hot": {"pool": "cpu", "on_demand": True, "min_replicas": 0,
                "footprint_bytes": 3 * GIB, "footprint_source": "measured",
                "demand_rps": 75.0, "last_used_s_ago": 0.4, "members": ["a:8001"],
                "waiting": 0},
        "always": {"pool": "cpu", "on_demand": False, "min_replicas": 2,
                   "footprint_bytes": GIB, "footprint_source": "converter",
                   "demand_rps": 0.0, "last_used_s_ago": None, "members": [], "waiting": 0},
        "once": {"pool": "cpu", "on_demand": True, "min_replicas": 1,
                 "footprint_bytes": GIB // 2, "footprint_source": "config",
                 "demand_rps": 0.0, "last_used_s_ago": None, "members": [], "waiting": 0},
        "elsewhere": {"pool": "other", "on_demand": True, "min_replicas": 0,
                      "footprint_bytes": GIB, "demand_rps": 1.0},
    },
}


def test_models_come_from_the_gateways_residency_report() -> None:
    models = {m.name: m for m in models_from_report(REPORT, "cpu")}
    assert set(models) == {"hot", "always", "once"}
    assert models["hot"].demand_rps == 75.0 and models["hot"].footprint_bytes == 3 * GIB
    assert models["always"].pinned and not models["once"].pinned
    assert models["once"].min_replicas == 1


def _pools_file(tmp_path: Path, **working: Any) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": [{
        "name": "cpu", "model": "many", "target_rps": 100, "max_replicas": 4,
        "capacity": [{"profile": 19, "rps": 60}, {"profile": 9, "rps": 200}],
        "working_set": {"rps_per_replica": 50, **working}}]}))
    return path


def test_plan_reads_the_report_and_says_how_the_pool_was_sized(tmp_path: Path) -> None:
    (tmp_path / "residency.json").write_text(json.dumps(REPORT))
    pools = _pools_file(tmp_path, headroom_gib=0.5)
    request = load_request(EXAMPLES / "fleet.yaml", pools, residency=REPORT)
    ws = request.pools[0].working_set
    assert ws is not None and {m.name for m in ws.models} == {"hot", "always", "once"}
    result = CliRunner().invoke(app, [
        "plan", "--fleet", str(EXAMPLES / "fleet.yaml"), "--pools", str(pools),
        "--residency", str(tmp_path / "residency.json"), "--solver", "heuristic", "--json"])
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.output)["pools"][0]
    # two 1g.10gb (100 rps at 60 each): hot (75 rps -> 2 replicas) and always on each,
    # once on one: 3 + 1 + 0.5 + 0.5 (headroom) GiB on the member holding once
    assert outcome["status"] == "placed" and outcome["profile_id"] == 19
    assert outcome["replicas_placed"] == 2
    assert any("sized from its working set: 5.0 GiB a replica (3 of 3 models" in r
               for r in outcome["reasons"]), outcome["reasons"]
    plan = plan_placement(request)
    assert plan.pools[0].status == "placed"


def test_a_working_set_naming_a_pool_the_report_lacks_is_refused(tmp_path: Path) -> None:
    pools = _pools_file(tmp_path, gateway_pool="nope")
    with pytest.raises(InvalidPlanningInput) as caught:
        load_request(EXAMPLES / "fleet.yaml", pools, residency=REPORT)
    assert "no pool 'nope'" in str(caught.value.problems)


def test_a_pool_gives_memory_gib_or_a_working_set_not_both() -> None:
    with pytest.raises(ValueError, match="exactly one of memory_gib"):
        pool()
    with pytest.raises(ValueError, match="exactly one of memory_gib"):
        pool(memory_gib=4, working_set=working_set())
