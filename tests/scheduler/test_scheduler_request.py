from __future__ import annotations

import pytest

from scheduler.errors import InvalidPlanningInput
from scheduler.request import load_request, parse_request
from tests.scheduler.builders import EXAMPLES, Slot, gpu, node, pool


def problems_for(nodes: list[dict], pools: list[dict]) -> list[tuple[tuple, str]]:
    with pytest.raises(InvalidPlanningInput) as caught:
        parse_request({"fleet": {"nodes": nodes}, "pools": pools})
    return [(p.loc, p.msg) for p in caught.value.problems]


def test_parse_request_names_type_field_when_gpu_type_unknown() -> None:
    found = problems_for([node("n", [gpu(0, kind="B200")])], [])
    assert found[0][0] == ("fleet", "nodes", 0, "gpus", 0, "type")


def test_parse_request_names_start_field_when_start_slot_invalid() -> None:
    found = problems_for([node("n", [gpu(0, layout=[(9, 2, None)])])], [])
    assert found == [
        (("fleet", "nodes", 0, "gpus", 0, "mig", "instances", 0, "start"), found[0][1])
    ]
    assert "valid: [0, 4]" in found[0][1]


def test_parse_request_flags_overlap_when_instances_share_slots() -> None:
    found = problems_for([node("n", [gpu(0, layout=[(14, 2, None), (19, 3, None)])])], [])
    assert found[0][0] == ("fleet", "nodes", 0, "gpus", 0, "mig", "instances", 1)
    assert "overlaps" in found[0][1]


def test_parse_request_rejects_4g_beside_3g_when_driver_is_older_than_r510() -> None:
    """No pre-R510 driver can make this layout (k8s inventory refuses its counts too);
    taken as is, the planner kept it and then rejected its own plan (found by
    test_planner_properties)."""
    mix: list[Slot] = [(5, 0, None), (9, 4, None)]
    found = problems_for(
        [node("n", [gpu(0, kind="A100-40GB", layout=mix)], driver_version="470.82.01")], []
    )
    assert found == [(("fleet", "nodes", 0, "gpus", 0, "mig", "instances"), found[0][1])]
    assert "R510" in found[0][1] and "470.82.01" in found[0][1]
    newer = node("n", [gpu(0, kind="A100-40GB", layout=mix)], driver_version="550.54.15")
    parse_request({"fleet": {"nodes": [newer]}, "pools": []})


def test_parse_request_names_profile_when_unknown_on_type() -> None:
    found = problems_for([node("n", [gpu(0, kind="A100-40GB", layout=[("3g.40gb", 0, None)])])], [])
    assert found[0][0][-1] == "profile" and "3g.20gb" in found[0][1]


def test_parse_request_rejects_mig_layout_when_gpu_not_mig_capable() -> None:
    found = problems_for([node("n", [gpu(0, kind="T4", layout=[])])], [])
    assert found[0][0][-1] == "mig"


def test_parse_request_rejects_duplicates_when_names_repeat() -> None:
    found = problems_for([node("n", [gpu(0), gpu(0)]), node("n", [gpu(0)])], [pool("a"), pool("a")])
    locs = {loc for loc, _ in found}
    assert ("fleet", "nodes", 0, "gpus", 1, "index") in locs
    assert ("fleet", "nodes", 1, "name") in locs
    assert ("pools", 1, "name") in locs


def test_parse_request_rejects_replica_bounds_when_min_over_max() -> None:
    found = problems_for([node("n", [gpu(0)])], [pool("a", min_replicas=3, max_replicas=2)])
    assert found[0][0] == ("pools", 0) and "min_replicas" in found[0][1]


def test_parse_request_names_capacity_profile_when_unknown_everywhere() -> None:
    found = problems_for([node("n", [gpu(0)])], [pool("a", {"5g.50gb": 10})])
    assert found[0][0] == ("pools", 0, "capacity", 0, "profile")


def test_parse_request_requires_profile_when_capacity_names_mig_type_only() -> None:
    bad = pool("a")
    bad["capacity"] = [{"gpu_type": "A100-80GB", "rps": 10}]
    found = problems_for([node("n", [gpu(0)])], [bad])
    assert found[0][0] == ("pools", 0, "capacity", 0, "profile")


def test_parse_request_rejects_bad_pool_name_when_not_dns_label() -> None:
    found = problems_for([node("n", [gpu(0)])], [pool("Bad_Name")])
    assert found[0][0] == ("pools", 0, "name")


def test_load_request_reads_example_files_when_given_paths() -> None:
    request = load_request(EXAMPLES / "fleet.yaml", EXAMPLES / "pools.yaml")
    assert request.fleet.gpu_count == 8 and len(request.pools) == 7
