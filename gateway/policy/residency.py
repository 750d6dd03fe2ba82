"""Residency: which models each member of a pool holds, within a memory budget per
member (issues 29 and 34). Pure: the control plane (:mod:`gateway.residency`) builds a
:class:`ResidencyView` once per round and carries out the :class:`Plan` that
:func:`plan` returns; a request for a model that no available member holds (a miss)
asks :func:`gateway.policy.residency_misses.place_miss` where to load it right away.

**Replicas wanted** (:func:`wanted_replicas`): ``max(min_replicas, ceil(demand_rps /
(rps_per_replica * replica_lead)))`` (the next replica loads at 90 % of what the others
carry, before requests queue behind them), at least 1 while the model has demand
(``demand_rps > 0``, smoothed by :func:`smoothed_rate`) or was used within
``min_resident_s``, capped at the available members. ``min_replicas`` comes resolved
(:func:`resolve_min_replicas`): 0 for an on-demand model, every member of the pool for
a pinned one, at least 1 under rollout. A model under rollout is *frozen*: it keeps the
members it has, neither loaded nor evicted.

**Value per byte**: models are ranked by demand per byte of footprint (what a byte of a
budget earns holding them, as the best fixed placement is found).

**Segments**: a model loaded for a miss is in its member's *probation* segment, the
rest in the *main* one. A probation model with demand joins the main segment (a
``promote`` move in :attr:`Plan.segments`) where the main segment, limited to the budget
less ``probation_share``, has room for it, or where main models colder by the margin
change places with it (``demote``). Segments decide only who a miss evicts first; the
plan places over the whole budget.

**Pending** models (queued, loading, warming) count in their member's use and are never
evicted.

**The plan** (:func:`plan`). *What is held stays held* (stickiness): replicas move
only for the reasons below; a model with room to stay is never evicted just for being
idle (its last replica is never a surplus, only ever evicted to make room). In order:

1. *Over budget* (eviction ``room``): a member whose models take more than its budget (a
   budget lowered, a footprint measured larger) loses its coldest evictable models until
   it is within budget again; when only models within ``min_resident_s`` of their load
   are left, those too (the budget is the harder rule; ``min_replicas`` still holds).
2. *Loads*, most needed first: replicas up to ``min_replicas`` (``pinned``); then each
   demanded model's first replica, hottest first (``demand``, or ``preload`` when no
   available member held anything: a gateway starting with the demand it recorded, so
   the most used models load first, up to the budgets); then further replicas up to the
   wanted count, most demand left unserved first (``demand``). A replica goes to the
   available member with the most free room that neither holds nor drains the model,
   whose load of it did not fail within ``failed_retry_s``, and whose budget could take
   it at all. When it fits on none, the first of them (most room first) where evicting
   makes the room takes it: the coldest eligible models there are evicted (``room``), no
   more of them than needed. Passes repeat until one places nothing (a load can make
   another possible); a plan never loads a model where it evicts it: a replica it
   evicted that has room again (made, if need be, as for a load) is kept instead.
3. *Surplus* (eviction ``surplus``): a model's replicas beyond the wanted count go one
   at a time, while its demand is below :data:`HYSTERESIS` (70 %) of what the replicas
   left would carry (``(n - 1) * rps_per_replica``). A replica is added as soon as demand
   needs it and removed only well below, so demand wiggling around a boundary neither
   loads nor evicts. A held model the view does not describe is a surplus. Last, so
   that loads needing room took it from surpluses first; the room it frees goes to
   replicas still missing (the loads again).
4. *Fill* (load ``fill``, only when :func:`plan` is asked to: the control plane asks
   while no request waits for a load in the pool): models held nowhere load into the
   room nothing else wants (a model with demand is step 2's: these have none), the
   smallest first (the most models a byte holds, nothing known of their use), each on
   the member with the most free room where it fits without evicting anything and
   leaving free the room of the pool's largest model (at most the probation share): a
   miss then loads at once. A model whose load failed on a member is not filled (only
   asked for is it tried again). A model so loaded and not used since (``lent`` in its
   member's view) is the main segment's first to go, at any age (a miss takes the
   probation segment's first): room nobody asked for is lent, not given.

Who may be evicted: never a model within ``min_resident_s`` of becoming resident
(``probation_min_s`` for a probation one, :data:`WAITERS_S` for one a starving or
hurried miss takes; a ``lent`` one at any age), never a pending or frozen one, never
below its ``min_replicas``, never one being drained or loaded by the same plan. Coldest first:
replicas beyond their model's wanted count, then the lowest demand per byte, then the
longest unused, then by name. To make room for

- a pinned replica (``min_replicas`` is a guarantee): any of those;
- a demanded replica: replicas beyond their model's wanted count, and models colder
  than the one placed by a margin (demand at most :data:`HYSTERESIS` times its demand;
  at equal demand, used longer ago), so two models of about the same demand do not take
  turns; a further replica (the second, third...) never takes another model's last one:
  having every demanded model somewhere comes before more copies of one;
- a miss (:mod:`gateway.policy.residency_misses`), into the probation segment:
  probation models first (young ones only when the miss starves, or when its first
  request fails otherwise and they are little used), then models colder than the missed
  one (lower demand per byte, then used longer ago, and less demand: a small cold model
  never evicts a large hot one for the room it needs; the missed model counts as at
  least ``MISS_FLOOR_RPS``), then, while the main segment is over its share and the
  probation share left takes the missed model, the coldest main models whatever their
  heat. Not ``strict`` (the control plane asks so only for a model larger than every
  member's probation share, which nothing else could serve): any of them, coldest
  first.

**Budget**: what a member holds after a plan (held and draining, less the plan's
evictions, plus its loads) never exceeds its budget when it did not before; a model
larger than every budget is never placed. A model is placed (a load, a fill, a miss)
only where it leaves its member's ``margin_bytes`` free (or what its size leaves of
that, alone on an empty member), and models are evicted for the budget (step 1) only
past the whole of it: a held model's footprint measured again a little larger neither
takes its member over the budget nor costs an eviction. Members that are not available
get no moves, and the replicas they hold do not count. Deterministic: ties are broken
by name.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# a replica is dropped only when demand is below this share of what the rest carry, and a
# model evicts another for demand only when that one's demand is at most this share of its
HYSTERESIS = 0.7
# a model's next replica is wanted once its demand passes this share of what its replicas
# carry: it loads while they still keep up, before requests queue behind them
REPLICA_LEAD = 0.9
# the share of each member's budget that the main segment leaves to misses (probation)
PROBATION_SHARE = 0.25
# a probation model (loaded for a miss) stays at least this long: its waiters go on first
PROBATION_MIN_S = 5.0
# ... and, whatever a miss's hurry, at least this long: its waiters reach the member (the
# snapshot that routes them reaches every data-plane replica first). Taken 7 ms after its
# load for another miss, a model's waiters waited for it until their deadline; simulated
# (forwarding 0.3 s), 1 s failed the fewest requests (0.5 s and 2 s more)
WAITERS_S = 1.0
LOAD_REASONS = ("pinned", "demand", "miss", "preload", "fill", "deploy", "operator")
EVICTION_REASONS = ("room", "surplus", "operator")


@dataclass(frozen=True)
class ResidencyKnobs:
    min_resident_s: float = 30.0  # no eviction within this of a load
    rps_per_replica: float = 50.0  # smoothed demand one member carries before another
    failed_retry_s: float = 60.0  # a member a load failed on is not tried again before
    probation_share: float = PROBATION_SHARE  # of a budget kept for misses (probation)
    probation_min_s: float = PROBATION_MIN_S  # a probation model is never evicted before
    # the next replica loads once demand passes this share of what the replicas carry
    replica_lead: float = REPLICA_LEAD


@dataclass(frozen=True)
class ModelView:
    name: str
    footprint_bytes: int
    min_replicas: int  # already resolved (0 for on-demand; len(members) pinned)
    demand_rps: float  # smoothed
    last_used: float | None  # clock seconds, None: never
    frozen: bool = False  # under rollout: keeps the members it has, neither loaded nor evicted

    @property
    def value_per_byte(self) -> float:
        """Demand per byte held: what a byte of a member's budget earns holding it."""
        return self.demand_rps / max(1, self.footprint_bytes)


