"""The board the residency's decisions are worked out on: the available members of a
:class:`~gateway.policy.residency_view.ResidencyView` as the moves made so far leave
them, updated move by move; who may be evicted there and in what order (the coldest
first), and where a replica goes. :func:`gateway.policy.residency.plan` and a miss's
placement (:mod:`gateway.policy.residency_misses`) move models on it; the rules it
keeps are the policy's (:mod:`gateway.policy.residency`'s docstring). Pure."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping

from gateway.policy.residency_view import (
    HYSTERESIS,
    WAITERS_S,
    MemberView,
    Move,
    ResidencyKnobs,
    ResidencyView,
    wanted_replicas,
)


def used_bytes(view: ResidencyView, member_key: str) -> int:
    """The bytes a member's models take: held and draining ones (a model the view does
    not describe counts 0). KeyError for a member not in the view."""
    member = next((m for m in view.members if m.key == member_key), None)
    if member is None:
        raise KeyError(member_key)
    return _used(member, {m.name: m.footprint_bytes for m in view.models})


def _used(member: MemberView, footprints: Mapping[str, int]) -> int:
    taken = sum(footprints.get(name, 0)
                for name in set(member.held) | member.draining | member.pending)
    # a miss waiting for its victims to leave takes their room: those bytes count once
    twice = sum(min(footprints.get(name, 0), covered)
                for name, covered in member.covered.items() if name in member.pending)
    return taken - twice


Eligible = Callable[[str], bool]


class Board:
    """The available members as the plan leaves them, updated move by move (the plan's,
    and a miss's placement: :mod:`gateway.policy.residency_misses`)."""

    def __init__(self, view: ResidencyView, knobs: ResidencyKnobs,
                 young_probation: bool = False) -> None:
        self.now, self.knobs = view.now, knobs
        # probation models may go whatever their age (pending ones never)
        self.young_probation = young_probation
        self.models = {m.name: m for m in view.models}
        footprints = {m.name: m.footprint_bytes for m in view.models}
        self.members = {m.key: m for m in sorted(view.members, key=lambda m: m.key)
                        if m.available}
        self.holds = {k: {n for n in set(m.held) | m.pending if n not in m.draining}
                      for k, m in self.members.items()}
        self.used = {k: _used(m, footprints) for k, m in self.members.items()}
        self.probation = {k: set(m.probation) for k, m in self.members.items()}
        self.count: Counter[str] = Counter(n for names in self.holds.values() for n in names)
        # replicas wanted per model, worked out as asked (a miss's placement asks of a few
        # models, and makes a board for each moment it tries: a fifth of the simulator's
        # time went to working out every model's for each board)
        self._wanted: dict[str, int] = {}
        # (model, member) loaded by this plan, or kept where it took an eviction back: not
        # evicted by it
        self.planned: set[tuple[str, str]] = set()
        self.evicted: set[tuple[str, str]] = set()  # evicted by this plan: not loaded there
        self.loads: list[Move] = []
        self.evictions: list[Move] = []

    def footprint(self, name: str) -> int:
        model = self.models.get(name)
        return model.footprint_bytes if model is not None else 0

    def free(self, key: str) -> int:
        return self.members[key].budget_bytes - self.used[key]

    def missing(self, key: str, size: int) -> int:
        """The bytes to free on member ``key`` before a model of ``size`` bytes is placed
        there: it leaves the member's ``margin_bytes`` free, or what it can of them (a
        model larger than the budget less the margin, on an empty member)."""
        member = self.members[key]
        margin = max(0, min(member.margin_bytes, member.budget_bytes - size))
        return size + margin - self.free(key)

    def main_limit(self, key: str) -> int:
        """What the main segment may hold: the budget less the probation share."""
        return int(self.members[key].budget_bytes * (1 - self.knobs.probation_share))

    def main_used(self, key: str) -> int:
        names = self.holds[key] | self.members[key].draining
        return sum(self.footprint(n) for n in names if n not in self.probation[key])

    def main_free(self, key: str) -> int:
        return self.main_limit(key) - self.main_used(key)

    def wanted(self, name: str) -> int:
        """Replicas wanted of ``name`` (:func:`wanted_replicas`; 0 for a model the view
        does not describe)."""
        wanted = self._wanted.get(name)
        if wanted is None:
            model = self.models.get(name)
            wanted = 0 if model is None else wanted_replicas(
                model, len(self.members), self.knobs, self.now)
            self._wanted[name] = wanted
        return wanted

    def every_wanted(self) -> dict[str, int]:
        """Replicas wanted of every model the view describes, by name."""
        return {name: self.wanted(name) for name in sorted(self.models)}

    def beyond_wanted(self, name: str) -> bool:
        return self.count[name] > self.wanted(name)

    def coldness(self, name: str) -> tuple[int, float, float, str]:
        model = self.models.get(name)
        if model is None:
            return (0, 0.0, -math.inf, name)
        last = model.last_used if model.last_used is not None else -math.inf
        return (0 if self.beyond_wanted(name) else 1, model.value_per_byte, last, name)

    def evictable(self, key: str, name: str, young: bool = False) -> bool:
        """``young``: a model within ``min_resident_s`` of its load may go too (a
        member over its budget: the budget is the harder rule)."""
        model = self.models.get(name)
        member = self.members[key]
        protected = ((WAITERS_S if self.young_probation else self.knobs.probation_min_s)
                     if name in self.probation[key] else self.knobs.min_resident_s)
        return (name in self.holds[key] and (name, key) not in self.planned
                and name not in member.pending and not (model is not None and model.frozen)
                and (young or name in member.lent
                     or self.now - member.held[name] >= protected)
                and (model is None or self.count[name] - 1 >= model.min_replicas))

    def evict(self, key: str, name: str, reason: str) -> None:
        self.holds[key].discard(name)
        self.probation[key].discard(name)
        self.used[key] -= self.footprint(name)
        self.count[name] -= 1
        self.evicted.add((name, key))
        self.evictions.append(Move(name, key, reason))

    def keep(self, key: str, name: str) -> None:
        """Take back this plan's eviction of a replica (and evict it no more)."""
        self.evictions = [mv for mv in self.evictions if (mv.model, mv.member) != (name, key)]
        self.evicted.discard((name, key))
        self.holds[key].add(name)
        self.used[key] += self.footprint(name)
        self.count[name] += 1
        self.planned.add((name, key))

    def load(self, key: str, name: str, reason: str) -> None:
        self.holds[key].add(name)
        self.probation[key].discard(name)  # a plan's load is the main segment's
        self.used[key] += self.footprint(name)
        self.count[name] += 1
        self.planned.add((name, key))
        self.loads.append(Move(name, key, reason))

    def candidates(self, name: str) -> list[str]:
        """Members that could take the model, most free room first."""
        size = self.footprint(name)
        out = []
        for key, member in self.members.items():
            failed = member.failed.get(name)
            if (name in self.holds[key] or name in member.draining
                    or (name, key) in self.evicted
                    or size > member.budget_bytes
                    or (failed is not None
                        and self.now - failed < self.knobs.failed_retry_s)):
                continue
            out.append(key)
        return sorted(out, key=lambda k: (-self.free(k), k))

    def room(self, key: str, missing: int, eligible: Eligible,
             order: Callable[[str], tuple[object, ...]] | None = None) -> list[str] | None:
        """The coldest eligible models of a member that free ``missing`` bytes, no more
        of them than needed ([] when nothing is missing); None: they cannot.
        ``order``: which go first (default: the coldest)."""
        if missing <= 0:
            return []
        victims = sorted((n for n in self.holds[key] if self.evictable(key, n) and eligible(n)),
                         key=order or self.coldness)
        chosen, freed = [], 0
        for name in victims:
            if freed >= missing:
                break
            chosen.append(name)
            freed += self.footprint(name)
        if freed < missing:
            return None
        for name in reversed(chosen[:-1]):  # the last one was needed; drop any other spare
            if freed - self.footprint(name) >= missing:
                chosen.remove(name)
                freed -= self.footprint(name)
        return chosen

    def place(self, name: str, reason: str, eligible: Eligible) -> str | None:
        """Load one replica (evicting for room as needed); the member, None: nowhere. A
        replica this plan evicted stays instead where it can (room made again there):
        an eviction taken back costs nothing, a load elsewhere a load."""
        taken = sorted((k for n, k in self.evicted if n == name),
                       key=lambda k: (-self.free(k), k))
        for key in [*taken, *self.candidates(name)]:
            victims = self.room(key, self.missing(key, self.footprint(name)), eligible)
            if victims is not None:
                for victim in victims:
                    self.evict(key, victim, "room")
                if key in taken:
                    self.keep(key, name)
                else:
                    self.load(key, name, reason)
                return key
        return None

    def evict_surplus(self) -> bool:
        evicted = len(self.evictions)
        for name in sorted(self.count):
            model = self.models.get(name)
            if model is not None and model.frozen:
                continue
            while self.count[name] > max(1, self.wanted(name)) or (
                    model is None and self.count[name] > 0):
                left = self.count[name] - 1
                if model is not None and model.demand_rps >= (
                        HYSTERESIS * left * self.knobs.rps_per_replica):
                    break
                keys = [k for k in self.members if self.evictable(k, name)]
                if not keys:
                    break
                self.evict(min(keys, key=lambda k: (self.free(k), k)), name, "surplus")
        return len(self.evictions) > evicted

    def evict_over_budget(self) -> None:
        for key in self.members:
            victims = self.room(key, -self.free(key), lambda _: True)
            for victim in victims or ():
                self.evict(key, victim, "room")
            if victims is None:  # what can go goes, the young too: the budget first
                while self.free(key) < 0:
                    left = [n for n in self.holds[key] if self.evictable(key, n)] or [
                        n for n in self.holds[key] if self.evictable(key, n, young=True)]
                    if not left:
                        break
                    self.evict(key, min(left, key=self.coldness), "room")
