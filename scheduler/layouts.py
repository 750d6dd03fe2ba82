"""The 8-slot memory axis as bitmasks, and every valid MIG layout enumerated once.

A *layout* is a set of (profile id, start slot) placements that respect the start slots,
never overlap in memory slots and keep each profile under its per-GPU maximum. A
*count vector* says how many instances of each profile (in ``PROFILE_ORDER``) a GPU
holds; it is what mig-parted configures. A count vector is *placeable* exactly when some
layout realises it, which is the question count-only tools cannot answer.

There are few layouts (under a thousand), so they are enumerated at import time and the
planners work on count vectors with table look-ups instead of searching slot positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from scheduler.profiles import MEMORY_SLOTS, PROFILE_INDEX, PROFILE_ORDER, PROFILES

Placement = tuple[int, int]
"""(profile id, start slot)."""
CountVector = tuple[int, ...]
"""Instances per profile, indexed like ``PROFILE_ORDER``."""

FULL_MASK = (1 << MEMORY_SLOTS) - 1
EMPTY_VECTOR: CountVector = (0,) * len(PROFILE_ORDER)

# Every window of free slots some profile could be created in: (mask, memory slices).
FREE_WINDOWS: tuple[tuple[int, int], ...] = tuple(
    sorted(
        {
            (PROFILES[p].slot_mask(s), PROFILES[p].memory_slices)
            for p in PROFILE_ORDER
            for s in PROFILES[p].start_slots
        },
        key=lambda w: (-w[1], w[0]),
    )
)


def mask_of(placements: Iterable[Placement]) -> int:
    mask = 0
    for pid, start in placements:
        mask |= PROFILES[pid].slot_mask(start)
    return mask


def _largest_free_window(occupied: int) -> int:
    for window, size in FREE_WINDOWS:
        if window & occupied == 0:
            return size
    return 0


LARGEST_FREE: tuple[int, ...] = tuple(_largest_free_window(m) for m in range(1 << MEMORY_SLOTS))
"""Memory slices of the largest profile still placeable, indexed by occupied mask."""


def fragmentation(occupied: int) -> int:
    """Free memory slots that the largest placeable profile cannot use.

    Zero for an empty or full GPU and for one whose free space is a single placeable
    window; the "1g at 0, 1 and 5" example of mig.md scores 5 - 2 = 3.
    """
    free = MEMORY_SLOTS - occupied.bit_count()
    return free - LARGEST_FREE[occupied]


def counts_of(placements: Iterable[Placement]) -> CountVector:
    counts = [0] * len(PROFILE_ORDER)
    for pid, _ in placements:
        counts[PROFILE_INDEX[pid]] += 1
    return tuple(counts)


@dataclass(frozen=True)
class Layout:
    placements: tuple[Placement, ...]
    mask: int
    counts: CountVector

    @property
    def fragmentation(self) -> int:
        return fragmentation(self.mask)


def _allows_4g_with_3g(placements: tuple[Placement, ...]) -> bool:
    pids = {pid for pid, _ in placements}
    return not (5 in pids and 9 in pids)


def _enumerate(allow_4g_3g: bool) -> tuple[Layout, ...]:
    options = [(pid, s) for pid in PROFILE_ORDER for s in PROFILES[pid].start_slots]
    found: list[Layout] = []

    def extend(start_index: int, chosen: list[Placement], mask: int, counts: list[int]) -> None:
        placed = tuple(chosen)
        if allow_4g_3g or _allows_4g_with_3g(placed):
            found.append(Layout(placed, mask, tuple(counts)))
        for i in range(start_index, len(options)):
            pid, start = options[i]
            slot_mask = PROFILES[pid].slot_mask(start)
            k = PROFILE_INDEX[pid]
            if slot_mask & mask or counts[k] >= PROFILES[pid].max_per_gpu:
                continue
            chosen.append((pid, start))
            counts[k] += 1
            extend(i + 1, chosen, mask | slot_mask, counts)
            counts[k] -= 1
            chosen.pop()

    extend(0, [], 0, [0] * len(PROFILE_ORDER))
    return tuple(found)


@dataclass(frozen=True, eq=False)
class LayoutTable:
    """All layouts of one driver family, indexed by count vector."""

    layouts: tuple[Layout, ...]
    by_counts: Mapping[CountVector, tuple[Layout, ...]]

    def placeable(self, counts: CountVector) -> bool:
        return counts in self.by_counts

    def best_layout(
        self, counts: CountVector, keep: frozenset[Placement] = frozenset()
    ) -> Layout | None:
        """The layout for ``counts`` keeping most of ``keep`` in place, then least
        fragmented, then lowest start slots (deterministic)."""
        if not keep:
            return _fresh_layout(self, counts)
        candidates = self.by_counts.get(counts)
        if not candidates:
            return None
        return min(
            candidates,
            key=lambda lay: (
                -len(keep.intersection(lay.placements)),
                lay.fragmentation,
                lay.placements,
            ),
        )

    def min_fragmentation(self, counts: CountVector) -> int:
        layout = self.best_layout(counts)
        return MEMORY_SLOTS if layout is None else layout.fragmentation


@cache
def _fresh_layout(table: LayoutTable, counts: CountVector) -> Layout | None:
    candidates = table.by_counts.get(counts)
    if not candidates:
        return None
    return min(candidates, key=lambda lay: (lay.fragmentation, lay.placements))


@cache
def layout_table(allow_4g_3g: bool = True) -> LayoutTable:
    """Layouts for drivers that allow the 4g+3g mix (R510+) or not."""
    layouts = _enumerate(allow_4g_3g)
    grouped: dict[CountVector, list[Layout]] = {}
    for layout in layouts:
        grouped.setdefault(layout.counts, []).append(layout)
    return LayoutTable(
        layouts=layouts,
        by_counts=MappingProxyType({k: tuple(v) for k, v in grouped.items()}),
    )


def add_profile(counts: CountVector, profile_id: int) -> CountVector:
    k = PROFILE_INDEX[profile_id]
    return counts[:k] + (counts[k] + 1,) + counts[k + 1 :]


def remove_profile(counts: CountVector, profile_id: int) -> CountVector:
    k = PROFILE_INDEX[profile_id]
    if counts[k] == 0:
        raise ValueError(f"no instance of profile {profile_id} to remove")
    return counts[:k] + (counts[k] - 1,) + counts[k + 1 :]


def memory_slices(counts: CountVector) -> int:
    return sum(n * PROFILES[p].memory_slices for p, n in zip(PROFILE_ORDER, counts, strict=True))


def compute_slices(counts: CountVector) -> int:
    return sum(n * PROFILES[p].compute_slices for p, n in zip(PROFILE_ORDER, counts, strict=True))


# Profiles from the biggest to the smallest instance: what "largest placeable" means.
_BY_SIZE: tuple[int, ...] = tuple(
    sorted(PROFILES, key=lambda p: (-PROFILES[p].memory_slices, -PROFILES[p].compute_slices, p))
)


def largest_placeable(occupied: int) -> int | None:
    """Profile id of the biggest instance that still fits beside ``occupied``."""
    for pid in _BY_SIZE:
        spec = PROFILES[pid]
        if any(not spec.slot_mask(s) & occupied for s in spec.start_slots):
            return pid
    return None