@dataclass(frozen=True)
class MemberView:
    key: str
    budget_bytes: int  # headroom already taken off
    available: bool  # healthy and routable
    held: Mapping[str, float]  # model -> when it became resident
    failed: Mapping[str, float] = field(default_factory=dict)  # model -> when a load failed
    draining: frozenset[str] = frozenset()  # being evicted: still counted in use
    # queued, loading or warming there: counted in use, never evicted, never loaded again
    pending: frozenset[str] = frozenset()
    # loaded for a miss and not promoted: the first a miss evicts (residency_misses)
    probation: frozenset[str] = frozenset()
    # pending model -> when it is expected resident (the measured load times): when its
    # room may be had again (miss_room_at); a pending model without one frees none
    ready_at: Mapping[str, float] = field(default_factory=dict)
    # pending model -> bytes of the draining models whose room it takes once they leave (a
    # miss placed here waits for its victims): counted once, not as both
    covered: Mapping[str, int] = field(default_factory=dict)
    # loaded by a plan's fill and not used since (room lent): evicted at any age, before
    # any other model of the main segment
    lent: frozenset[str] = frozenset()
    # what a placement leaves free of the budget (evictions for the budget start only past
    # the whole of it): room for the held models' footprints measured again larger
    margin_bytes: int = 0


