from __future__ import annotations

import pytest

from scheduler.exact import solve_exact, variable_count
from scheduler.layouts import mask_of
from scheduler.objective import per_gpu, score
from scheduler.snapshot import build_snapshot
from tests.scheduler.builders import gpu, node, pool, request


def test_exact_packs_to_the_memory_bound_when_layouts_allow() -> None:
    # 2 x 3g (8 slots) + 3 x 2g + 2 x 1g (8 slots): two GPUs exactly.
    pools = [pool("a", {9: 100}, target=200), pool("b", {14: 100}, target=300),
             pool("c", {19: 100}, target=200)]  # fmt: skip
    snapshot = build_snapshot(request([node("n", [gpu(i) for i in range(4)])], pools))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None and result.status == "optimal"
    s = score(snapshot, result.assignment)
    assert (s.gpus_used, s.fragmentation, sum(s.unplaced_by_priority)) == (2, 0, 0)


def test_exact_avoids_fragmentation_when_gpu_count_ties() -> None:
    # Three 1g on one GPU: packed at one end leaves a 4-slot window (fragmentation 1);
    # spread out (e.g. 0, 1, 4) it would leave only 2-slot windows (fragmentation 3).
    snapshot = build_snapshot(request([node("n", [gpu(0)])], [pool("a", target=300)]))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None
    placed = per_gpu(snapshot, result.assignment)[0]
    assert score(snapshot, result.assignment).fragmentation == 1
    mask = mask_of((p, s) for _, p, s in placed)
    assert mask & 0b00001111 == 0 or mask & 0b11110000 == 0  # one half stays whole


def test_exact_keeps_current_layout_when_it_is_already_optimal() -> None:
    nodes = [node("n", [gpu(0, layout=[(14, 0, "b"), (19, 2, "c"), (9, 4, "a")]), gpu(1)])]
    pools = [pool("a", {9: 100}), pool("b", {14: 100}), pool("c", {19: 100})]
    snapshot = build_snapshot(request(nodes, pools))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None
    s = score(snapshot, result.assignment)
    assert (s.gpus_repartitioned, s.instances_moved, s.instances_kept) == (0, 0, 3)


@pytest.mark.parametrize("objective", ["efficiency", "stability"])
def test_exact_cannot_defragment_by_moving_slots_when_counts_stay_the_same(objective: str) -> None:
    # 3g@0 + 2g@4 + 1g@6 strands slot 7; 2g@0 + 1g@2 + 3g@4 would not. Both have the same
    # counts, so mig-parted leaves the GPU alone: no plan can reach the second layout.
    nodes = [node("n", [gpu(0, layout=[(9, 0, "a"), (14, 4, "b"), (19, 6, "c")])])]
    pools = [pool("a", {9: 100}), pool("b", {14: 100}), pool("c", {19: 100})]
    snapshot = build_snapshot(request(nodes, pools))
    result = solve_exact(snapshot, objective, 10.0, 1, 0)
    assert result is not None
    s = score(snapshot, result.assignment)
    assert (s.fragmentation, s.gpus_repartitioned, s.instances_kept) == (1, 0, 3)


@pytest.mark.parametrize(
    ("objective", "expected"), [("efficiency", (1, 1, 2)), ("stability", (2, 0, 0))]
)
def test_exact_counts_every_instance_of_a_rebuilt_gpu_when_it_consolidates(
    objective: str, expected: tuple[int, int, int]
) -> None:
    # Packing b's 3g beside a's needs a second 3g on GPU 0: mig-parted rebuilds it, so a's
    # instance is destroyed too, even though a "stays" at slot 0.
    nodes = [node("n", [gpu(0, layout=[(9, 0, "a"), (14, 4, None), (19, 6, None)]),
                        gpu(1, layout=[(9, 0, "b")])])]  # fmt: skip
    pools = [pool("a", {9: 100}), pool("b", {9: 100})]
    snapshot = build_snapshot(request(nodes, pools))
    result = solve_exact(snapshot, objective, 10.0, 1, 0)
    assert result is not None
    s = score(snapshot, result.assignment)
    assert (s.gpus_used, s.gpus_repartitioned, s.instances_moved) == expected


def test_exact_leaves_lower_priority_unplaced_when_capacity_is_short() -> None:
    pools = [pool("vip", {0: 100}, priority=100), pool("a", {5: 100}), pool("b", {9: 100})]
    snapshot = build_snapshot(request([node("n", [gpu(0)])], pools))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None
    assert set(result.assignment) == {"vip"}


def test_exact_places_most_pools_when_capacity_is_short_within_a_tier() -> None:
    pools = [pool("whole", {0: 100}), pool("x", {9: 100}), pool("y", {9: 100})]
    snapshot = build_snapshot(request([node("n", [gpu(0)])], pools))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None and set(result.assignment) == {"x", "y"}


def test_exact_forbids_4g_beside_3g_when_driver_is_older_than_r510() -> None:
    nodes = [node("n", [gpu(0), gpu(1)], driver_version="470.82.01")]
    pools = [pool("a", {5: 100}), pool("b", {9: 100})]
    snapshot = build_snapshot(request(nodes, pools))
    result = solve_exact(snapshot, "efficiency", 10.0, 1, 0)
    assert result is not None
    assert score(snapshot, result.assignment).gpus_used == 2


def test_variable_count_sums_eligible_starts_when_counted() -> None:
    snapshot = build_snapshot(request([node("n", [gpu(0), gpu(1)])], [pool("a", {14: 100})]))
    assert variable_count(snapshot) == 2 * 3
