from __future__ import annotations

import itertools

from scheduler.layouts import (
    counts_of,
    fragmentation,
    largest_placeable,
    layout_table,
    mask_of,
)
from scheduler.profiles import PROFILE_ORDER, PROFILES


def vector(**counts: int) -> tuple[int, ...]:
    by_id = {int(k.removeprefix("p")): n for k, n in counts.items()}
    return tuple(by_id.get(pid, 0) for pid in PROFILE_ORDER)


def brute_force_placeable(counts: tuple[int, ...], allow_4g_3g: bool = True) -> bool:
    """Independent check: try start slots instance by instance, on a set of used slots."""
    items = [pid for pid, n in zip(PROFILE_ORDER, counts, strict=True) for _ in range(n)]
    if any(counts[i] > PROFILES[pid].max_per_gpu for i, pid in enumerate(PROFILE_ORDER)):
        return False
    if not allow_4g_3g and 5 in items and 9 in items:
        return False

    def place(k: int, used: frozenset[int]) -> bool:
        if k == len(items):
            return True
        spec = PROFILES[items[k]]
        for start in spec.start_slots:
            slots = set(range(start, start + spec.memory_slices))
            if max(slots) < 8 and not slots & used and place(k + 1, used | slots):
                return True
        return False

    return place(0, frozenset())


def test_layout_table_accepts_4g_beside_3g_when_driver_is_r510_or_newer() -> None:
    assert layout_table(True).placeable(vector(p5=1, p9=1))
    assert not layout_table(False).placeable(vector(p5=1, p9=1))


def test_layout_table_rejects_two_3g_and_a_1g_when_compute_counts_fit() -> None:
    # 3 + 3 + 1 = 7 compute slices, but 4 + 4 + 1 = 9 memory slots.
    assert not layout_table().placeable(vector(p9=2, p19=1))


def test_layout_table_fills_gpu_with_four_2slot_1g_when_a100_40gb_style() -> None:
    table = layout_table()
    assert table.placeable(vector(p15=4))
    assert not table.placeable(vector(p15=4, p19=1))


def test_layout_table_limits_media_extension_profile_when_two_requested() -> None:
    assert not layout_table().placeable(vector(p20=2))
    assert layout_table().placeable(vector(p20=1, p19=6))


def test_layout_table_agrees_with_brute_force_when_counts_are_small() -> None:
    table = layout_table()
    for counts in itertools.product(
        range(2), range(2), range(3), range(3), range(3), range(2), range(4)
    ):
        assert table.placeable(counts) == brute_force_placeable(counts), counts


def test_fragmentation_counts_stranded_slots_when_instances_leave_holes() -> None:
    # mig.md's example: 1g at 0, 1 and 5 -> 5 free slots, largest placeable 2 (slot 2-3).
    assert fragmentation(mask_of([(19, 0), (19, 1), (19, 5)])) == 3
    assert fragmentation(mask_of([(19, 0), (19, 1), (19, 2)])) == 1
    assert fragmentation(0) == 0


def test_largest_placeable_is_3g_when_only_upper_half_is_free() -> None:
    assert largest_placeable(mask_of([(14, 0), (14, 2)])) == 9
    assert largest_placeable(mask_of([(9, 4)])) == 5
    assert largest_placeable(0b11111111) is None


def test_best_layout_keeps_current_placements_when_counts_allow() -> None:
    table = layout_table()
    keep = frozenset({(19, 6), (14, 2)})
    layout = table.best_layout(counts_of([(19, 0), (14, 0)]), keep=keep)
    assert layout is not None and set(layout.placements) == keep


def test_best_layout_is_least_fragmented_when_nothing_to_keep() -> None:
    layout = layout_table().best_layout(vector(p19=3))
    assert layout is not None and layout.fragmentation == 1
