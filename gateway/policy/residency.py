"""Residency: which models each member of a pool holds, within a memory budget per
member (issues 29 and 34). Pure: the control plane (:mod:`gateway.residency`) builds a
:class:`ResidencyView` once per round and carries out the :class:`Plan` that
:func:`plan` returns; a request for a model that no available member holds (a miss)
asks :func:`gateway.policy.residency_misses.place_miss` where to load it right away.
This module says the policy and makes the plan; its terms (the view, the plan, the
knobs, the demand formulas) are :mod:`gateway.policy.residency_view`'s, imported here,
and the moves are worked out on :mod:`gateway.policy.residency_board`'s board.

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
  least ``MISS_FLOOR_RPS``; when its first request fails otherwise, models with less
  demand, whatever their demand per byte), then, while the main segment is over its
  share and the probation share left takes the missed model, the coldest main models
  whatever their heat. Not ``strict`` (the control plane asks so only for a model
  larger than every member's probation share, which nothing else could serve): any of
  them, coldest first.

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
from collections.abc import Iterable

from gateway.policy.residency_board import Board, Eligible, used_bytes
from gateway.policy.residency_view import (
    EVICTION_REASONS,
    HYSTERESIS,
    LOAD_REASONS,
    PROBATION_MIN_S,
    PROBATION_SHARE,
    REPLICA_LEAD,
    WAITERS_S,
    MemberView,
    ModelView,
    Move,
    Plan,
    ResidencyKnobs,
    ResidencyView,
    resolve_min_replicas,
    smoothed_rate,
    wanted_replicas,
)


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