@dataclass(frozen=True)
class ResidencyView:
    now: float
    models: tuple[ModelView, ...]
    members: tuple[MemberView, ...]


@dataclass(frozen=True)
class Move:
    model: str
    member: str
    reason: str  # loads: LOAD_REASONS; evictions: EVICTION_REASONS


@dataclass(frozen=True)
class Plan:
    loads: tuple[Move, ...]
    evictions: tuple[Move, ...]
    replicas: Mapping[str, int]  # wanted members per model
    # holdings that change segment (reason "promote": probation -> main, "demote": main ->
    # probation): no load, no eviction
    segments: tuple[Move, ...] = ()


def resolve_min_replicas(min_replicas: int | None, on_demand: bool, members: int,
                         under_rollout: bool) -> int:
    """A model's ``min_replicas`` as the plan reads it: the configured figure (capped at
    the pool's members), 0 for an on-demand model, every member for one configured
    neither way (pinned everywhere: the behaviour without residency); a model under
    rollout needs at least one (its versions load side by side there)."""
    if min_replicas is not None:
        wanted = min(min_replicas, members)
    elif on_demand:
        wanted = 0
    else:
        wanted = members
    return max(wanted, 1) if under_rollout else wanted


def smoothed_rate(previous_rps: float, previous_at: float, count: float, now: float,
                  half_life_s: float) -> float:
    """Requests per second, exponentially weighted: ``count`` requests arrived between
    ``previous_at`` (when the rate was ``previous_rps``) and ``now``. The old rate keeps
    ``0.5 ** (elapsed / half_life_s)`` of its weight, the rate of the interval the rest,
    so reading more often or less often gives the same rate for the same steady traffic.
    No time elapsed: the previous rate; ``half_life_s`` <= 0: the interval's rate."""
    elapsed = now - previous_at
    if elapsed <= 0:
        return previous_rps
    rate = count / elapsed
    if half_life_s <= 0:
        return rate
    keep = 0.5 ** (elapsed / half_life_s)
    return previous_rps * keep + rate * (1.0 - keep)


def wanted_replicas(model: ModelView, members: int, knobs: ResidencyKnobs,
                    now: float | None = None) -> int:
    """How many of ``members`` (the available ones) should hold ``model`` (module
    docstring); ``now`` given, a use within ``min_resident_s`` wants one too."""
    demanded = 0
    if model.demand_rps > 0:
        carried = knobs.rps_per_replica * knobs.replica_lead
        demanded = max(1, math.ceil(model.demand_rps / carried - 1e-9))
    elif (now is not None and model.last_used is not None
          and now - model.last_used <= knobs.min_resident_s):
        demanded = 1
    return max(0, min(members, max(model.min_replicas, demanded)))


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


def _eligible(board: Board, placed: ModelView, tier: str) -> Eligible:
    """Who may be evicted to make room for a replica of ``placed`` of ``tier``."""
    if tier == "pinned":
        return lambda _: True

    def colder(name: str) -> bool:
        victim = board.models.get(name)
        if board.beyond_wanted(name) or victim is None:
            return True
        if tier == "further" and board.count[name] <= 1:
            return False  # more copies of one model never cost another its last
        last = victim.last_used if victim.last_used is not None else -math.inf
        placed_last = placed.last_used if placed.last_used is not None else -math.inf
        return (victim.value_per_byte <= HYSTERESIS * placed.value_per_byte
                and (victim.value_per_byte, last) < (placed.value_per_byte, placed_last))

    return colder


def _wants(board: Board) -> Iterable[tuple[str, int, str]]:
    """(model, k, tier) for every replica wanted, most needed first: pinned replicas,
    first replicas by demand, further replicas by the demand left unserved."""
    rps = board.knobs.rps_per_replica
    order = []
    for name, wanted in board.every_wanted().items():
        model = board.models[name]
        if model.frozen:
            continue  # under rollout: it keeps the members it has
        for k in range(1, wanted + 1):
            if k <= model.min_replicas:
                order.append(((0, k, -model.demand_rps, name), name, k, "pinned"))
            elif k == 1:
                order.append(((1, 0, -model.value_per_byte, name), name, k, "first"))
            else:
                order.append(((2, 0, -(model.demand_rps - (k - 1) * rps), name), name, k,
                              "further"))
    return ((name, k, tier) for _, name, k, tier in sorted(order))


