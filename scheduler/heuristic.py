"""Fast placement for fleets of any size: most-constrained first, best fit, backtracking.

One pass places pools by priority, then by how constrained their profile is (fewest
start slots, most memory slices, fewest eligible GPUs) with best fit on count vectors
(:mod:`scheduler.packing`). When an instance does not fit anywhere, a bounded
backtracking step moves one instance off a GPU to make room; in a disruption-aware pass,
a pool that still does not fit may preempt lower-priority pools. Then lightly used GPUs
are emptied when all their instances fit elsewhere, and every GPU's counts are laid
onto exact start slots (keeping current instances where they are when possible).

Several passes run (one keeping current instances in place, others packing afresh with
shuffled tie-breaks) while the time budget lasts; the best by the plan objective wins.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.layouts import CountVector, Placement, layout_table, remove_profile
from scheduler.objective import Assignment, PlanScore, score
from scheduler.packing import Packing, transitions, used_slices, vector_fragmentation
from scheduler.profiles import PROFILE_ORDER, PROFILES, WHOLE_DEVICE
from scheduler.snapshot import Demand, GpuView, Snapshot

Clock = Callable[[], float]


@dataclass(frozen=True)
class HeuristicResult:
    assignment: Assignment
    score: PlanScore
    passes: int


def _shape(d: Demand) -> tuple[int, int]:
    if d.profile == WHOLE_DEVICE:
        return 1, 8
    return len(PROFILES[d.profile].start_slots), PROFILES[d.profile].memory_slices


def _constraint_key(d: Demand) -> tuple[int, ...]:
    """Most constrained first: fewest start slots, biggest, fewest eligible GPUs."""
    starts, slices = _shape(d)
    return (-d.priority, starts, -slices, len(d.eligible), -d.replicas)


def _smallest_key(d: Demand) -> tuple[int, ...]:
    """Smallest total first: places the most pools when capacity is short."""
    starts, slices = _shape(d)
    return (-d.priority, d.replicas * slices, starts, len(d.eligible))


class _Pass:
    """One greedy pass; ``budget`` bounds the backtracking work (deterministically)."""

    def __init__(self, snapshot: Snapshot, gpu_order: list[int], budget: int) -> None:
        self.snapshot = snapshot
        self.packing = Packing(snapshot, gpu_order)
        self.budget = budget
        self.unplaced: set[str] = set()
        self._eligible: dict[int, frozenset[int]] = {}
        self._current_counts = [g.current_counts for g in snapshot.gpus]
        # GPUs holding current instances of each profile: where an instance can be had
        # without repartitioning. Pruned lazily once their idle instances are used.
        self._holding: dict[int, list[int]] = {}
        for gpu in snapshot.gpus:
            if gpu.kind.mig_capable and gpu.mig_enabled:
                for pid in {c.profile for c in gpu.current}:
                    self._holding.setdefault(pid, []).append(gpu.position)
        self._holding_for: dict[tuple[int, int], list[int]] = {}

    def eligible(self, d: Demand) -> frozenset[int]:
        found = self._eligible.get(d.signature)
        if found is None:
            found = self._eligible[d.signature] = frozenset(d.eligible)
        return found

    def keep_current(self, demands: list[Demand]) -> None:
        """Pin every pool's current instances where they are (same profile, eligible)."""
        p = self.packing
        by_pool: dict[str, list[tuple[int, int]]] = {}
        for gpu in self.snapshot.gpus:
            for inst in gpu.current:
                if inst.pool is not None:
                    by_pool.setdefault(inst.pool, []).append((gpu.position, inst.profile))
        for d in demands:
            eligible = self.eligible(d)
            for g, pid in by_pool.get(d.pool, ()):
                wanted = pid == d.profile and p.placed(d.pool) < d.replicas
                if wanted and g in eligible and p.fits(d, g):
                    p.add(d, g)

    def _idle_current(self, d: Demand) -> int | None:
        """An eligible GPU with a current, unused instance of the profile (no repartition)."""
        key = (d.profile, d.signature)
        holding = self._holding_for.get(key)
        if holding is None:
            eligible = self.eligible(d)
            holding = [g for g in self._holding.get(d.profile, ()) if g in eligible]
            self._holding_for[key] = holding
        if not holding:
            return None
        p = self.packing
        k = PROFILE_ORDER.index(d.profile)

        def idle(g: int) -> bool:
            now, cur = p.counts[g], self._current_counts[g]
            return now[k] < cur[k] and all(a <= b for a, b in zip(now, cur, strict=True))

        for g in holding:
            if idle(g) and p.fits(d, g):
                return g
        holding[:] = [g for g in holding if idle(g)]
        return None

    def _make_room(self, d: Demand) -> int | None:
        """Move one instance off an eligible GPU so that ``d`` fits there."""
        p = self.packing
        for g in d.eligible:
            if self.budget <= 0:
                return None
            self.budget -= 1
            vec = p.counts[g]
            if p.family[g] == "whole" or not p._within_limits(d, g) or not sum(vec):
                continue
            trans = transitions(p.family[g])
            for pool in list(p.on_gpu[g]):
                other = p.demand[pool]
                if other.priority > d.priority or other.profile == d.profile:
                    continue
                if (remove_profile(vec, other.profile), d.profile) not in trans:
                    continue
                target = p.find(other, exclude=g)
                if target is not None:
                    p.remove(other, g)
                    p.add(other, target)
                    return g
        return None

    def place(self, d: Demand, sticky: bool) -> bool:
        p = self.packing
        while p.placed(d.pool) < d.replicas:
            g = self._idle_current(d) if sticky else None
            if g is None:
                g = p.find(d)
            if g is None and self.budget > 0:
                g = self._make_room(d)
            if g is None:
                return False
            p.add(d, g)
        return True

    def place_with_preemption(self, d: Demand, queue: list[Demand]) -> None:
        """Place ``d``; failing that, evict lower-priority pools one by one and retry."""
        p = self.packing
        if self.place(d, sticky=True):
            return
        eligible = set(d.eligible)
        victims = sorted(
            (
                p.demand[pool]
                for pool, gs in p.places.items()
                if gs and p.demand[pool].priority < d.priority and eligible.intersection(gs)
            ),
            key=lambda v: (v.priority, -len(p.places[v.pool]), v.pool),
        )
        evicted: list[tuple[Demand, list[int]]] = []
        for victim in victims:
            p.remove_pool(d)
            evicted.append((victim, p.remove_pool(victim)))
            if self.place(d, sticky=True):
                queue.extend(v for v, _ in evicted)
                return
        p.remove_pool(d)
        for victim, where in reversed(evicted):
            for g in where:
                p.add(victim, g)
        self.unplaced.add(d.pool)

    def eliminate_gpus(self, attempts: int) -> None:
        """Empty the least used GPUs whose instances all fit on other used GPUs."""
        p = self.packing
        order = sorted(p.used_gpus(), key=lambda g: (used_slices(p.counts[g]), g))
        for g in order[:attempts]:
            moved: list[tuple[Demand, int]] = []
            items = [(p.demand[pool], n) for pool, n in p.on_gpu[g].items()]
            for d, n in items:
                for _ in range(n):
                    p.remove(d, g)
            ok = True
            for d, n in items:
                for _ in range(n):
                    target = p.find(d, exclude=g, allow_empty=False)
                    if target is None:
                        ok = False
                        break
                    p.add(d, target)
                    moved.append((d, target))
                if not ok:
                    break
            if not ok:
                for d, target in moved:
                    p.remove(d, target)
                for d, n in items:
                    for _ in range(n):
                        p.add(d, g)

    def polish(self, budget: int) -> None:
        """Move single instances between used GPUs while total fragmentation drops.

        A lightly used GPU is fragmented (one 1g leaves 7 free slots but at most a
        4-slot window), so instances move onto it as well as off fragmented ones.
        """
        p = self.packing
        improved = True
        while improved and budget > 0:
            improved = False
            frag = {g: vector_fragmentation(p.family[g], p.counts[g]) for g in p.used_gpus()}
            if not any(frag.values()):
                return
            for g in sorted(frag, key=lambda g: (-frag[g], used_slices(p.counts[g]), g)):
                for pool in list(p.on_gpu[g]):
                    budget -= 1
                    d = p.demand[pool]
                    move = p.best_move(d, g)
                    if move is not None:
                        p.remove(d, g)
                        p.add(d, move[0])
                        improved = True
                        break
                if improved or budget <= 0:
                    break


