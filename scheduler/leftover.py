"""Free space left on each GPU by a plan, at slot level, without moving anything placed.

Used after the solvers: to give pools that did not fit whole what room is left (the
degraded fallback), and to say in an unplaced pool's reason how much room there was.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.layouts import LARGEST_FREE, fragmentation
from scheduler.profiles import MEMORY_SLOTS, PROFILES, WHOLE_DEVICE
from scheduler.snapshot import Snapshot

Placed = tuple[str, int, int]
"""(pool, profile id, start slot)."""


class FreeSpace:
    def __init__(self, snapshot: Snapshot, placed: Iterable[tuple[int, Placed]]) -> None:
        self.snapshot = snapshot
        n = len(snapshot.gpus)
        self.masks = [0] * n
        self.profiles: list[dict[int, int]] = [{} for _ in range(n)]
        self.on_gpu: dict[tuple[int, str], int] = {}
        self.on_node: dict[tuple[str, str], int] = {}
        for g, item in placed:
            self._occupy(g, *item)
        self.open = {g for g in range(n) if self._has_room(g)}

    def _has_room(self, g: int) -> bool:
        if not self.snapshot.gpus[g].kind.mig_capable:
            return self.masks[g] == 0
        return LARGEST_FREE[self.masks[g]] > 0

    def _occupy(self, g: int, pool: str, profile: int, start: int) -> None:
        if profile == WHOLE_DEVICE:
            self.masks[g] = (1 << MEMORY_SLOTS) - 1
        else:
            self.masks[g] |= PROFILES[profile].slot_mask(start)
        self.profiles[g][profile] = self.profiles[g].get(profile, 0) + 1
        self.on_gpu[(g, pool)] = self.on_gpu.get((g, pool), 0) + 1
        key = (self.snapshot.gpus[g].node, pool)
        self.on_node[key] = self.on_node.get(key, 0) + 1

    def starts(self, g: int, profile: int) -> list[int]:
        """Start slots where one more ``profile`` instance fits on GPU ``g`` right now."""
        gpu = self.snapshot.gpus[g]
        if profile == WHOLE_DEVICE:
            return [0] if not gpu.kind.mig_capable and self.masks[g] == 0 else []
        if not gpu.kind.mig_capable or profile not in gpu.kind.profiles:
            return []
        spec = PROFILES[profile]
        have = self.profiles[g]
        if have.get(profile, 0) >= spec.max_per_gpu:
            return []
        if not gpu.allows_4g_with_3g and (
            (profile == 5 and have.get(9)) or (profile == 9 and have.get(5))
        ):
            return []
        return [s for s in spec.start_slots if not spec.slot_mask(s) & self.masks[g]]

    def room(self, g: int, profile: int) -> int:
        """How many more ``profile`` instances fit on ``g`` (placing each at the first
        free start, which is optimal for a single profile)."""
        if profile == WHOLE_DEVICE:
            return len(self.starts(g, profile))
        spec = PROFILES[profile]
        mask, n = self.masks[g], 0
        limit = spec.max_per_gpu - self.profiles[g].get(profile, 0)
        if not self.starts(g, profile):
            return 0
        for s in spec.start_slots:
            if n < limit and not spec.slot_mask(s) & mask:
                mask |= spec.slot_mask(s)
                n += 1
        return n

    def total_room(self, profile: int, eligible: Iterable[int]) -> int:
        candidates = self.open.intersection(eligible)
        return sum(self.room(g, profile) for g in candidates)

    def _allowed(
        self, g: int, pool: str, max_per_gpu: int | None, max_per_node: int | None
    ) -> bool:
        if max_per_gpu is not None and self.on_gpu.get((g, pool), 0) >= max_per_gpu:
            return False
        node = self.snapshot.gpus[g].node
        return max_per_node is None or self.on_node.get((node, pool), 0) < max_per_node

    def fill(
        self,
        pool: str,
        profile: int,
        eligible: Iterable[int],
        limit: int,
        max_per_gpu: int | None = None,
        max_per_node: int | None = None,
    ) -> list[tuple[int, int]]:
        """Place up to ``limit`` instances, best fit: used GPUs first, fullest, least
        fragmented; returns (GPU, start) of each."""
        eligible_set = set(eligible)
        out: list[tuple[int, int]] = []
        while len(out) < limit:
            best: tuple[tuple[int, int, int, int], int, int] | None = None
            for g in self.open.intersection(eligible_set):
                if not self._allowed(g, pool, max_per_gpu, max_per_node):
                    continue
                for s in self.starts(g, profile):
                    after = self.masks[g] | (
                        (1 << MEMORY_SLOTS) - 1
                        if profile == WHOLE_DEVICE
                        else PROFILES[profile].slot_mask(s)
                    )
                    key = (self.masks[g] == 0, -after.bit_count(), fragmentation(after), g)
                    if best is None or key < best[0]:
                        best = (key, g, s)
            if best is None:
                break
            _, g, s = best
            self._occupy(g, pool, profile, s)
            if not self._has_room(g):
                self.open.discard(g)
            out.append((g, s))
        return out

    def release(self, pool: str, profile: int, places: Iterable[tuple[int, int]]) -> None:
        """Undo :meth:`fill` (the masks are rebuilt from what remains)."""
        for g, s in places:
            if profile == WHOLE_DEVICE:
                self.masks[g] = 0
            else:
                self.masks[g] &= ~PROFILES[profile].slot_mask(s)
            self.profiles[g][profile] -= 1
            self.on_gpu[(g, pool)] -= 1
            self.on_node[(self.snapshot.gpus[g].node, pool)] -= 1
            if self._has_room(g):
                self.open.add(g)
