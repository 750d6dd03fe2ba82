"""Misses placed (issue 34): where a request's model that no available member holds
loads right away, and what it evicts there (:func:`place_miss`); when waiting would
make room (:func:`miss_room_at`). Pure, over the same :class:`ResidencyView` and
:class:`~gateway.policy.residency_board.Board` as :func:`gateway.policy.residency.plan`,
whose module docstring gives the segments, the protections and who may be evicted for a
miss.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gateway.policy.residency_board import Board, Eligible
from gateway.policy.residency_view import WAITERS_S, Move, ResidencyKnobs, ResidencyView

# a missed model counts as at least this hot (a request waits for it: one a minute)
MISS_FLOOR_RPS = 1 / 60
# a miss whose first request fails unless its room is made now may evict a young
# probation model with less demand than this (about a request a second: the few that
# then miss cost less than the request that would fail), or colder than itself
HURRY_RPS = 1.0


def place_miss(view: ResidencyView, model: str, knobs: ResidencyKnobs, strict: bool = True,
               young_probation: bool = False, hurry: bool = False
               ) -> tuple[str, tuple[Move, ...]] | None:
    """Where a missed model loads now (into the member's probation segment): the member
    with the most free room that can take it (as :func:`plan` chooses), with the
    evictions (``room``) that make the room there. A member already holding it
    (resident, or queued, loading or warming): that one, nothing evicted. Victims, no
    more than needed, in this order:

    1. probation holdings (other misses' models not promoted), coldest first: those
       within ``probation_min_s`` of becoming resident never, unless ``young_probation``
       (the miss waited for room that went to others, or waiting never makes any) and
       they are colder than the missed one, or ``hurry`` (its first request gives up
       unless its room is made now) and their demand is below :data:`HURRY_RPS` or the
       missed model's (the least demanded first: a model that just became the hottest
       stays);
    2. main models colder than the missed one (demand per byte, then used longer ago,
       and less demand; the missed model counts as at least :data:`MISS_FLOOR_RPS`):
       TinyLFU's admission, a cold miss never evicts a hotter main model; in a
       ``hurry``, main models with less demand than the missed one, whatever their
       demand per byte (a request that fails counts for more than the misses of a model
       asked for less, which are served after its load: a large model whose smaller
       neighbours each earned more per byte otherwise waited into its requests'
       deadlines);
    3. where the main segment holds more than its share (the budget less
       ``probation_share``: the plan places over the whole budget) and the probation
       segment's share left (its draining and pending models counted) takes this model,
       the coldest main models whatever their heat.

    None: no member can take it now (its candidates' room is held by models within
    ``min_resident_s`` of becoming resident, pending loads or ``min_replicas``, its last
    load failed on every one that could, or it fits no budget)."""
    board = Board(view, knobs, young_probation or hurry)
    if model not in board.models:
        return None
    holding = [k for k, names in board.holds.items() if model in names]
    if holding:
        return min(holding, key=lambda k: (model in board.members[k].pending, k)), ()
    missed = board.models[model]
    size = missed.footprint_bytes
    heat = (max(missed.value_per_byte, MISS_FLOOR_RPS / max(1, size)),
            missed.last_used if missed.last_used is not None else -math.inf)

    demand = max(missed.demand_rps, MISS_FLOOR_RPS)

    def colder(name: str) -> bool:
        victim = board.models.get(name)
        if victim is None or board.beyond_wanted(name):
            return True
        if hurry:  # a request fails unless the room is made: requests count, not bytes
            return victim.demand_rps < demand
        last = victim.last_used if victim.last_used is not None else -math.inf
        return (victim.value_per_byte, last) < heat and victim.demand_rps < demand

    for key in board.candidates(model):
        victims = _miss_room(board, key, size, colder, strict, hurry)
        if victims is not None:
            return key, tuple(Move(v, key, "room") for v in victims)
    return None


def _miss_room(board: Board, key: str, size: int, colder: Eligible, strict: bool,
               hurry: bool = False) -> list[str] | None:
    """The victims that make room for a miss of ``size`` bytes on member ``key``
    (:func:`place_miss`'s order), None: they cannot. Not ``strict``: main models may go
    whatever their heat, the coldest first. ``hurry``: young probation models may go
    too, the least demanded first."""
    member = board.members[key]
    probation = board.holds[key] & board.probation[key]
    # the main segment over its share (the plan places over the whole budget): its excess
    # may go whatever its heat where this model fits the probation share left (draining
    # and pending probation models counted: their room is not free; counting only the
    # resident ones let a miss evict the hot while the window was still draining)
    window = board.knobs.probation_share * member.budget_bytes - sum(
        board.footprint(n) for n in board.probation[key] & (
            board.holds[key] | member.draining | member.pending))
    any_main = not strict or (window >= size and board.main_free(key) < 0)

    def eligible(name: str) -> bool:
        if name in probation and board.now - member.held[name] < board.knobs.probation_min_s:
            # a young probation model only for a hotter miss, or a little used one for a
            # request that fails otherwise
            model = board.models.get(name)
            return colder(name) or (hurry and (model is None or model.demand_rps < HURRY_RPS))
        return name in probation or colder(name) or any_main

    def order(name: str) -> tuple[object, ...]:
        if hurry and name in probation:  # what the fewest requests miss for, first
            model = board.models.get(name)
            return (False, 0, model.demand_rps if model else 0.0, -math.inf, name)
        return (name not in probation, *board.coldness(name))

    return board.room(key, board.missing(key, size), eligible, order)


def miss_room_at(view: ResidencyView, model: str, knobs: ResidencyKnobs, strict: bool = True,
                 young_probation: bool = False, drain_s: float | None = None
                 ) -> float | None:
    """When :func:`place_miss` would first place ``model`` if nothing else changed (its
    victims old enough by then, pending loads resident when expected (``ready_at``), and,
    ``drain_s`` given, the evictions under way ended that long from now): ``view.now``
    when it does now; None: not by waiting (pending loads of unknown end,
    ``min_replicas``, failures or size stand in the way). ``young_probation``: as
    :func:`place_miss` would place it so."""
    ages = (knobs.probation_min_s, WAITERS_S) if young_probation else (knobs.probation_min_s,)
    since = [(m, name, t) for m in view.members for name, t in m.held.items()] + [
        (m, name, t) for m in view.members for name, t in m.ready_at.items()
        if name in m.pending]
    times = {t + age for m, name, t in since
             for age in (ages if name in m.probation else (knobs.min_resident_s,))}
    if drain_s is not None and any(m.draining for m in view.members):
        times.add(view.now + drain_s)
    for at in (view.now, *sorted(t for t in times if t > view.now)):
        if place_miss(_at(view, at, drain_s), model, knobs, strict, young_probation) is not None:
            return at
    return None


def fits_probation(view: ResidencyView, model: str, knobs: ResidencyKnobs) -> bool:
    """Whether ``model`` fits the probation share of an available member's budget (where
    misses load): one that fits none is served only by evicting main models, whatever
    their heat (``place_miss(strict=False)``)."""
    size = next((m.footprint_bytes for m in view.models if m.name == model), None)
    return size is not None and any(
        size <= knobs.probation_share * m.budget_bytes for m in view.members if m.available)


def _at(view: ResidencyView, at: float, drain_s: float | None = None) -> ResidencyView:
    """The view at ``at``: its pending loads expected resident by then resident, and
    (``drain_s`` given) the models draining gone once it passed."""
    gone = drain_s is not None and at >= view.now + drain_s
    members = []
    for m in view.members:
        ready = {n: t for n, t in m.ready_at.items() if n in m.pending and t <= at}
        if ready:
            m = replace(m, held={**m.held, **ready}, pending=m.pending - ready.keys())
        if gone and m.draining:
            m = replace(m, held={n: t for n, t in m.held.items() if n not in m.draining},
                        draining=frozenset(), covered={})
        members.append(m)
    return replace(view, now=at, members=tuple(members))


__all__ = ["HURRY_RPS", "MISS_FLOOR_RPS", "fits_probation", "miss_room_at", "place_miss"]