def _place_all(board: Board, wants: list[tuple[str, int, str]], starting: bool) -> None:
    """Passes over the wanted replicas until one places nothing: a load can make room for
    a replica an earlier one found none for (a model past its min_replicas, room left
    over). It ends: what a plan loads it never evicts, nor loads twice."""
    placed = True
    while placed:
        placed = False
        for name, k, tier in wants:
            if board.count[name] < k:
                reason = "pinned" if tier == "pinned" else "preload" if starting else "demand"
                eligible = _eligible(board, board.models[name], tier)
                placed = board.place(name, reason, eligible) is not None or placed


def plan(view: ResidencyView, knobs: ResidencyKnobs, fill: bool = False) -> Plan:
    """What to evict, load and promote now (module docstring); the evictions are carried
    out (their room freed) before the loads that need it. ``fill``: the room left is
    filled too (step 4)."""
    board = Board(view, knobs)
    starting = not any(m.held or m.draining or m.pending for m in board.members.values())
    wants = list(_wants(board))
    board.evict_over_budget()
    _place_all(board, wants, starting)
    # surplus after the loads: a load that needed room took it from a surplus first (as
    # "room"); what room the surplus frees, replicas still missing may take
    if board.evict_surplus():
        _place_all(board, wants, starting)
    if fill:
        _fill(board)
    return Plan(tuple(board.loads), tuple(board.evictions), board.every_wanted(),
                _segments(board))


def _fill(board: Board) -> None:
    """Models held nowhere loaded into the room nothing else wants (module docstring,
    step 4): never evicting, leaving a miss the room of the largest model."""
    sizes = sorted(m.footprint_bytes for m in board.models.values())
    kept = {key: min(max((b for b in sizes if b <= m.budget_bytes), default=0),
                     int(board.knobs.probation_share * m.budget_bytes))
            for key, m in board.members.items()}
    order = sorted((n for n, m in board.models.items() if not m.frozen),
                   key=lambda n: (board.footprint(n), n))
    for name in order:
        if board.count[name] or any(name in m.failed for m in board.members.values()):
            continue  # held, or its load failed: loaded again only when asked for
        for key in board.candidates(name):  # most free room first
            if board.missing(key, board.footprint(name)) <= -kept[key]:
                board.load(key, name, "fill")
                break


def _segments(board: Board) -> tuple[Move, ...]:
    """Probation models that earn a place in the main segment (TinyLFU's admission): one
    with demand joins it where the main segment has room for it, or where the coldest
    main models are colder than it by the margin (demand per byte at most
    :data:`HYSTERESIS` of its own): those change places with it, demoted to probation (no
    load, no eviction: the next misses evict them first)."""
    moves: list[Move] = []
    for key, member in board.members.items():
        trial = [n for n in board.holds[key] & board.probation[key] - member.pending
                 if (m := board.models.get(n)) is not None and m.demand_rps > 0]
        for name in sorted(trial, key=lambda n: (-board.models[n].value_per_byte, n)):
            value = board.models[name].value_per_byte
            main = sorted((n for n in board.holds[key] - board.probation[key] - member.pending
                           if n in board.models), key=board.coldness)
            demoted: list[str] = []
            while board.main_free(key) + sum(board.footprint(n) for n in demoted) < \
                    board.footprint(name) and main:
                coldest = main.pop(0)
                if board.models[coldest].value_per_byte > HYSTERESIS * value:
                    break
                demoted.append(coldest)
            if board.main_free(key) + sum(board.footprint(n) for n in demoted) < \
                    board.footprint(name):
                continue
            for victim in demoted:
                board.probation[key].add(victim)
                moves.append(Move(victim, key, "demote"))
            board.probation[key].discard(name)
            moves.append(Move(name, key, "promote"))
    return tuple(moves)


__all__ = ["EVICTION_REASONS", "HYSTERESIS", "LOAD_REASONS", "PROBATION_MIN_S",
           "PROBATION_SHARE", "REPLICA_LEAD", "WAITERS_S", "MemberView", "ModelView", "Move",
           "Plan",
           "ResidencyKnobs", "ResidencyView", "plan", "resolve_min_replicas", "smoothed_rate",
           "used_bytes", "wanted_replicas"]
