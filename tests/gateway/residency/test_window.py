"""RecentMax: the largest value noted within a window, over a fake clock."""

from __future__ import annotations

from gateway.residency.window import RecentMax


def test_the_largest_within_the_window_and_none_after_it() -> None:
    recent = RecentMax(window_s=10.0)
    assert recent.value(0.0) == 0
    recent.note(5, 0.0)
    recent.note(3, 2.0)
    recent.note(4, 4.0)
    assert recent.value(4.0) == 5
    assert recent.value(10.0) == 5  # noted 10 s ago: still within
    assert recent.value(10.5) == 4  # 5 gone; 4 (noted later than 3, and larger) remains
    assert recent.value(14.5) == 0


def test_a_larger_value_retires_the_earlier_ones_so_few_are_kept() -> None:
    recent = RecentMax(window_s=10.0)
    for second in range(1000):  # a rise each second, growing
        recent.note(second, float(second))
    assert recent.value(999.0) == 999 and len(recent._kept) == 1
    for second in range(1000, 1005):  # falling ones are kept: each may be the largest later
        recent.note(2000 - second, float(second))
    assert len(recent._kept) == 5 and recent.value(1004.0) == 1000
