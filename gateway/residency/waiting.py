"""The waiting room: requests for a model no member holds (misses) wait here while it
loads, one load per model however many wait (single flight).

A request is answered at once, never held past the moment it is known it cannot be
served:
- a model the pool does not know: 404, and a name found unknown is not looked up again
  for :data:`UNKNOWN_TTL_S` (one repository look-up at a time per pool, however many
  requests name it);
- the room full (``max_requests`` waiting in the pool, by default
  :data:`~gateway.config.residency.REQUESTS_PER_MEMBER` per member): 503 + ``Retry-After``;
- the load expected to end after what the request may wait (its deadline's first
  :data:`~gateway.policy.deadline.SHARE_NUM`/:data:`~gateway.policy.deadline.SHARE_DEN`,
  so a gRPC client reads this answer before its own deadline fires; at most
  ``max_wait_s``), from the measured load times and the loads queued ahead of it: 503 +
  ``Retry-After`` saying when.
Otherwise it waits for the flight: resident (served), failed on two members (503 with
both reasons), or its own limit (503 saying how long the load has taken). At that limit
a request whose model's load is under way and expected to end within
:data:`~gateway.policy.deadline.LAST_NUM`/:data:`~gateway.policy.deadline.LAST_DEN` of its
deadline waits on until then (the simulator's held failures were mostly such: their load
started late and ended within a second of their refusal).

A :class:`Flight` is one model's miss: the member it loads on (``holding``), or the
room being made for it (``victims`` draining there), or none yet (no member has room
now: :class:`Placer` places it again as room frees). Room goes to the misses waiting
for it in order (:meth:`WaitingRoom.unplaced`), a new miss after them: the urgent first
(their first request fails unless their room is made now), then those most requests
wait for; while an urgent one waits, a new miss does not take the room it needs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config.residency import ResidencySpec
from gateway.errors import ModelNotFound, ModelNotReady, Unavailable
from gateway.policy.deadline import SHARE_DEN, SHARE_NUM, last_share_s
from gateway.pools import Pool
from gateway.residency.holdings import Holding

UNKNOWN_TTL_S = 2.0  # an unknown name is not looked up again this long


@dataclass
class Flight:
    """The requests of one model waiting for its load, and that load's progress."""

    model: str
    pool: Pool
    done: asyncio.Future[None]
    started: float
    waiters: int = 0
    member: str | None = None  # where it loads (None: no member has room yet)
    victims: set[str] = field(default_factory=set)  # models evicted there to make room
    holding: Holding | None = None  # its load, once queued
    failures: list[str] = field(default_factory=list)  # "member: reason" of failed loads
    room_at: float | None = None  # when the room it waits for was expected
    # when each request waiting for it gives up (its limit): the placer hurries for the
    # first of them
    give_ups: list[float] = field(default_factory=list)

    def resolve(self, error: Exception | None = None) -> None:
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)


class Placer(Protocol):
    """What the waiting room asks of the residency."""

    def pool_of(self, model: str) -> Pool | None: ...

    def resident(self, model: str) -> bool: ...

    def known(self, pool: Pool, model: str) -> bool:
        """Whether ``pool`` may hold ``model`` (as last looked up)."""

    async def refresh(self, pool: Pool) -> None:
        """Look the pool's members' repositories up again."""

    def place(self, flight: Flight) -> None:
        """Give ``flight`` a member (evicting for room, then queueing its load), or leave
        it unplaced when no member has room now."""

    def expected_in(self, flight: Flight) -> float | None:
        """Seconds until the flight's model is resident; None: not by waiting."""

    def urgent(self, flight: Flight) -> bool:
        """Whether the first request waiting for ``flight`` fails unless its room is
        made now."""

    def under_way(self, flight: Flight) -> bool:
        """Whether the flight's load has begun (loading, or warming up)."""

    def stage(self, flight: Flight) -> tuple[str, str]:
        """Where the flight's load stands, in words: its member ('' without one), and what
        it waits for or does there."""

    def never_fits(self, pool: Pool, model: str) -> bool:
        """Whether ``model`` is larger than any member of ``pool`` may hold."""

    def no_room(self, pool: Pool, model: str) -> str:
        """Why no member can take ``model`` now (or ever)."""


