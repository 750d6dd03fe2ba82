"""Misses placed: where a model no member holds loads for the requests that wait for
it (:func:`gateway.policy.residency_misses.place_miss`), the room made there first (its victims
drain and unload, and only then is its load queued, so the accounted use never exceeds
the budget), and how long until it is resident (the waiting room answers by it). Told of
every holding's transition (:meth:`Misses.changed`): a load that failed is tried on one
other member, a load dropped mid-way is placed again, room freed goes to the misses
waiting for it, a queued load is dropped when the model became resident elsewhere first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config.residency import ResidencySpec
from gateway.policy import residency as policy
from gateway.policy import residency_misses as admission
from gateway.pools import Pool
from gateway.residency.actuator import Actuator
from gateway.residency.footprints import Footprints
from gateway.residency.holdings import PENDING, PROBATION, Holding, HoldingTable, Phase
from gateway.residency.metrics import ResidencyMetrics
from gateway.residency.waiting import Flight, WaitingRoom
from gateway.state import GatewayState

# a miss hurries (any probation model may go for it, however young) once the first of
# its requests gives up within its eviction, its load and this many loads more
URGENT_LOADS = 3


class Placing(Protocol):
    """What placing misses reads of the residency
    (:class:`~gateway.residency.manager.Residency`)."""

    table: HoldingTable
    actuator: Actuator
    room: WaitingRoom
    footprints: Footprints

    @property
    def state(self) -> GatewayState: ...

    def pool_of(self, model: str) -> Pool | None: ...

    def models(self, pool: Pool) -> list[str]: ...

    def spec(self, pool: Pool) -> ResidencySpec: ...

    def knobs(self, pool: Pool) -> policy.ResidencyKnobs: ...

    def view(self, pool: Pool, now: float | None = None) -> policy.ResidencyView: ...

    def used_bytes(self, pool: Pool, member_key: str) -> int: ...

    def usable_bytes(self, pool: Pool) -> int: ...

    def slots(self, key: str) -> int: ...

    async def reconcile(self, pool: Pool) -> None: ...

    def unreserve(self, model: str) -> None: ...

    def no_room(self, pool: Pool, model: str) -> str: ...


@dataclass
class Misses:
    """The waiting room's placer (:class:`~gateway.residency.waiting.Placer`)."""

    residency: Placing
    metrics: ResidencyMetrics

    def pool_of(self, model: str) -> Pool | None:
        return self.residency.pool_of(model)

    def never_fits(self, pool: Pool, model: str) -> bool:
        return self.residency.footprints.bytes(model, pool) > \
            self.residency.usable_bytes(pool)

    def no_room(self, pool: Pool, model: str) -> str:
        return self.residency.no_room(pool, model)

    def resident(self, model: str) -> bool:
        return self.residency.state.resident(model)

    def known(self, pool: Pool, model: str) -> bool:
        return model in self.residency.models(pool)

    async def refresh(self, pool: Pool) -> None:
        await self.residency.reconcile(pool)

    def place(self, flight: Flight) -> None:
        """Give a miss its member: the victims there evicted first, then its load queued
        (in the probation segment); unplaced when no member has room now."""
        pool, model = flight.pool, flight.model
        self.residency.unreserve(model)  # requests wait for it: the miss decides now
        view, knobs = self.residency.view(pool), self.residency.knobs(pool)
        placed = admission.place_miss(view, model, knobs)
        if placed is None:
            placed = self._starving(flight, view, knobs)
        if placed is None:
            flight.member = None
            return
        member, evictions = placed
        flight.member = member
        existing = self.residency.table.get(member, model)
        if existing is not None and existing.phase in PENDING:
            flight.holding = existing
            self.residency.actuator.pump(member)  # requests wait for it now: it goes first
            return
        if existing is not None and existing.phase is Phase.RESIDENT:
            flight.resolve()
            return
        flight.victims = {e.model for e in evictions}
        for move in evictions:
            victim = self.residency.table.get(move.member, move.model)
            if victim is not None:
                going = self.residency.actuator.start_eviction(victim, "room")
                going.add_done_callback(functools.partial(self._evicted_for, flight, victim))
        if not flight.victims:
            self._queue_miss(flight)

    def _starving(self, flight: Flight, view: policy.ResidencyView,
                  knobs: policy.ResidencyKnobs) -> tuple[str, tuple[policy.Move, ...]] | None:
        """Where a miss no member has room for now goes, if anywhere yet. While waiting
        makes room (probation models aging, pending loads resident), it waits. Once the
        room it waited for went to others, or waiting never makes room, probation models
        within ``probation_min_s`` go too where they are colder than it (their waiters
        were served; an eviction drains first); where its first request would otherwise
        give up (:meth:`urgent`), little used probation models however young, and main
        models asked for less than it whatever their demand per byte (``hurry``). Other
        main models hotter than it go only for a model larger than every member's
        probation share (nothing else could ever serve it): evicting the hot for the
        cold whenever the room was taken churned (docs/residency.md, "Admission")."""
        room_at = admission.miss_room_at(view, flight.model, knobs)
        starving = room_at is None or view.now >= (flight.room_at or room_at)
        if flight.room_at is None:
            flight.room_at = room_at
        urgent = self.urgent(flight, view.now)
        if not (starving or urgent):
            return None
        placed = admission.place_miss(view, flight.model, knobs, young_probation=True)
        if placed is None and urgent:
            placed = admission.place_miss(view, flight.model, knobs, hurry=True)
        if placed is None and starving and not admission.fits_probation(view, flight.model, knobs):
            placed = admission.place_miss(view, flight.model, knobs, strict=False)
        return placed

    def urgent(self, flight: Flight, now: float | None = None) -> bool:
        """Whether the first request waiting for ``flight`` fails unless its room is made
        now: it gives up within an eviction, its own load and :data:`URGENT_LOADS` more
        (as measured)."""
        now = self.residency.state.clock() if now is None else now
        if not flight.give_ups:
            return False
        actuator = self.residency.actuator
        needs = (actuator.typical_eviction_s() + actuator.expected_load_s(flight.model)
                 + URGENT_LOADS * actuator.typical_load_s())
        return min(flight.give_ups) - now <= needs

    def _evicted_for(self, flight: Flight, victim: Holding, done: asyncio.Future[bool]) -> None:
        """A victim that stayed (Triton refused its unload): the miss is placed again."""
        if not done.cancelled() and not done.result() and flight.member == victim.member \
                and victim.model in flight.victims and not flight.done.done():
            flight.member, flight.victims = None, set()
            self.place(flight)

    def _queue_miss(self, flight: Flight) -> None:
        """The room is free: the miss's load queued, if it still fits (another decision
        may have taken the room since it was made)."""
        pool, member = flight.pool, flight.member
        assert member is not None
        size = self.residency.footprints.bytes(flight.model, pool)
        if self.residency.used_bytes(pool, member) + size > self.residency.usable_bytes(pool) \
                or not self.residency.table.may_queue(member, flight.model):
            flight.member = None  # placed again as room frees (never from here: no loop)
            return
        flight.holding = self.residency.table.queue(member, flight.model, "miss", PROBATION)
        self.residency.actuator.enqueue(flight.holding)

    def _current(self, holding: Holding | None) -> Holding | None:
        """The table's record of ``holding`` now, if it is still that one (same token)."""
        if holding is None:
            return None
        current = self.residency.table.get(holding.member, holding.model)
        return current if current is not None and current.token == holding.token else None

    def under_way(self, flight: Flight) -> bool:
        current = self._current(flight.holding)
        return current is not None and current.phase in (Phase.LOADING, Phase.WARMING)

    def stage(self, flight: Flight) -> tuple[str, str]:
        """Where the flight's load stands, as its waiters are told when they give up: its
        member ('' without one) and what it waits for there (no member has room yet, the
        room being made and whom it evicts, the member's other loads ahead of it) or what
        it does (loading, warming up)."""
        if flight.member is None:
            return "", "no member has room yet"
        where = f"on member {flight.member}"
        current = self._current(flight.holding)
        if current is None:
            victims = ", ".join(sorted(flight.victims))
            return where, f"making room there{': evicting ' + victims if victims else ''}"
        if current.phase is Phase.QUEUED:
            ahead = self.residency.actuator.queued_ahead(current)
            return where, f"queued behind {ahead} load{'' if ahead == 1 else 's'} there"
        return where, current.phase.value

    def expected_in(self, flight: Flight) -> float | None:
        """Seconds until the flight's model is resident (the waiting room answers by it);
        None: not by waiting."""
        own = self.residency.actuator.expected_load_s(flight.model)
        current = self._current(flight.holding)
        if current is not None:
            return self.residency.actuator.expected_in(current)
        if flight.member is not None:  # room being made there
            actuator, member = self.residency.actuator, flight.member
            queued = sum(1 for h in self.residency.table.of_member(member).values()
                         if h.phase is Phase.QUEUED)
            waves = (actuator.running(member) + queued) // self.residency.slots(member)
            return actuator.typical_eviction_s() + waves * actuator.typical_load_s() + own
        view = self.residency.view(flight.pool)
        knobs = self.residency.knobs(flight.pool)
        drain_s = self.residency.actuator.typical_eviction_s()
        at = admission.miss_room_at(view, flight.model, knobs, drain_s=drain_s)
        if at is None:  # starving, the probation models go whatever their age
            at = admission.miss_room_at(view, flight.model, knobs, young_probation=True,
                                     drain_s=drain_s)
        return None if at is None else at - view.now + drain_s + own

    def changed(self, before: Holding | None, after: Holding | None) -> None:
        """Every transition of a holding (the table tells): the waiting room and the
        misses waiting for room follow."""
        holding = after or before
        assert holding is not None
        if (before is None or before.phase is not Phase.RESIDENT) and after is not None \
                and after.phase is Phase.RESIDENT:
            self.metrics.resident(holding.model, {holding.member: True})
            flight = self.residency.room.resident(holding.model)
            queued = flight.holding if flight is not None else None
            if queued is not None and queued.member != holding.member:
                self._later(self._cancel_queued, queued)  # served elsewhere first
        elif before is not None and before.phase is Phase.RESIDENT and (
                after is None or after.phase is not Phase.RESIDENT):
            self.metrics.resident(holding.model, {holding.member: False})
        if after is not None and after.phase is Phase.FAILED:
            self._later(self._load_failed, holding.model, holding.member, after.reason)
        elif after is None and before is not None:
            self._later(self._gone, before)

    def _later(self, job: Any, *args: Any) -> None:
        """After the transition that called for it (the table is not written from
        inside its own write)."""
        with contextlib.suppress(RuntimeError):  # no running loop: nothing waits
            asyncio.get_running_loop().call_soon(job, *args)

    def _cancel_queued(self, holding: Holding) -> None:
        current = self._current(holding)
        if current is not None and current.phase is Phase.QUEUED:
            self.residency.table.advance(current, None)

    def _load_failed(self, model: str, member: str, reason: str) -> None:
        flight = self.residency.room.failed(model, member, reason)
        if flight is not None:
            self.place(flight)

    def _gone(self, before: Holding) -> None:
        for flight in list(self.residency.room.flights.values()):
            if flight.done.done():
                continue
            if before.phase in PENDING and flight.model == before.model and \
                    flight.member == before.member:  # its load dropped (member restarted)
                flight.member, flight.holding = None, None
                self.place(flight)
            elif flight.member == before.member and before.model in flight.victims:
                flight.victims.discard(before.model)
                if not flight.victims:
                    self._queue_miss(flight)
        for flight in self.residency.room.unplaced():  # room freed: a miss waiting for it
            self.place(flight)