def _positions(gpu: GpuView, counts: CountVector, staying: set[tuple[str, int]]) -> list[Placement]:
    """Exact start slots for a GPU's counts: its current instances when they suffice
    (no repartition), else the layout keeping in place most of the current instances
    whose (pool, profile) stays on this GPU."""
    current = gpu.current_counts
    if gpu.mig_enabled and all(a <= b for a, b in zip(counts, current, strict=True)):
        return sorted(gpu.current_placements)
    table = layout_table(gpu.allows_4g_with_3g)
    keep = frozenset(
        (c.profile, c.start) for c in gpu.current if (c.pool or "", c.profile) in staying
    )
    layout = table.best_layout(counts, keep=keep)
    assert layout is not None, f"count vector {counts} was accepted but has no layout"
    return list(layout.placements)


def lay_out(snapshot: Snapshot, packing: Packing) -> dict[str, tuple[tuple[int, int], ...]]:
    """Turn count vectors into (GPU, start slot) per pool, preferring current starts."""
    out: dict[str, list[tuple[int, int]]] = {}
    for g, pools in enumerate(packing.on_gpu):
        if not pools:
            continue
        gpu = snapshot.gpus[g]
        if not gpu.kind.mig_capable:
            (pool,) = pools
            out.setdefault(pool, []).append((g, 0))
            continue
        staying = {(pool, packing.demand[pool].profile) for pool in pools}
        free = set(_positions(gpu, packing.counts[g], staying))
        owner = {(c.profile, c.start): c.pool for c in gpu.current}
        wanted = [
            (pool, packing.demand[pool].profile) for pool, n in pools.items() for _ in range(n)
        ]
        rest = []
        for pool, pid in wanted:  # first, instances that stay exactly where they are
            mine = sorted(pl for pl in free if pl[0] == pid and owner.get(pl) == pool)
            if mine:
                free.discard(mine[0])
                out.setdefault(pool, []).append((g, mine[0][1]))
            else:
                rest.append((pool, pid))
        for pool, pid in rest:
            # Prefer slots nobody used before, so that fewer instances change hands.
            spot = min(
                (pl for pl in free if pl[0] == pid),
                key=lambda pl: (pl in owner and owner[pl] is not None, pl),
            )
            free.discard(spot)
            out.setdefault(pool, []).append((g, spot[1]))
    return {pool: tuple(sorted(places)) for pool, places in out.items()}