@dataclass
class WaitingRoom:
    placer: Placer
    spec: Callable[[Pool], ResidencySpec]
    clock: Callable[[], float]
    on_count: Callable[[str, int], None] = lambda model, count: None  # the gauge
    flights: dict[str, Flight] = field(default_factory=dict)
    _unknown: dict[str, float] = field(default_factory=dict)  # model -> until
    _lookups: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # pool -> look-up

    async def wait(self, model: str, deadline_s: float | None) -> None:
        """Hold a request for ``model`` until a member holds it (see the module)."""
        pool = self.placer.pool_of(model)
        if pool is None or self.placer.resident(model):
            return
        if not await self._known(pool, model):
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        room = self.spec(pool).waiting_room
        size = room.limit(len(pool.members))
        if self.waiting(pool) >= size:
            raise ModelNotReady(
                f"model '{model}' is being loaded, and the waiting room of pool "
                f"'{pool.name}' is full ({size} requests wait for models "
                "being loaded): retry shortly", retry_after_s=self._retry_after(None),
                reason="loading")
        if self.placer.never_fits(pool, model):  # no retry helps: said without Retry-After
            raise Unavailable(self.placer.no_room(pool, model), retry_after_s=None)
        limit = room.max_wait_s if deadline_s is None else min(
            room.max_wait_s, deadline_s * SHARE_NUM / SHARE_DEN)
        last = limit if deadline_s is None else min(
            room.max_wait_s, last_share_s(deadline_s))
        give_up = self.clock() + limit
        flight = self._flight(pool, model, give_up)  # (placed knowing when it gives up)
        expected = self.placer.expected_in(flight)
        if expected is None or expected > limit:
            flight.give_ups.remove(give_up)
            self._forget(flight)  # (a load under way goes on: the retry will likely hit)
            raise self._too_long(flight, expected, limit, at_once=True)
        flight.waiters += 1
        self.on_count(model, flight.waiters)
        try:
            await asyncio.wait_for(asyncio.shield(flight.done), max(0.0, limit))
        except TimeoutError:
            expected, more = self.placer.expected_in(flight), last - limit
            if not (self.placer.under_way(flight) and expected is not None
                    and expected <= more):
                raise self._too_long(flight, expected, limit, at_once=False) from None
            try:  # its load ends within the deadline's last share: worth the wait
                await asyncio.wait_for(asyncio.shield(flight.done), max(0.0, more))
            except TimeoutError:
                raise self._too_long(flight, self.placer.expected_in(flight), last,
                                     at_once=False) from None
        finally:
            flight.give_ups.remove(give_up)
            flight.waiters -= 1
            self.on_count(model, flight.waiters)
            self._forget(flight)

    def waiting(self, pool: Pool) -> int:
        return sum(f.waiters for f in self.flights.values() if f.pool is pool)

    def waiters(self, model: str) -> int:
        flight = self.flights.get(model)
        return flight.waiters if flight is not None else 0

    def promised(self, member: str) -> list[Flight]:
        """Models whose misses were placed on ``member`` and wait for their victims there
        to leave: the room those free is theirs (counted as pending, as a plan's load
        waiting for room is, the victims' bytes once), not the next decision's. Seen
        before: a 131 MB model's victims drained, the first one's room went to another
        miss meanwhile, and its load no longer fitted (placed again 8 s later)."""
        return [f for f in self.flights.values()
                if f.member == member and f.holding is None and not f.done.done()]

    def unplaced(self) -> list[Flight]:
        """Flights no member had room for yet (placed again as room frees), in the order
        room goes to them: those whose first request fails unless their room is made now
        (:meth:`Placer.urgent`), then those most requests wait for, then the oldest."""
        return sorted((f for f in self.flights.values()
                       if f.member is None and not f.done.done()),
                      key=lambda f: (not self.placer.urgent(f), -f.waiters, f.started))

    # -- outcomes (the residency calls these as holdings change) --------------------------
    def resident(self, model: str) -> Flight | None:
        """The model is resident: its flight's requests go on (the flight, if any)."""
        flight = self.flights.get(model)
        if flight is not None:
            flight.resolve()
            self._forget(flight)
        return flight

    def failed(self, model: str, member: str, reason: str) -> Flight | None:
        """The flight's load failed on ``member``: the flight, to be placed on another
        member (once), or None when it is over (its requests get both reasons)."""
        flight = self.flights.get(model)
        if flight is None or flight.member != member:
            return None
        flight.failures.append(f"{member}: {reason}")
        flight.member, flight.holding, flight.victims = None, None, set()
        if len(flight.failures) >= 2:  # two members tried: the error is the model's
            flight.resolve(Unavailable(
                f"model '{model}' could not be loaded: {'; '.join(flight.failures)}",
                retry_after_s=None))
            self._forget(flight)
            return None
        return flight

    # -- inside ---------------------------------------------------------------------------
    def _flight(self, pool: Pool, model: str, give_up: float | None = None) -> Flight:
        """The model's flight, a new one placed after those already waiting (see
        :meth:`_queue_behind`)."""
        flight, behind = self.flights.get(model), False
        if flight is None or flight.done.done():
            behind = self._queue_behind(pool)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.add_done_callback(_consume)
            flight = self.flights[model] = Flight(model, pool, done, self.clock())
        if give_up is not None:
            flight.give_ups.append(give_up)
        if flight.member is None and not behind:
            self.placer.place(flight)
        return flight

    def _queue_behind(self, pool: Pool) -> bool:
        """Before a new miss of ``pool`` is placed, the flights already waiting there for
        room are placed again, in :meth:`unplaced`'s order: room that freed since the
        last round (probation models aging) is theirs first. True: one of them is still
        unplaced and urgent, and the new miss waits its turn (placed as room frees), not
        taking room that one needs. A newcomer placed ahead of the misses waiting,
        whenever it arrived as room freed, left the colder of them waiting into their
        deadline: simulated at a quarter, held failures 283 -> 170 over 16 seeds
        (docs/residency.md, "The order room goes in")."""
        waiting = [f for f in self.unplaced() if f.pool is pool]
        for other in waiting:  # (placing one leaves the others as they were)
            self.placer.place(other)
        return any(f.member is None and not f.done.done() and self.placer.urgent(f)
                   for f in waiting)

    def _forget(self, flight: Flight) -> None:
        if flight.waiters <= 0 and self.flights.get(flight.model) is flight and (
                flight.done.done() or flight.member is None):
            del self.flights[flight.model]

    def _too_long(self, flight: Flight, expected: float | None, limit: float,
                  at_once: bool) -> ModelNotReady:
        if expected is None:
            return ModelNotReady(self.placer.no_room(flight.pool, flight.model),
                                 retry_after_s=self._retry_after(None), reason="loading")
        member, stage = self.placer.stage(flight)
        loaded = f"model '{flight.model}' is being loaded{' ' + member if member else ''}"
        if at_once:
            return ModelNotReady(
                f"{loaded} ({stage}), expected in {expected:.1f} s, longer than this "
                f"request may wait ({limit:.1f} s): retry after it",
                retry_after_s=self._retry_after(expected), reason="loading")
        waited = self.clock() - flight.started
        return ModelNotReady(
            f"{loaded} ({stage}, {waited:.1f} s so far), longer than this request may "
            f"wait ({limit:.1f} s): retry",
            retry_after_s=self._retry_after(expected), reason="loading")

    @staticmethod
    def _retry_after(expected: float | None) -> float:
        return max(1.0, math.ceil(expected if expected is not None else 1.0))

    async def _known(self, pool: Pool, model: str) -> bool:
        """Whether the pool may hold ``model``: the members' repositories looked up again
        for a name not known yet, one look-up per pool at a time however many requests
        ask, and a name still unknown is remembered for :data:`UNKNOWN_TTL_S`."""
        if self.placer.known(pool, model):
            return True
        if self._unknown.get(model, float("-inf")) > self.clock():
            return False
        lookup = self._lookups.get(pool.name)
        if lookup is None or lookup.done():
            lookup = asyncio.ensure_future(self.placer.refresh(pool))
            self._lookups[pool.name] = lookup
        await asyncio.shield(lookup)
        if self.placer.known(pool, model):
            return True
        self._unknown[model] = self.clock() + UNKNOWN_TTL_S
        return False


def _consume(future: asyncio.Future[None]) -> None:
    """A flight's outcome nobody waits for any more is not an unretrieved exception."""
    if not future.cancelled():
        future.exception()