def _run(
    snapshot: Snapshot,
    objective: str,
    sticky: bool,
    rng: random.Random | None,
    budget: int,
    order: Callable[[Demand], tuple[int, ...]] = _constraint_key,
) -> Assignment:
    demands = list(snapshot.demands)
    gpu_order = list(range(len(snapshot.gpus)))
    if rng is not None:
        rng.shuffle(demands)
        rng.shuffle(gpu_order)
    demands.sort(key=order)  # stable: the shuffle only breaks ties
    run = _Pass(snapshot, gpu_order, budget)
    if sticky:
        run.keep_current(demands)
        rank = {d.pool: i for i, d in enumerate(demands)}
        heap = [(i, d.pool) for i, d in enumerate(demands)]
        while heap:
            _, pool = heapq.heappop(heap)
            requeued: list[Demand] = []
            run.place_with_preemption(run.packing.demand[pool], requeued)
            for victim in requeued:
                heapq.heappush(heap, (rank[victim.pool], victim.pool))
    else:
        for d in demands:
            if not run.place(d, sticky=False):
                run.packing.remove_pool(d)
                run.unplaced.add(d.pool)
    if objective == "efficiency":
        run.eliminate_gpus(attempts=max(8, min(256, budget // 8)))
        run.polish(budget)
    return lay_out(snapshot, run.packing)


def solve_heuristic(
    snapshot: Snapshot,
    objective: str,
    clock: Clock,
    rng: random.Random,
    time_budget_s: float,
    restarts: int,
) -> HeuristicResult:
    """Best of: a pass keeping current instances, a fresh pass, shuffled fresh passes."""
    start = clock()
    budget = max(64, 4 * len(snapshot.gpus))
    plans: list[Assignment] = []
    if any(g.current for g in snapshot.gpus):
        plans.append(_run(snapshot, objective, True, None, budget))
    plans.append(_run(snapshot, objective, False, None, budget))
    passes = len(plans)
    if score(snapshot, plans[-1]).unplaced_by_priority != (0,) * len(snapshot.priorities):
        plans.append(_run(snapshot, objective, False, None, budget, order=_smallest_key))
        passes += 1
    while passes < restarts + 1 and (clock() - start) * (passes + 1) / passes < time_budget_s:
        seeded = random.Random(rng.random())
        plans.append(_run(snapshot, objective, passes % 2 == 1, seeded, budget))
        passes += 1
    scored = [(score(snapshot, a), a) for a in plans]
    best_score, best = min(scored, key=lambda sa: sa[0].key(objective))
    return HeuristicResult(best, best_score, passes)
